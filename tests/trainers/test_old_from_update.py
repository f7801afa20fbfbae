"""The old log-probs from the update's own forward (``Trainer.old_from_update``): with a single
optimizer step on the batch, the scoring pass is skipped and the update's forward, detached, is the
recomputation. The run must equal the one with the scoring pass (weights and logged losses), and
the conditions that need a separate pass must keep it."""

import json

import pytest
import torch

from tests.trainers.conftest import tiny_rl_config
from trainers.compose import build_trainer
from trainers.trainer import Trainer

pytestmark = pytest.mark.timeout(600)


def _run(run_dir, sft_model, monkeypatch, separate: bool, **kw):
    """Two GRPO iterations (one minibatch of the 8 rows, one epoch); ``separate`` forces the scoring
    pass. Returns the trained weights, the logged rows and how many scoring passes ran."""
    cfg = tiny_rl_config(run_dir, "grpo", sft_model, iterations=2, minibatch_size=8, **kw)
    with monkeypatch.context() as mp:
        if separate:
            mp.setattr(Trainer, "old_from_update", lambda self, rows: False)
        tr = build_trainer(cfg)
        tr.setup()
        passes = []
        rows = tr._rows
        mp.setattr(tr, "_rows", lambda *a: passes.append(1) or rows(*a))
        tr.train()
        weights = [p.detach().clone() for p in tr.policy.parameters()]
        tr.cleanup()
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return weights, recs, len(passes)


def test_update_forward_gives_the_old_logprobs(tmp_path, sft_model, monkeypatch):
    w_sep, r_sep, n_sep = _run(tmp_path / "separate", sft_model, monkeypatch, separate=True)
    w_one, r_one, n_one = _run(tmp_path / "one", sft_model, monkeypatch, separate=False)
    assert n_sep == 2 and n_one == 0  # a scoring pass per iteration, or none
    # Both updates were real (reward spread in the tiny FactChain batches) and equal: the
    # recomputation is the same forward of the same weights, up to float rounding.
    assert [r["update/skipped"] for r in r_one] == [0.0, 0.0]
    for a, b in zip(w_sep, w_one):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for a, b in zip(r_sep, r_one):
        assert a["policy/loss"] == pytest.approx(b["policy/loss"], abs=1e-5)
        # The sampler's log-probs against the trainer's: the HF backend is the same module (~1e-6).
        assert b["train/logprob_mismatch_mean"] == pytest.approx(a["train/logprob_mismatch_mean"], abs=1e-5)
        assert b["train/logprob_mismatch_max"] < 1e-3
    assert r_one[0]["policy/clipfrac"] == 0.0  # ratio exactly 1: nothing to clip
    assert [r["train/old_from_update"] for r in r_one] == [1.0, 1.0]
    assert [r["train/old_from_update"] for r in r_sep] == [0.0, 0.0]


@pytest.mark.parametrize(
    "change",
    [
        {"ppo_epochs": 2},  # a second epoch runs weights that did not sample the batch
        {"minibatch_size": 4},  # so does the second minibatch
        {"kl_coef": 0.1},  # a reference model: its KL may enter the rewards before the update
        {"behaviour_weight": "tis"},  # the weights come from the old log-probs before the update
        {"recompute_logprobs": False},  # the sampler's own log-probs are the old ones
    ],
)
def test_cases_that_keep_the_scoring_pass(tmp_path, sft_model, change):
    kw = {"minibatch_size": 8, **change}
    cfg = tiny_rl_config(tmp_path, "grpo", sft_model, iterations=1, **kw)
    tr = build_trainer(cfg)
    tr.setup()
    try:
        assert not tr.old_from_update(8)
    finally:
        tr.cleanup()


def test_plain_grpo_takes_them_from_the_update(tmp_path, sft_model):
    tr = build_trainer(tiny_rl_config(tmp_path, "grpo", sft_model, iterations=1, minibatch_size=8))
    tr.setup()
    try:
        assert tr.old_from_update(8) and not tr.old_from_update(9)
    finally:
        tr.cleanup()
