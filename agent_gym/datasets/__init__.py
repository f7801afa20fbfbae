"""Multi-hop QA dataset loaders (HotpotQA, 2WikiMultiHopQA, MuSiQue) and corpus helpers.

    from agent_gym.datasets import load_qa, corpus_from_tasks
    tasks = load_qa("hotpotqa", data_path="hotpot_dev_distractor_v1.json", limit=100)
    corpus = corpus_from_tasks(tasks)   # the distractor pool, for a retriever

Valid dataset names: `hotpotqa`, `2wikimultihopqa`, `musique` (see `DATASETS`).
"""

from . import hotpotqa, musique, twowiki  # noqa: F401  (each registers itself)
from .base import (
    DATASETS,
    DatasetDownloadError,
    DatasetFormatError,
    QATask,
    cache_root,
    corpus_fingerprint,
    corpus_from_tasks,
    load_corpus,
    load_qa,
    write_corpus,
)

__all__ = [
    "DATASETS",
    "DatasetDownloadError",
    "DatasetFormatError",
    "QATask",
    "cache_root",
    "corpus_fingerprint",
    "corpus_from_tasks",
    "load_corpus",
    "load_qa",
    "write_corpus",
]
