"""Wall time of an iteration's phases, for the ``time/<phase>_s`` metrics (docs/metrics.md).

The trainer wraps each phase in ``with phases("score"):``; the seconds add up over the iteration (a
phase entered once per micro-batch sums its calls) and ``take()`` returns them and starts the next
iteration from zero. A phase that did not run this iteration is reported as 0, so every row of
metrics.jsonl has the same columns. Phases do not nest: each second of the loop belongs to one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("score", "advantages", "update", "optimizer", "sync", "eval", "log", "checkpoint")
"""The trainer's own phases; generation and env steps come from the rollout (``time/generate_s``,
``time/env_s``). ``log`` and ``checkpoint`` run after their iteration's row is assembled, so a row
reports the logging and checkpoint of the iteration before it."""


class PhaseTimes:
    def __init__(self, names: tuple[str, ...] = PHASES):
        self.seconds = dict.fromkeys(names, 0.0)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if name not in self.seconds:
            raise KeyError(f"unknown phase {name!r}; the phases are {', '.join(self.seconds)}")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def take(self) -> dict[str, float]:
        """``{"time/<phase>_s": seconds}`` since the last ``take``, then every phase back to 0."""
        out = {f"time/{k}_s": v for k, v in self.seconds.items()}
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        return out
