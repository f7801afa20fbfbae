"""The incremental chat-template renderer.

The env never re-renders the whole conversation: the agent's ids stay verbatim, and after each
turn only a *delta* is appended. The delta holds the separator after the assistant's end-of-turn
token, the new messages (tool results) and the next generation prompt.

It is computed by rendering a fixed base conversation ``[system, user, assistant]`` with and
without the new messages, checking that the base (cut right after its end-of-turn token) is a
prefix of the longer render, and taking the difference. Two ways of taking the difference exist:

- ``tokens``: tokenize both renders and subtract the token lists (exact by definition);
- ``text``: subtract the texts and tokenize only the difference (fast: the base is rendered once).

They agree whenever tokenization restarts at the end-of-turn token, which holds when that token
is a special (added) token, as in every chat template we know. The renderer checks this on a
probe at construction and falls back to ``tokens`` when it does not hold.

Message contents are plain text. A tool result, an echoed argument or a question may contain the
text of a special token (``<|im_end|>``); encoded with the template it would become the special
token itself, and an agent could forge turn boundaries in env tokens. So special tokens are
recognized only in the template's own text: where a content holds a special token's text, the
render is cut at the template's special tokens and each piece is encoded with
``split_special_tokens=True``, which is what the tokenizer does anyway (it splits at added tokens
before BPE) except that the content's specials stay plain text. Contents without special-token
text take the ordinary path, so their ids are unchanged.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Callable

Message = dict[str, str]

_BASE: list[Message] = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
]


class ChatTemplateError(ValueError):
    pass


class ChatRenderer:
    """Render prompts and per-turn deltas to token ids for one tokenizer and tool set.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        tools: tool schemas passed to the template (``None`` for formats that describe tools in
            the system prompt).
        eot_token: the assistant end-of-turn token; detected from the template when ``None``.
        cache_size: deltas are memoized by message content (tool results repeat often).
    """

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None, eot_token: str | None = None,
                 cache_size: int = 4096):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has no chat "
                "template; set tokenizer.chat_template (a Jinja string) or use an instruct model's tokenizer."
            )
        self.tok = tokenizer
        self.tools = tools or None
        specials = set(getattr(tokenizer, "all_special_tokens", [])) | {
            t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)}
        specials = sorted((t for t in specials if t), key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, specials))) if specials else None
        self._cache: OrderedDict[tuple, list[int]] = OrderedDict()
        self._cache_size = cache_size

        base_text = self.render_text(_BASE, add_generation_prompt=False)
        base_ids = self.encode(base_text)
        if eot_token is None:
            special = set(tokenizer.all_special_ids) | {
                i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)
            }
            after = [i for i in base_ids[self._content_end(base_ids):] if i in special]
            if not after:
                raise ChatTemplateError("could not find the assistant end-of-turn token in the chat template; "
                                        "pass eot_token=... explicitly.")
            self.eot_id = after[0]
        else:
            self.eot_id = tokenizer.convert_tokens_to_ids(eot_token)
            if self.eot_id is None or self.eot_id == tokenizer.unk_token_id:
                raise ChatTemplateError(f"eot_token {eot_token!r} is not a token of this tokenizer")
        self.eot_text = tokenizer.decode([self.eot_id])
        cut = base_text.rfind(self.eot_text)
        if cut < 0:
            raise ChatTemplateError(f"end-of-turn token {self.eot_text!r} does not appear in the rendered base")
        self._base_prefix_text = base_text[: cut + len(self.eot_text)]
        self._base_prefix_ids = base_ids[: len(base_ids) - base_ids[::-1].index(self.eot_id)]
        self.mode = "text"
        probe = [{"role": "tool", "content": "probe 1, 2 (x)"}, {"role": "user", "content": " probe"}]
        if self._delta_text_mode(probe) != self._delta_token_mode(probe):
            self.mode = "tokens"

    # -- rendering ---------------------------------------------------------------------------

    def render_text(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def encode_render(self, messages: list[Message], add_generation_prompt: bool) -> tuple[str, list[int]]:
        """Render ``messages`` and encode the text, special tokens recognized only outside the
        message contents (see the module docstring). Returns the text and its ids."""
        text = self.render_text(messages, add_generation_prompt=add_generation_prompt)
        rx = self._special_re
        if rx is None or not any(rx.search(m["content"]) for m in messages):
            return text, self.encode(text)
        spans = self._content_spans(messages, text, add_generation_prompt)
        ids: list[int] = []
        pos = 0
        for m in rx.finditer(text):
            if any(a <= m.start() and m.end() <= b for a, b in spans):
                continue  # a special token's text inside a content: plain text
            ids += self._encode_plain(text[pos:m.start()])
            ids += self.encode(m.group(0))
            pos = m.end()
        return text, ids + self._encode_plain(text[pos:])

    def _encode_plain(self, text: str) -> list[int]:
        if not text:
            return []
        return self.tok.encode(text, add_special_tokens=False, split_special_tokens=True)

    def _content_spans(self, messages: list[Message], text: str, gen: bool) -> list[tuple[int, int]]:
        """Where each content lies in ``text``: the template is rendered once more with a unique
        placeholder per content, then the placeholders are matched against ``text``."""
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        skeleton = self.render_text([{**m, "content": k} for m, k in zip(messages, marks)], add_generation_prompt=gen)
        pieces = re.split("(\ue000\\d+\ue001)", skeleton)
        for transform in (lambda c: c, str.strip):  # verbatim, or trimmed (Llama 3's templates)
            spans, pos, out = [], 0, []
            for i, piece in enumerate(pieces):
                if i % 2:
                    c = transform(messages[int(piece[1:-1])]["content"])
                    spans.append((pos, pos + len(c)))
                    out.append(c)
                    pos += len(c)
                else:
                    out.append(piece)
                    pos += len(piece)
            if "".join(out) == text:
                return spans
        # Some other transformation: take each content to run to the next piece of template text.
        spans, pos = [], 0
        for i, piece in enumerate(pieces):
            if i % 2 == 0:
                nxt = text.find(piece, pos) if piece else pos
                if i and nxt >= 0:
                    spans.append((pos, nxt))
                pos = (nxt if nxt >= 0 else pos) + len(piece)
        return spans

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The ids of the initial context, ending with the generation prompt (memoized: GRPO
        groups and evaluation reset to the same task many times)."""
        key = ("prompt",) + tuple((m["role"], m["content"]) for m in messages)
        return self._memo(key, lambda: self.encode_render(messages, add_generation_prompt=True)[1])

    def delta_ids(self, new_messages: list[Message]) -> list[int]:
        """Ids to append after an assistant turn's end-of-turn token."""
        key = tuple((m["role"], m["content"]) for m in new_messages)
        delta = self._delta_text_mode if self.mode == "text" else self._delta_token_mode
        return self._memo(key, lambda: delta(new_messages))

    def _memo(self, key: tuple, compute: Callable[[], list[int]]) -> list[int]:
        """A copy of the cached ids for ``key``, computing and storing them on a miss (LRU)."""
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return list(hit)
        ids = compute()
        self._cache[key] = ids
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return list(ids)

    def _delta_text_mode(self, new_messages: list[Message]) -> list[int]:
        full = self.render_text(_BASE + list(new_messages), add_generation_prompt=True)
        if not full.startswith(self._base_prefix_text):
            raise ChatTemplateError(
                "the chat template re-renders earlier turns when messages are added (the base "
                "conversation is not a prefix), so token-exact incremental rendering is impossible "
                "with it. Use a template that renders earlier turns unchanged."
            )
        rx = self._special_re
        if rx is not None and any(rx.search(m["content"]) for m in new_messages):
            return self._delta_token_mode(new_messages)  # contents holding special-token text
        return self.encode(full[len(self._base_prefix_text):])

    def _delta_token_mode(self, new_messages: list[Message]) -> list[int]:
        full = self.encode_render(_BASE + list(new_messages), add_generation_prompt=True)[1]
        n = len(self._base_prefix_ids)
        if full[:n] != self._base_prefix_ids:
            raise ChatTemplateError("the base conversation's tokens are not a prefix of the longer render; "
                                    "token-exact incremental rendering is impossible with this template.")
        return full[n:]

    def _content_end(self, base_ids: list[int]) -> int:
        """Index just past the assistant content 'A' in the base render."""
        text_so_far, last_a = "", None
        for i, tid in enumerate(base_ids):
            text_so_far += self.tok.decode([tid])
            if text_so_far.rstrip().endswith("A"):
                last_a = i
        if last_a is None:
            raise ChatTemplateError("the chat template does not render the assistant's content; pass eot_token=...")
        return last_a + 1
