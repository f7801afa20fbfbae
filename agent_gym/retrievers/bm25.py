"""BM25 with `bm25s`: the embedded default retriever (no Java, no torch).

Built from a corpus JSONL path or from a list of rows (e.g. `corpus_from_tasks(tasks)`). The
index is saved under `<cache_root>/bm25s/<key>/`, where the key hashes the corpus content and
the scoring/tokenizer settings; a second build with the same corpus loads it from there.

Analysis is chosen to match Anserini's default English analyzer (what `pyserini` uses), so the
two BM25 backends rank alike: lower case, English possessive `'s` removed, Lucene's 33 English
stop words, the original Porter stemmer (PyStemmer's `porter`, the algorithm of Lucene's
`PorterStemFilter`), and Anserini's BM25 defaults k1=0.9, b=0.4 with Lucene's IDF. One
difference remains: tokens are `\\w+` runs, whereas Lucene's StandardTokenizer follows UAX#29
(it keeps "1,000" or "u.s" as one token).

Search is thread-safe: after the build the index is only read (scores come from
`bm25s.BM25.get_scores_from_ids`, which allocates its own arrays per call). A retriever pickles
and deep-copies (so do the envs that hold one): the PyStemmer object is rebuilt on unpickling.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent_gym.datasets.base import cache_root, corpus_fingerprint

from .base import Passage, check_k, load_docs

__all__ = ["BM25Retriever", "LUCENE_ENGLISH_STOPWORDS", "LuceneLikeAnalyzer"]

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, also Anserini's default.
LUCENE_ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)

_TOKEN = re.compile(r"\w+")
_POSSESSIVE = re.compile(r"['\u2019]s\b")

ANALYZER_VERSION = "lucene-like-v1"


class LuceneLikeAnalyzer:
    """text -> terms: lower, drop possessive 's, `\\w+` tokens, stop words, Porter stem."""

    def __init__(self, stemmer: str | None = "porter", stopwords: frozenset[str] = LUCENE_ENGLISH_STOPWORDS):
        self.stopwords = stopwords
        self.stemmer_name = stemmer
        self._stem = None
        if stemmer is not None:
            try:
                import Stemmer  # optional: PyStemmer, for stemming only (a core dependency; stemmer=None runs without it)
            except ImportError as err:
                raise ImportError(
                    "BM25 stemming needs PyStemmer: pip install PyStemmer (or pass stemmer=None)"
                ) from err
            self._stem = Stemmer.Stemmer(stemmer).stemWords

    # PyStemmer's Stemmer is a C object that cannot be pickled: drop it and build it again.
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_stem"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stem = None
        if self.stemmer_name is not None:
            import Stemmer  # optional: PyStemmer, for stemming only (a core dependency; stemmer=None runs without it)

            self._stem = Stemmer.Stemmer(self.stemmer_name).stemWords

    @property
    def signature(self) -> str:
        return f"{ANALYZER_VERSION}:{self.stemmer_name}:{','.join(sorted(self.stopwords))}"

    def __call__(self, text: str) -> list[str]:
        tokens = [t for t in _TOKEN.findall(_POSSESSIVE.sub("", text.lower())) if t not in self.stopwords]
        return self._stem(tokens) if self._stem is not None else tokens


def import_bm25s():
    """``import bm25s`` with JAX hidden from it.

    bm25s's ``selection`` module imports ``jax.lax`` when JAX is installed and runs a top-k at import
    time, which starts JAX's default backend: on a GPU machine XLA then takes 75% of the GPU's memory
    (seen on an H100 with JAX in the image: 59.4 GiB gone before the policy's first forward, which
    ran out of memory). This retriever ranks with numpy (``search``), so bm25s never needs JAX: it
    is imported while ``jax`` is marked absent in ``sys.modules``, and the entries are restored
    after, so the user's own ``import jax`` still works. An already imported bm25s is returned as is.
    """
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    names = ("jax", "jax.lax")
    before = {n: sys.modules[n] for n in names if n in sys.modules}
    for n in names:
        sys.modules[n] = None  # type: ignore[assignment]  # "import jax" raises ImportError
    try:
        import bm25s  # deferred: imported here with JAX hidden; a top-level import would start JAX's backend
    finally:
        for n in names:
            if n in before:
                sys.modules[n] = before[n]
            else:
                sys.modules.pop(n, None)
    return bm25s


class BM25Retriever:
    """BM25 over `corpus` (title + text of each doc, as in the `contents` field)."""

    def __init__(
        self,
        corpus: str | Path | Sequence[Mapping[str, Any]],
        k1: float = 0.9,
        b: float = 0.4,
        stemmer: str | None = "porter",
        cache: bool = True,
        cache_dir: str | Path | None = None,
    ):
        bm25s = import_bm25s()
        self.docs = load_docs(corpus)
        if not self.docs:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        self.analyzer = LuceneLikeAnalyzer(stemmer=stemmer)
        self.k1, self.b = k1, b
        key_src = json.dumps(
            [corpus_fingerprint(self.docs), k1, b, "lucene", self.analyzer.signature, bm25s.__version__]
        )
        self.cache_key = hashlib.sha256(key_src.encode()).hexdigest()[:24]
        self.index_dir: Path | None = None
        self.loaded_from_cache = False
        if cache:
            root = Path(cache_dir) if cache_dir is not None else cache_root() / "bm25s"
            self.index_dir = root / self.cache_key
            if (self.index_dir / "params.index.json").is_file():
                self._bm25 = bm25s.BM25.load(str(self.index_dir), show_progress=False)
                self.loaded_from_cache = True
                return
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        corpus_tokens = [self.analyzer(f"{d['title']}\n{d['text']}") for d in self.docs]
        self._bm25.index(corpus_tokens, show_progress=False)
        if self.index_dir is not None:
            self._save(self.index_dir)

    def _save(self, final: Path) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
        try:
            self._bm25.save(str(tmp), show_progress=False)
            os.replace(tmp, final)
        except OSError:
            # Another process saved the same index first; its copy is as good as ours.
            shutil.rmtree(tmp, ignore_errors=True)

    def _query_ids(self, query: str) -> list[int]:
        vocab = self._bm25.vocab_dict
        return [vocab[t] for t in self.analyzer(query) if t in vocab]

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        check_k(k)
        k = min(k, len(self.docs))
        out: list[list[Passage]] = []
        for query in queries:
            ids = self._query_ids(query)
            if not ids:
                out.append([])
                continue
            scores = self._bm25.get_scores_from_ids(ids)
            top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
            top = top[np.lexsort((top, -scores[top]))]  # score desc, then doc order: deterministic
            out.append([self._passage(int(i), float(scores[i])) for i in top if scores[i] > 0.0])
        return out

    def _passage(self, i: int, score: float) -> Passage:
        d = self.docs[i]
        return Passage(title=d["title"], text=d["text"], score=score, id=d["id"])
