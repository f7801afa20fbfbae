"""Tokenizers: loading by hub name, path or object, and a small default built in code.

The default tokenizer lets ``gym.make("AgentR1/FactChain-v0")`` work offline with no download.
It is a byte-level BPE (so every string encodes, and decoding is lossless) trained in code on a
fixed corpus of generic English (common words, letter pairs, numbers, punctuation and the
tool-call protocol's JSON syntax; no env's words since 2026-11-25, so it favours no env), with
ChatML special tokens and the tool-call tags as single tokens. Training is deterministic, so two
processes build the same vocabulary; the result is cached per process.

Also what the project asks of any tokenizer: :func:`pad_token_id` (the id to pad rows with) and
:func:`tokenizer_fingerprint` (whether two tokenizers encode alike, as an env server and its client
must).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from typing import Any

CHATML_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}"
    "{{ '\\n\\n# Tools\\n\\nYou may call one or more functions. Function signatures:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    '{{ \'\\n</tools>\\n\\nReturn each call as <tool_call>{"name": <name>, "arguments": <args>}</tool_call><|im_end|>\\n\' }}'
    "{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>{{ '\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ message['content'] }}{{ '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}{{ '\\n' }}{{ message['content'] }}<|im_end|>{{ '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)
"""ChatML with tools in the Qwen2.5 layout: consecutive tool results share one user turn."""

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TAG_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<think>",
    "</think>",
]
"""Tags that are single (non-special) tokens in the default tokenizer, as in Qwen2.5."""

_COMMON_WORDS = (
    # Common English words (function words first, then frequent nouns, verbs and adjectives): a
    # generic sample of text, chosen for no env. Env-specific words (a tool's name, an argument
    # key, FactChain's relations) are not here: the default tokenizer serves every env alike.
    "the of and to a in is it you that he was for on are with as his they be at one have this from "
    "or had by not but what some we can out other were all there when up use your how said an each she "
    "which do their time if will way about many then them write would like so these her long make thing "
    "see him two has look more day could go come did number sound no most people my over know water than "
    "call first who may down side been now find any new work part take get place made live where after "
    "back little only round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right boy old too same "
    "tell does set three want air well also play small end put home read hand port large spell add even "
    "land here must big high such follow act why ask men change went light kind off need house picture try "
    "us again animal point mother world near build self earth father head stand own page should country "
    "found answer school grow study still learn plant cover food sun four between state keep eye never last "
    "let thought city tree cross farm hard start might story saw far sea draw left late run while press "
    "close night real life few north open seem together next white children begin got walk example ease "
    "paper group always music those both mark often letter until mile river car feet care second book carry "
    "took science eat room friend began idea fish mountain stop once base hear horse cut sure watch color "
    "face wood main enough plain girl usual young ready above ever red list though feel talk bird soon body "
    "dog family direct pose leave song measure door product black short numeral class wind question happen "
    "complete ship area half rock order fire south problem piece told knew pass since top whole king space "
    "heard best hour better true during hundred five remember step early hold west ground interest reach "
    "fast verb sing listen six table travel less morning ten simple several vowel toward war lay against "
    "pattern slow center love person money serve appear road map rain rule govern pull cold notice voice "
    "unit power town fine certain fly fall lead cry dark machine note wait plan figure star box noun field "
    "rest correct able pound done beauty drive stood contain front teach week final gave green oh quick "
    "develop ocean warm free minute strong special mind behind clear tail produce fact street inch multiply "
    "nothing course stay wheel full force blue object decide surface deep moon island foot system busy test "
    "record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate "
    "miss brought heat snow tire bring yes distant fill east paint language among"
).split()

_COMMON_BIGRAMS = (
    # The most frequent letter pairs of English text: pieces for words and names not in the list.
    "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le ve co me "
    "de hi ri ro ic ne ea ra ce li ch ll be ma si om ur"
).split()


def _training_corpus() -> list[str]:
    """Generic text, the same for every env: common words in shifting orders (after a space, at a
    line start, capitalised, inside quotes as in a JSON value), pseudo-words from common letter
    pairs, numbers, the chat/tool-call protocol's own syntax, and every ASCII punctuation mark."""
    words, pairs = _COMMON_WORDS, _COMMON_BIGRAMS
    n = len(words)
    lines: list[str] = []
    for i in range(n):
        lines.append(" ".join(words[(i + k * 7) % n] for k in range(12)))
        lines.append(
            words[(i * 5) % n].capitalize() + " " + " ".join(words[(i + k * 11) % n] for k in range(1, 8)) + "."
        )
        a, b, c = words[i], words[(i * 3 + 1) % n], words[(i * 13 + 2) % n]
        lines.append(f'{{"name": "{a}", "arguments": {{"{b}": "{c}"}}}}')
    for i, a in enumerate(pairs):
        for j, b in enumerate(pairs):
            lines.append(f"{(a + b).capitalize()} {pairs[(i + j) % len(pairs)]}{a}{b} {words[(i * j) % n]}")
    for d in range(200):
        lines.append(f"{d} {d * 7 % 1000} {1900 + d} ({d}) [{d}]")
    lines.append("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ \n\t")
    return lines * 3


