"""Retrievers behind one Protocol: `search(queries, k) -> list[list[Passage]]`.

    from agent_gym.retrievers import make_retriever
    r = make_retriever("bm25", corpus="corpus.jsonl")      # or corpus=corpus_from_tasks(tasks)
    r.search(["who directed Ed Wood?"], k=5)

Kinds: `bm25` (bm25s, default), `pyserini` (Lucene; extra `pyserini`), `dense` (encoder +
faiss; extra `dense`), `http` (client of a Search-R1-style server), `ray` (client of one retriever actor
shared by every env of a Ray cluster; extra `scale`). The factories import their
backend module only when called (each costs ~50 ms of import, `agent_gym.datasets.base`), so
`import agent_gym.retrievers` loads no Java, faiss or torch, and no corpus code.
"""

from typing import Any

from .base import RETRIEVERS, Passage, Retriever, RetrieverError, make_retriever, register_retriever
from .ray_actor import RayRetriever  # imports ray only when a search needs it (~2 ms here)

__all__ = ["RETRIEVERS", "Passage", "Retriever", "RetrieverError", "make_retriever", "register_retriever"]


@register_retriever("bm25")
def _bm25(**kwargs: Any) -> Retriever:
    from .bm25 import BM25Retriever  # deferred: agent_gym.datasets.base (~45 ms) waits for a retriever

    return BM25Retriever(**kwargs)


@register_retriever("pyserini")
def _pyserini(**kwargs: Any) -> Retriever:
    from .pyserini_bm25 import PyseriniBM25Retriever  # deferred: agent_gym.datasets.base (~45 ms) waits for a retriever

    return PyseriniBM25Retriever(**kwargs)


@register_retriever("dense")
def _dense(**kwargs: Any) -> Retriever:
    from .dense import DenseRetriever  # deferred: agent_gym.datasets.base (~45 ms) waits for a retriever

    return DenseRetriever(**kwargs)


@register_retriever("ray")
def _ray(**kwargs: Any) -> Retriever:
    return RayRetriever(**kwargs)


@register_retriever("http")
def _http(**kwargs: Any) -> Retriever:
    from .client import HTTPRetriever  # deferred: agent_gym.datasets.base (~45 ms) and http.client wait for a retriever

    return HTTPRetriever(**kwargs)
