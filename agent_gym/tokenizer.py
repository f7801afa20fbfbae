"""Tokenizers: loading by hub name, path or object, and a small default built in code.

The default tokenizer lets ``gym.make("AgentR1/FactChain-v0")`` work offline with no download.
It is a byte-level BPE (so every string encodes, and decoding is lossless) trained in code on a
fixed corpus, with ChatML special tokens and the tool-call tags as single tokens. Training is
deterministic, so two processes build the same vocabulary; the result is cached per process.
"""

from __future__ import annotations

import functools
import os
from typing import Any

CHATML_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}"
    "{{ '\\n\\n# Tools\\n\\nYou may call one or more functions. Function signatures:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nReturn each call as <tool_call>{\"name\": <name>, \"arguments\": <args>}</tool_call><|im_end|>\\n' }}"
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
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<answer>", "</answer>", "<search>", "</search>",
    "<information>", "</information>", "<think>", "</think>",
]
"""Tags that are single (non-special) tokens in the default tokenizer, as in Qwen2.5."""

_CORPUS_WORDS = (
    "the a an of in on at to from by with for and or not is was are were be been has have had "
    "who what which where when how why whose whom this that these those it its he she they them "
    "his her their one two three four five six seven eight nine ten first second third last "
    "born city country river mountain company founder founded capital mother father child "
    "spouse married mentor rival sibling student employer works worked lives lived located created wrote "
    "director directed author film book song album band team player year years old new "
    "question answer search lookup entity relation result results found not none error "
    "tool call name arguments query title text passage paragraph information tool_call "
    "invalid unknown missing required bad argument timeout budget exceeded please try again "
    "final think step hop fact chain knowledge base entry entries you are a helpful assistant "
    "use tools find reply with call functions return each signature description parameters "
    "type object string integer properties"
).split()

_CORPUS_SYLLABLES = (
    "ka ri to mel van dor sil bra quen lo zar fin ta mur eth ol pra ves nu kor ial dra "
    "bel tis gor ven ash lin ro mal dun sha vel tor ek ma bor ia ren ost qua lith"
).split()


def _training_corpus() -> list[str]:
    words = _CORPUS_WORDS
    syl = _CORPUS_SYLLABLES
    lines: list[str] = []
    for i, w in enumerate(words):
        lines.append(" ".join(words[(i + k * 7) % len(words)] for k in range(12)))
    for i, a in enumerate(syl):
        for j, b in enumerate(syl):
            name = (a + b).capitalize()
            lines.append(f"{name} {syl[(i + j) % len(syl)]}{a} {name}'s {words[(i * j) % len(words)]}")
    for d in range(200):
        lines.append(f"{d} {d * 7 % 1000} {1900 + d} ({d}) [{d}]")
    lines.append('{"name": "lookup", "arguments": {"entity": "Karimel", "relation": "mentor"}}')
    # FactChain's relation names as whole tokens both after a space (in questions) and after a
    # quote (in tool-call arguments), so that copying one into the other is one token to one.
    for r in ("mentor", "rival", "employer", "sibling", "founder", "spouse"):
        lines.extend([f'the {r} of "relation": "{r}"'] * 3)
    lines.append('{"name": "search", "arguments": {"query": "who founded the company"}}')
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
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

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


@functools.lru_cache(maxsize=1)
def default_tokenizer():
    """The built-in ChatML tokenizer (about 2k tokens). Built once per process, in ~0.2 s."""
    return build_bpe_tokenizer()


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
        from transformers import AutoTokenizer

        spec = str(spec)
        looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec.strip("/").split("/", 1)[-1]
        if looks_like_path and not os.path.isdir(os.path.expanduser(spec)):
            raise ValueError(
                f"tokenizer path {spec!r} does not exist. Pass an existing directory that holds "
                "tokenizer.json (or tokenizer_config.json), a hub name such as "
                "'Qwen/Qwen2.5-3B-Instruct', or tokenizer=None for the built-in default."
            )
        try:
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