def build_bpe_tokenizer(
    special_tokens: list[str] | None = None,
    extra_tokens: list[str] | None = None,
    chat_template: str | None = CHATML_TEMPLATE,
    vocab_size: int = 2048,
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
    bos_token: str | None = None,
):
    """Train a byte-level BPE in code and wrap it as a ``PreTrainedTokenizerFast``.

    Used for the default tokenizer and, in tests, for tokenizers of other chat-template families
    (Llama 3, Mistral), which differ in their special tokens and template only.
    """
    from tokenizers import (  # deferred: tokenizers stays out of `import agent_gym`
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast  # deferred: transformers (seconds) stays out of `import agent_gym`

    special_tokens = list(special_tokens if special_tokens is not None else CHATML_SPECIALS)
    extra_tokens = list(extra_tokens if extra_tokens is not None else TAG_TOKENS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra_tokens])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos_token,
        pad_token=pad_token,
        bos_token=bos_token,
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


IMPORT_LOCK = threading.RLock()
"""Held around every first use of transformers from agent_gym: its lazy module is not thread-safe
(a first ``from transformers import PreTrainedTokenizerFast`` in 4 threads at once failed with
ImportError in 1 to 3 of them here), and envs are built in worker threads by the OpenAI-compatible
evaluation, the vector env and the env server."""


@functools.lru_cache(maxsize=1)
def _default_tokenizer():
    return build_bpe_tokenizer()


def default_tokenizer():
    """The built-in ChatML tokenizer (about 2k tokens). Built once per process, in ~0.2 s, also
    when several threads ask for it first at once."""
    with IMPORT_LOCK:
        return _default_tokenizer()


def load_tokenizer(spec: Any = None):
    """Resolve ``spec`` to a tokenizer.

    - ``None``: the built-in default tokenizer (no download).
    - a string: a local directory, or a hub name (``Qwen/Qwen2.5-3B-Instruct``), through
      ``AutoTokenizer.from_pretrained``.
    - anything with ``encode``/``decode``/``apply_chat_template``: used as is.
    """
    if spec is None:
        return default_tokenizer()
    if isinstance(spec, (str, os.PathLike)):
        with IMPORT_LOCK:  # import-time cost (seconds), and a first import is not thread-safe
            from transformers import AutoTokenizer  # deferred: transformers (seconds) stays out of `import agent_gym`

        spec = str(spec)
        looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec.strip("/").split("/", 1)[-1]
        if looks_like_path and not os.path.isdir(os.path.expanduser(spec)):
            raise ValueError(
                f"tokenizer path {spec!r} does not exist. Pass an existing directory that holds "
                "tokenizer.json (or tokenizer_config.json), a hub name such as "
                "'Qwen/Qwen2.5-3B-Instruct', or tokenizer=None for the built-in default."
            )
        try:
            with IMPORT_LOCK:
                return AutoTokenizer.from_pretrained(os.path.expanduser(spec))
        except Exception as e:  # offline hub miss, corrupt directory, ...
            raise ValueError(
                f"could not load tokenizer {spec!r}: {type(e).__name__}: {e}. Pass a local "
                "directory, a hub name reachable from this machine, or tokenizer=None for the "
                "built-in default."
            ) from e
    for attr in ("encode", "decode", "apply_chat_template"):
        if not hasattr(spec, attr):
            raise TypeError(
                f"tokenizer object of type {type(spec).__name__} has no {attr}(); pass a "
                "transformers tokenizer, a path, a hub name or None."
            )
    return spec


def pad_token_id(tokenizer: Any, default: int | None = None) -> int:
    """The id to pad token rows with: the tokenizer's pad id, else its eos id, else ``default``.

    Padding is masked out wherever the project pads (left padding in the backends, right padding
    in the update's batch), so any valid id would do; this picks one the same way everywhere.
    Raises ``ValueError`` when the tokenizer has neither and no ``default`` is given."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    if default is not None:
        return int(default)
    raise ValueError(
        f"{type(tokenizer).__name__} has neither pad_token_id nor eos_token_id, so there is no id to "
        "pad rows with: set tokenizer.pad_token (e.g. tokenizer.pad_token = tokenizer.unk_token) first"
    )


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash of what makes two tokenizers encode and render alike: the vocabulary (token ->
    id), the special tokens and the chat template. Equal fingerprints on two machines mean the same
    ids for the same text. ``tokenizer`` is anything :func:`load_tokenizer` takes."""
    tok = load_tokenizer(tokenizer)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    special = {k: str(v) for k, v in sorted((getattr(tok, "special_tokens_map", None) or {}).items())}
    blob = json.dumps([vocab, special, getattr(tok, "chat_template", None)], ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
