"""RunLogger: every metric line reaches the OS at once (a killed run loses nothing), fsync is
batched (at most every ``fsync_every_s`` and at close) instead of one per iteration."""

from __future__ import annotations

import json
import os

import pytest

from trainers import logger as L


@pytest.fixture
def fsyncs(monkeypatch):
    calls = []
    real = os.fsync

    def counting(fd):
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(L.os, "fsync", counting)
    return calls


@pytest.mark.timeout(60)
def test_lines_readable_at_once_and_fsync_batched(tmp_path, fsyncs):
    log = L.RunLogger(tmp_path, 50, tensorboard=False, progress_bar=False, fsync_every_s=3600)
    for it in range(50):
        log.log(it, {"rollout/reward_mean": it / 10})
        # Another process (a viewer, a resumed run) reads every line as soon as it is logged.
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == it + 1 and json.loads(lines[-1])["rollout/reward_mean"] == it / 10
    assert fsyncs == []
    log.close()
    assert len(fsyncs) == 1
    assert [r["iteration"] for r in L.read_metrics(tmp_path)] == list(range(50))


@pytest.mark.timeout(60)
def test_fsync_every_line_when_asked(tmp_path, fsyncs):
    log = L.RunLogger(tmp_path, 5, tensorboard=False, progress_bar=False, fsync_every_s=0)
    for it in range(5):
        log.log(it, {"x": 1.0})
    assert len(fsyncs) == 5
    log.close()
