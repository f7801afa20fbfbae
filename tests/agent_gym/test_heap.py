"""``agent_gym.heap``: the C heap's in-use and free parts tell memory something holds from memory the
allocator kept after a free, and ``trim_heap`` gives the kept pages back (glibc; elsewhere None/False)."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from agent_gym.heap import heap_stats, trim_heap
from trainers.memory_budget import resident_metrics, rss_gib

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.timeout(120)
def test_heap_stats_tell_held_from_kept_and_trim_returns_the_kept_pages():
    if not GLIBC:  # no mallinfo2 or malloc_trim: the answers say so instead of guessing
        assert heap_stats() is None and trim_heap() is False
        return
    trim_heap()
    before, rss0 = heap_stats(), rss_gib()
    # 64 Ki blocks of 4 KiB (under the mmap threshold: they come from the arenas), every page written
    blocks = [np.ones(512) for _ in range(65536)]
    held = heap_stats()
    assert held["in_use_gib"] - before["in_use_gib"] == pytest.approx(0.25, abs=0.05)
    del blocks
    kept, rss_kept = heap_stats(), rss_gib()
    assert kept["in_use_gib"] == pytest.approx(before["in_use_gib"], abs=0.03)  # nothing held any more
    assert kept["free_gib"] - before["free_gib"] > 0.2  # the arenas kept the freed blocks
    assert rss_kept - rss0 > 0.2  # and their pages are still resident
    assert trim_heap() is True
    assert rss_gib() < rss_kept - 0.2  # given back


@pytest.mark.timeout(60)
def test_resident_metrics_name_what_the_platform_tells():
    keys = set(resident_metrics(trim=False))
    assert ("perf/heap_in_use_gib" in keys) is GLIBC and "perf/rss_trimmed_gib" not in keys
    trimmed = resident_metrics(trim=True)
    assert ("perf/rss_trimmed_gib" in trimmed) is GLIBC
    if GLIBC:
        assert trimmed["perf/rss_trimmed_gib"] <= trimmed["perf/rss_gib"] + 0.01
