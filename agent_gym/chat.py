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
text of an added token: a special one (``<|im_end|>``) or a non-special one (Qwen2.5's
``<tool_call>``, ``</tool_response>``; the default tokenizer's ``<answer>``, ``<information>``).
Encoded with the template it would become that token, and an agent could forge turn or result
boundaries in env tokens. So added tokens are recognized only in the template's own text: where a
content holds an added token's text, the render is cut at the template's added tokens and each
piece is encoded with the tokenizer's pre-tokenizer and model alone (its added vocabulary left
out), which is what the tokenizer does anyway (it splits at added tokens before BPE) except that
the contents' added tokens stay plain text. System messages are the env's own instructions: their
non-special added tokens (the format's tags) stay tokens, as a model trained on the template saw
them; their special tokens are plain text too. A format that frames results inside a content
(``search_r1``'s ``<information>...</information>``) gets that frame as plain text, as with
Qwen2.5, where these tags are not tokens; ``hermes`` results are framed by the template's own
``<tool_response>`` tags. Contents without added-token text take the ordinary path, so their ids
are unchanged (equal to ``apply_chat_template``'s).
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

    def __init__(
        self, tokenizer: Any, tools: list[dict] | None = None, eot_token: str | None = None, cache_size: int = 4096
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has no chat "
                "template; set tokenizer.chat_template (a Jinja string) or use an instruct model's tokenizer."
            )
        self.tok = tokenizer
        self.tools = tools or None
        added = list(getattr(tokenizer, "added_tokens_decoder", {}).values())
        specials = {t for t in getattr(tokenizer, "all_special_tokens", []) if t} | {
            t.content for t in added if getattr(t, "special", False) and t.content
        }
        tags = {t.content for t in added if not getattr(t, "special", False) and t.content} - specials
        strip = {t.content: (bool(getattr(t, "lstrip", False)), bool(getattr(t, "rstrip", False))) for t in added}
        # Every added token's text (``_added_re``), the special ones (``_special_re``) and the
        # non-special ones (``_tag_re``), longest first; a token that strips white space takes it
        # into its match, as the tokenizer does.
        self._added_re = _token_regex(specials | tags, strip)
        self._special_re = _token_regex(specials, strip)
        self._tag_re = _token_regex(tags, strip)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._cache: OrderedDict[tuple, list[int]] = OrderedDict()
        self._cache_size = cache_size

        base_text = self.render_text(_BASE, add_generation_prompt=False)
        base_ids = self.encode(base_text)
        if eot_token is None:
            special = set(tokenizer.all_special_ids) | {
                i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)
            }
            after = [i for i in base_ids[self._content_end(base_ids) :] if i in special]
            if not after:
                raise ChatTemplateError(
                    "could not find the assistant end-of-turn token in the chat template; "
                    "pass eot_token=... explicitly."
                )
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
        return self.tok.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def encode_render(self, messages: list[Message], add_generation_prompt: bool) -> tuple[str, list[int]]:
        """Render ``messages`` and encode the text, added tokens recognized only outside the
        message contents (and a system message's non-special ones; see the module docstring).
        Returns the text and its ids."""
        text = self.render_text(messages, add_generation_prompt=add_generation_prompt)
        if self._added_re is None or not self._has_plain_tokens(messages):
            return text, self.encode(text)
        # The template's own tokens: every added token in the template text, and the non-special
        # ones in system contents. Everything between them is encoded as plain text.
        real: list[tuple[int, int]] = []
        pos = 0
        for a, b, k in self._content_spans(messages, text, add_generation_prompt):
            real += [m.span() for m in self._added_re.finditer(text, pos, a)]
            if messages[k]["role"] == "system" and self._tag_re is not None:
                real += [m.span() for m in self._tag_re.finditer(text, a, b)]
            pos = max(pos, b)
        real += [m.span() for m in self._added_re.finditer(text, pos)]
        ids: list[int] = []
        pos = 0
        for a, b in real:
            if a < pos:
                continue  # overlaps the previous token (only with a template the spans misread)
            ids += self._encode_plain(text[pos:a]) + self.encode(text[a:b])
            pos = b
        return text, ids + self._encode_plain(text[pos:])

    def _has_plain_tokens(self, messages: list[Message]) -> bool:
        """Whether a content holds added-token text that must be encoded as plain text (in a
        system message: special-token text only)."""
        for m in messages:
            rx = self._special_re if m["role"] == "system" else self._added_re
            if rx is not None and rx.search(m["content"]):
                return True
        return False

    def _encode_plain(self, text: str) -> list[int]:
        """``text``'s ids with no added token in them: the fast tokenizer's normalizer,
        pre-tokenizer and model, its added vocabulary left out (for text without added-token text
        this is exactly ``encode``; tested). A slow tokenizer skips every added token with
        ``split_special_tokens=True``."""
        if not text:
            return []
        bt = self._backend
        if bt is None:
            return self.tok.encode(text, add_special_tokens=False, split_special_tokens=True)
        if bt.normalizer is not None:
            text = bt.normalizer.normalize_str(text)
        pieces = bt.pre_tokenizer.pre_tokenize_str(text) if bt.pre_tokenizer is not None else [(text, None)]
        return [t.id for piece, _ in pieces for t in bt.model.tokenize(piece)]

    def _content_spans(self, messages: list[Message], text: str, gen: bool) -> list[tuple[int, int, int]]:
        """Where each content lies in ``text``, as ``(start, end, message index)`` in order: the
        template is rendered once more with a unique placeholder per content, then the placeholders
        are matched against ``text``."""
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        skeleton = self.render_text([{**m, "content": k} for m, k in zip(messages, marks)], add_generation_prompt=gen)
        pieces = re.split("(\ue000\\d+\ue001)", skeleton)
        for transform in (lambda c: c, str.strip):  # verbatim, or trimmed (Llama 3's templates)
            spans, pos, out = [], 0, []
            for i, piece in enumerate(pieces):
                if i % 2:
                    k = int(piece[1:-1])
                    c = transform(messages[k]["content"])
                    spans.append((pos, pos + len(c), k))
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
                    spans.append((pos, nxt, int(pieces[i - 1][1:-1])))
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
        if self._has_plain_tokens(new_messages):
            return self._delta_token_mode(new_messages)  # contents holding added-token text
        return self.encode(full[len(self._base_prefix_text) :])

    def _delta_token_mode(self, new_messages: list[Message]) -> list[int]:
        full = self.encode_render(_BASE + list(new_messages), add_generation_prompt=True)[1]
        n = len(self._base_prefix_ids)
        if full[:n] != self._base_prefix_ids:
            raise ChatTemplateError(
                "the base conversation's tokens are not a prefix of the longer render; "
                "token-exact incremental rendering is impossible with this template."
            )
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


def _token_regex(tokens: set[str], strip: dict[str, tuple[bool, bool]]) -> re.Pattern | None:
    """A regex matching any of ``tokens``, longest first, with the white space a token strips."""
    if not tokens:
        return None
    parts = []
    for t in sorted(tokens, key=len, reverse=True):
        left, right = strip.get(t, (False, False))
        parts.append(("\\s*" if left else "") + re.escape(t) + ("\\s*" if right else ""))
    return re.compile("|".join(parts))
