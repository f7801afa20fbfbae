"""Retrieval tools for envs: the ``search`` and ``lookup`` tools over a retriever, and the
formatter that renders their passages within a token budget.

Generic: any env with a :class:`~agent_gym.retrievers.Retriever` can hand these to ``ToolEnv``
(the QA envs of ``envs/qa.py`` do). They moved here from ``envs/qa.py`` (2026-11-25), which still
re-exports the old names. The formatter's caches (per-passage measures and cuts, each tokenizer's
widest token) live with it.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Sequence

from agent_gym.tools import Tool, ToolResult

from .base import Passage, Retriever, RetrieverError

__all__ = ["LookupTool", "PassageFormatter", "SearchTool"]


# -- result formatting -------------------------------------------------------------------------


class PassageFormatter:
    """Render passages as ``Doc i (Title: t) text`` lines within a token budget.

    Token counts come from the env's tokenizer, one passage line at a time, plus one token per
    newline between lines. A line that does not fit is cut at the last space before its
    ``budget``-th token, found from the fast tokenizer's character offsets. Both are exact for
    tokenizers that pre-tokenize at spaces and newlines (byte-level BPE as in GPT-2, Llama 3 and
    Qwen; Metaspace as in Llama 2); a slow (Python) tokenizer is cut by binary search over words
    with exact counts.

    A passage is never tokenized whole when it is long: its line is measured on a prefix that
    ends at a space (first ``probe_chars`` characters, then four times more, ...) until the
    prefix holds more than ``max_tokens`` tokens; the tokens of such a prefix are those of the
    whole line up to it, so the line cannot fit and the cut lies inside the prefix. The probes
    stop at a character bound: ``max_tokens + 1`` times the most characters one token of the
    vocabulary spans, doubled. A line longer than that holds more than ``max_tokens`` tokens
    whatever they are, so a line with no space in its first ``bound`` characters (CJK text,
    base64, one long run) is measured on its prefix up to the last space before the bound (the
    head's space at least), never whole; its cut lies at or before that space. (A tokenizer
    without ``get_vocab`` has no bound and such a line is tokenized once, whole.) Per passage
    and rank, the measure (the exact count, or "over the budget" with the offsets of its first
    tokens) is memoized, and so is each cut, so a passage that comes back again costs no
    tokenization at all: a 20 MB passage costs about what a 512-token one does
    (``benchmarks/perf/passage_formatter.py``). A cut is at a space, so a passage with no space
    before its cut shows its title only.
    """

    ELLIPSIS = " ..."

    def __init__(self, tokenizer: Any, max_tokens: int, cache_size: int = 100_000, probe_chars: int | None = None):
        self.tok = tokenizer
        self.max_tokens = max_tokens
        self._backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        # (count, offsets of the first max_tokens + 1 tokens or None, prefix length or None)
        self._measures: OrderedDict[tuple, tuple[int, list[tuple[int, int]] | None, int | None]] = OrderedDict()
        self._cache_size = cache_size
        # (measure key, room) -> the cut line or None (a tenth as many: a cut holds up to max_tokens)
        self._cuts: OrderedDict[tuple, str | None] = OrderedDict()
        self._probe_chars = probe_chars or 16 * (max_tokens + 1)
        self._bound: int | None | bool = False  # the character bound, computed when first needed
        self._ellipsis = self.count(self.ELLIPSIS)

    def _char_bound(self) -> int | None:
        """Characters past which a line certainly holds more than ``max_tokens`` tokens: each token
        spans at most ``w`` characters (``w`` the longest vocabulary entry, special and added
        tokens included; a byte-level entry spans at most as many characters as it has bytes),
        so ``(max_tokens + 1) * w`` characters need more than ``max_tokens`` tokens. Doubled as a
        margin for normalizers. ``None`` when the tokenizer has no ``get_vocab``."""
        if self._bound is False:
            self._bound = _char_bound(self.tok, self.max_tokens)
        return self._bound  # type: ignore[return-value]

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False))

    def _encode(self, text: str) -> tuple[int, list[tuple[int, int]] | None]:
        """(token count, character offsets or None)."""
        if self._backend is not None:
            e = self._backend.encode(text, add_special_tokens=False)
            return len(e.ids), e.offsets
        return self.count(text), None

    def _measure(self, head: str, text: str) -> tuple[int, list[tuple[int, int]] | None, int | None]:
        """Measure the line ``head + " " + text`` without tokenizing more of it than needed.

        Returns ``(n, offsets, prefix_len)``: the exact token count with ``None, None`` when the
        whole line was tokenized and fits in ``max_tokens`` (with its first ``max_tokens + 1``
        offsets instead of ``None`` when it does not); else a count over ``max_tokens`` and the
        first offsets (None for a slow tokenizer) of a prefix of the line that holds the cut:
        either its first ``prefix_len`` characters, which end before a space and hold more than
        ``max_tokens`` tokens, or (past the character bound) the line up to its last space before
        the bound, whose tokens and offsets are given, plus that space (``prefix_len`` counts
        it): every cut lies at or before that space.
        """
        total = len(head) + 1 + len(text)
        probe = self._probe_chars
        bound = self._char_bound() if probe < total else None
        measured = (-1, 0, None)  # (space, count, offsets) of the last prefix tokenized
        while probe < total:
            final = bound is not None and probe >= bound
            end = bound if final else probe
            prefix = f"{head} {text[: max(0, end - len(head) - 1)]}"
            space = prefix.rfind(" ", len(head) + 1)
            if space > len(head) + 1 and space != measured[0]:
                n, offsets = self._encode(prefix[:space])
                if n > self.max_tokens:
                    return n, (offsets[: self.max_tokens + 1] if offsets is not None else None), space
                measured = (space, n, offsets)
            if final:  # the whole line is over the budget: its cut lies at or before the last space
                space = prefix.rfind(" ", len(head))
                if space != measured[0]:
                    measured = (space, *self._encode(prefix[:space]))
                _, n, offsets = measured
                if n > self.max_tokens:  # a head longer than the budget
                    return n, (offsets[: self.max_tokens + 1] if offsets is not None else None), space
                return self.max_tokens + 1, offsets, space + 1
            probe *= 4
        n, offsets = self._encode(f"{head} {text}")
        if n > self.max_tokens:
            return n, (offsets[: self.max_tokens + 1] if offsets is not None else None), total
        return n, None, None

    def _measured(self, key: tuple, head: str, text: str) -> tuple[int, list[tuple[int, int]] | None, int | None]:
        m = self._measures.get(key)
        if m is None:
            m = self._measure(head, text)
            self._measures[key] = m
            if len(self._measures) > self._cache_size:
                self._measures.popitem(last=False)
        else:
            self._measures.move_to_end(key)
        return m

    def format(self, passages: Sequence[Passage]) -> tuple[str, list[str]]:
        """Return the text and the titles it shows (a cut passage counts if its title shows)."""
        lines: list[str] = []
        titles: list[str] = []
        used = 0
        for rank, p in enumerate(passages, 1):
            head = f"Doc {rank} (Title: {p.title})"
            key = (rank, p.id, p.title, len(p.text), hash(p.text))
            n, offsets, prefix_len = self._measured(key, head, p.text)
            sep = 1 if lines else 0
            if used + sep + n <= self.max_tokens:
                lines.append(f"{head} {p.text}")
                titles.append(p.title)
                used += sep + n
                continue
            room = self.max_tokens - used - sep
            ckey = (key, room)
            if ckey in self._cuts:
                self._cuts.move_to_end(ckey)
                cut = self._cuts[ckey]
            else:
                # Only the measured prefix can hold the cut (the whole line when it was measured whole).
                kept = p.text if prefix_len is None else p.text[: prefix_len - len(head) - 1]
                line = f"{head} {kept}"
                cut = self._cuts[ckey] = self._cut(line, len(head), room, offsets)
                if len(self._cuts) > max(1, self._cache_size // 10):
                    self._cuts.popitem(last=False)
            if cut is not None:
                lines.append(cut)
                titles.append(p.title)
            break
        return "\n".join(lines), titles

    def _cut(self, line: str, keep: int, room: int, offsets: list[tuple[int, int]] | None) -> str | None:
        """The longest prefix of ``line`` that ends before a space, keeps its first ``keep``
        characters (the title header) and, with `` ...`` appended, fits in ``room`` tokens.
        ``offsets`` are those of the line's first tokens, if known: at least ``room`` of them, or
        (a line measured up to the character bound) all of those before its last space."""
        budget = room - self._ellipsis
        if budget <= 0:
            return None
        if self._backend is not None:
            if offsets is None:
                offsets = self._encode(line)[1]
            assert offsets is not None
            # Cut at a space no later than where the first token over budget starts: the tokens
            # before the space are unchanged by the cut. (Offsets are by character, and the bytes
            # of one character may be several tokens; all of them then start at the character.)
            limit = offsets[budget][0] if budget < len(offsets) else len(line)
            space = line.rfind(" ", keep, limit + 1)
            return None if space < 0 else line[:space] + self.ELLIPSIS
        spaces = [i for i in range(keep, len(line)) if line[i] == " "]
        lo, hi, best = 0, len(spaces) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            cand = line[: spaces[mid]] + self.ELLIPSIS
            if self.count(cand) <= room:
                best, lo = cand, mid + 1
            else:
                hi = mid - 1
        return best


_TOKEN_CHARS: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
"""Tokenizer -> the most characters one of its tokens spans (its vocabulary read once)."""


def _token_chars(tok: Any) -> int | None:
    try:
        return _TOKEN_CHARS[tok]
    except (KeyError, TypeError):
        pass
    get_vocab = getattr(tok, "get_vocab", None)
    try:
        width = max(map(len, get_vocab())) if callable(get_vocab) else None
    except (TypeError, ValueError):  # an empty or odd vocabulary: no bound
        width = None
    try:
        _TOKEN_CHARS[tok] = width
    except TypeError:  # not weak-referenceable: not cached
        pass
    return width


def _char_bound(tok: Any, max_tokens: int) -> int | None:
    """See :meth:`PassageFormatter._char_bound`."""
    width = _token_chars(tok)
    return None if not width else 2 * (max_tokens + 1) * max(int(width), 1)


# -- tools -------------------------------------------------------------------------------------


class SearchTool(Tool):
    name = "search"
    description = (
        "Search Wikipedia. Returns the most relevant paragraphs, each with its title. Search for one fact at a time."
    )
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "the search query"}},
        "required": ["query"],
        "additionalProperties": False,
    }

    def __init__(self, retriever: Retriever, topk: int, formatter: PassageFormatter):
        self.retriever = retriever
        self.topk = topk
        self.formatter = formatter

    def execute(self, query: str) -> ToolResult:
        query = query.strip()
        if not query:
            return ToolResult("Error: the search query is empty.", ok=False)
        try:
            hits = self.retriever.search([query], self.topk)[0]
        except RetrieverError as err:
            return ToolResult(f"Error: search is unavailable: {err}", ok=False)
        if not hits:
            return ToolResult("No results.", metadata={"titles": []})
        content, titles = self.formatter.format(hits[: self.topk])
        return ToolResult(content, metadata={"titles": titles})


def _title_key(title: str) -> str:
    return " ".join(title.split()).casefold()


class LookupTool(Tool):
    name = "lookup"
    description = "Read the paragraph(s) with this exact Wikipedia title."
    parameters = {
        "type": "object",
        "properties": {"title": {"type": "string", "description": "the exact title of a paragraph"}},
        "required": ["title"],
        "additionalProperties": False,
    }

    def __init__(self, by_title: dict[str, list[Passage]], formatter: PassageFormatter):
        self.by_title = by_title
        self.formatter = formatter

    @staticmethod
    def index(docs: Sequence[dict[str, str]]) -> dict[str, list[Passage]]:
        """Title key -> the paragraphs with that title, in corpus order."""
        by_title: dict[str, list[Passage]] = {}
        for d in docs:
            by_title.setdefault(_title_key(d["title"]), []).append(
                Passage(title=d["title"], text=d["text"], score=0.0, id=d["id"])
            )
        return by_title

    def execute(self, title: str) -> ToolResult:
        found = self.by_title.get(_title_key(title))
        if not found:
            return ToolResult(
                f"Error: no paragraph titled {title.strip()!r}. Search first to find exact titles.", ok=False
            )
        content, titles = self.formatter.format(found)
        return ToolResult(content, metadata={"titles": titles})
