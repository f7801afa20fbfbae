"""Each iteration's phases in the metrics (``time/<phase>_s``, trainers/phases.py; docs/metrics.md):
what a phase profile of a run (docs/results.md) is read from."""

from __future__ import annotations

import json

import pytest

from trainers import phases as phases_mod
from trainers.phases import PHASES, PhaseTimes


def test_phase_times_add_up_per_phase_and_restart_at_take(monkeypatch):
    clock = iter([0.0, 1.5, 10.0, 10.25, 20.0, 22.0])  # three timed blocks: 1.5 s, 0.25 s, 2 s
    monkeypatch.setattr(phases_mod.time, "perf_counter", lambda: next(clock))
    p = PhaseTimes()
    with p("update"):
        pass
    with p("update"):  # a phase entered once per micro-batch sums its calls
        pass
    with pytest.raises(RuntimeError):  # a phase that raises still counts its time
        with p("sync"):
            raise RuntimeError("boom")
    got = p.take()
    assert set(got) == {f"time/{k}_s" for k in PHASES}  # every phase, run or not: the same columns each row
    assert got["time/update_s"] == 1.75 and got["time/sync_s"] == 2.0 and got["time/score_s"] == 0.0
    assert all(v == 0.0 for v in p.take().values())  # the next iteration starts from zero
    with pytest.raises(KeyError, match="unknown phase 'updat'; the phases are score, advantages, update"):
        with p("updat"):
            pass


@pytest.mark.timeout(300)
def test_a_ppo_run_logs_every_phase_and_the_update_tokens(tmp_path, sft_model):
    """PPO (a critic: two updates and two optimizer steps a minibatch), 2 iterations, a checkpoint
    and an evaluation each: every phase has time in the row it belongs to, the trainer's phases fit
    inside ``time/forward_backward_s``, and ``perf/update_tokens`` counts the batch's real tokens once
    per epoch, with the share of padding the micro-batches carried beside it."""
    from tests.trainers.conftest import tiny_rl_config
    from trainers.compose import build_trainer

    cfg = tiny_rl_config(tmp_path / "run", "ppo", sft_model, iterations=2, eval_every=1, eval_tasks=2)
    cfg.algorithm.ppo_epochs = 2
    cfg.scale.max_tokens_per_microbatch = 256
    tr = build_trainer(cfg)
    tr.setup()
    batches, score = [], tr.score
    tr.score = lambda trajs: batches.append(score(trajs)) or batches[-1]
    try:
        tr.train()
    finally:
        tr.cleanup()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and len(batches) == 2
    for i, (r, b) in enumerate(zip(rows, batches)):
        for k in ("score", "advantages", "update", "optimizer", "sync", "eval"):
            assert r[f"time/{k}_s"] > 0, (i, k)
        inside = sum(r[f"time/{k}_s"] for k in ("score", "advantages", "update", "optimizer"))
        assert inside <= r["time/forward_backward_s"] + 1e-6
        assert r["perf/update_tokens"] == 2 * float(b.attention_mask.sum())
        # Every episode is longer than half the 256-token budget, so each micro-batch holds one row,
        # trimmed to its length: 4 micro-batches a minibatch of 4, and no padding at all.
        assert min(b.attention_mask.sum(-1)) > 128
        assert r["perf/microbatches"] == 4 and r["perf/update_padding_frac"] == 0.0
    # Logging and the checkpoint run after their row is assembled: the first row has none, the
    # second reports the first iteration's.
    assert rows[0]["time/log_s"] == 0.0 and rows[0]["time/checkpoint_s"] == 0.0
    assert rows[1]["time/log_s"] > 0 and rows[1]["time/checkpoint_s"] > 0
