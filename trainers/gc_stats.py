"""Garbage-collector pauses of a training run, and ``gc.freeze()`` after set-up.

After set-up (model, optimizer, tokenizer, envs, backend) the process holds hundreds of thousands
of long-lived Python objects; every full (generation-2) collection during training walks all of
them again. ``GcStats(freeze=True)`` collects once and freezes them (``gc.freeze``: they move to
a permanent generation the collector skips), so later collections walk only what training
allocates. It also times every collection (``gc.callbacks``) for the ``perf/gc_*`` metrics
(docs/metrics.md); figures in docs/results.md ("Garbage collection").
"""

from __future__ import annotations

import gc
import time
from typing import Any


class GcStats:
    def __init__(self, freeze: bool = True):
        self.frozen = 0
        if freeze:
            gc.collect()
            gc.freeze()
            self.frozen = gc.get_freeze_count()
        self._t0: float | None = None
        self._gen = 0
        self._seconds = 0.0
        self._full_seconds = 0.0
        self._collections = 0
        self._full = 0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0, self._gen = time.perf_counter(), info.get("generation", 0)
            return
        if self._t0 is None:
            return
        dt = time.perf_counter() - self._t0
        self._t0 = None
        self._seconds += dt
        self._collections += 1
        if self._gen == 2:
            self._full_seconds += dt
            self._full += 1

    def take(self) -> dict[str, float]:
        """The pauses since the last ``take`` (or since construction), then reset."""
        out = {
            "perf/gc_s": self._seconds,
            "perf/gc_full_s": self._full_seconds,
            "perf/gc_collections": float(self._collections),
            "perf/gc_full_collections": float(self._full),
            "perf/gc_frozen_objects": float(self.frozen),
        }
        self._seconds = self._full_seconds = 0.0
        self._collections = self._full = 0
        return out

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self.frozen:
            gc.unfreeze()
            self.frozen = 0
