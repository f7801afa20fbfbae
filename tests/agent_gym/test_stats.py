"""agent_gym/stats.py: intervals and paired tests for comparing agents on the same rows, against
values worked by hand and the normal approximation."""

import numpy as np
import pytest

from agent_gym.stats import bootstrap_ci, paired_bootstrap_diff, paired_test, sign_test


def test_sign_test_by_hand():
    assert sign_test(7, 0) == pytest.approx(2 / 128)  # both tails of 7 of 7
    assert sign_test(7, 1) == pytest.approx(2 * 9 / 256)
    assert sign_test(3, 3) == 1.0 and sign_test(0, 0) == 1.0
    assert sign_test(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    with pytest.raises(ValueError):
        sign_test(-1, 2)


def test_bootstrap_interval_matches_the_normal_approximation_for_a_proportion():
    x = np.array([1] * 120 + [0] * 280)  # p = 0.3, n = 400: half-width 1.96 * sqrt(.3 * .7 / 400) = 0.0449
    m, lo, hi = bootstrap_ci(x, n_boot=20_000, seed=1)
    assert m == pytest.approx(0.3)
    assert hi - m == pytest.approx(0.0449, abs=0.006) and m - lo == pytest.approx(0.0449, abs=0.006)
    assert bootstrap_ci([0.5] * 9) == (0.5, 0.5, 0.5)
    assert all(np.isnan(bootstrap_ci([])))


def test_paired_comparison_counts_rows_and_its_interval_excludes_zero_only_for_a_real_gap():
    a = [1, 1, 0, 1, 0.5, 0.2]
    b = [0, 1, 0, 0, 0.5, 0.4]
    r = paired_test(a, b, seed=0)
    assert (r["a_better"], r["b_better"]) == (2, 1)
    assert r["sign_test_p"] == pytest.approx(1.0)  # 2 vs 1: P = 2 * (3 + 1) / 8 > 1, capped
    assert r["diff"] == pytest.approx(np.mean(np.subtract(a, b)))
    rng = np.random.default_rng(0)
    base = (rng.random(300) < 0.2).astype(float)
    better = np.maximum(base, (rng.random(300) < 0.2).astype(float))  # only ever gains
    r = paired_test(better, base)
    assert r["b_better"] == 0 and r["sign_test_p"] < 1e-6 and r["diff_low"] > 0
    same = paired_test(base, base)
    assert same["sign_test_p"] == 1.0 and same["diff_low"] == same["diff_high"] == 0.0
    with pytest.raises(ValueError, match="same rows"):
        paired_bootstrap_diff([1, 0], [1])
