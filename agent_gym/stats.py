"""Statistics for comparing agents on the same evaluation rows: intervals and paired tests.

- :func:`bootstrap_ci`: a mean over rows with its percentile bootstrap interval (rows resampled
  with replacement; EM and F1 of an evaluation set);
- :func:`paired_bootstrap_diff`: the mean difference of two methods on the same rows, with the
  bootstrap interval of the difference (rows resampled in pairs);
- :func:`sign_test`: the exact two-sided sign test on the rows where two methods differ; on 0/1
  outcomes (EM, success) this is the exact McNemar test;
- :func:`paired_test`: both, for two methods' per-row scores.

Plain numpy, no torch: the benchmark and table scripts use it, and so may a user comparing two
checkpoints' ``trajectories.jsonl``.
"""

from __future__ import annotations

from math import comb
from typing import Sequence

import numpy as np


def bootstrap_ci(
    values: Sequence[float], n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and its percentile bootstrap interval at
    ``level``. ``(nan, nan, nan)`` for no values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(lo), float(hi)


def paired_bootstrap_diff(
    a: Sequence[float], b: Sequence[float], n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean(a - b), low, high)`` over paired rows, rows resampled together."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"paired scores need the same rows: got {x.shape} and {y.shape}")
    return bootstrap_ci(x - y, n_boot, level, seed)


def sign_test(up: int, down: int) -> float:
    """Exact two-sided sign test: P(a split of ``up + down`` differing rows at least this uneven | p =
    1/2). 1.0 when no row differs."""
    if up < 0 or down < 0:
        raise ValueError(f"counts must be non-negative, got {up}, {down}")
    n = up + down
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(max(up, down), n + 1)) / 2**n
    return float(min(1.0, 2 * tail))


def paired_test(a: Sequence[float], b: Sequence[float], n_boot: int = 10_000, seed: int = 0) -> dict[str, float]:
    """Method ``a`` against method ``b`` on the same rows: how many rows each is better on (``a_better``,
    ``b_better``; ties dropped), the exact sign test on those (McNemar's on 0/1 scores), and the mean
    difference with its paired bootstrap 95% interval."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"paired scores need the same rows: got {x.shape} and {y.shape}")
    up, down = int((x > y).sum()), int((x < y).sum())
    d, lo, hi = paired_bootstrap_diff(x, y, n_boot, seed=seed)
    return {
        "a_better": up,
        "b_better": down,
        "sign_test_p": sign_test(up, down),
        "diff": d,
        "diff_low": lo,
        "diff_high": hi,
    }
