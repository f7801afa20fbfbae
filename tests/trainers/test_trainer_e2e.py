"""A few PPO and GRPO iterations on the tiny model, end to end."""

import gc
import json

import pytest
import torch

from tests.trainers.conftest import tiny_rl_config
from trainers.compose import build_trainer
from trainers.rollout import build_batch
from trainers.trainer import NonFiniteLossError


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_every_parameter_changes_and_masks_are_the_actions(tmp_path, sft_model, algo):
    # "same" repeats the eval env's settings (eval_env_kwargs defaults to the test split): greedy
    # evaluation is deterministic, so its metrics must equal eval/*'s.
    cfg = tiny_rl_config(
        tmp_path / algo,
        algo,
        sft_model,
        eval_sets={"same": {"split": "test"}, "fresh_kb": {"split": "test", "kb_seed": 1000}},
    )
    tr = build_trainer(cfg)
    tr.setup()
    before = {k: v.detach().clone() for k, v in tr.policy.named_parameters()}
    critic_before = {k: v.detach().clone() for k, v in tr.critic.named_parameters()} if tr.critic else {}
    # Check the masks on one rollout before training.
    trajs, _ = tr.rollout(0)
    batch = build_batch(trajs, tr.pad_id)
    for i, t in enumerate(trajs):
        expect = torch.zeros(batch.input_ids.shape[1])
        for s, e in t.episode.step_spans:
            expect[s:e] = 1
        assert torch.equal(batch.loss_mask[i], expect)
        assert torch.equal(batch.input_ids[i, : len(t.episode.token_ids)], torch.tensor(t.episode.token_ids))
    frozen_before = gc.get_freeze_count()
    last = tr.train()
    assert gc.get_freeze_count() > frozen_before  # gc_freeze (default): set-up's objects frozen
    tr.cleanup()
    assert gc.get_freeze_count() == frozen_before  # and given back at cleanup
    assert last["perf/gc_frozen_objects"] > 0 and last["perf/gc_s"] >= last["perf/gc_full_s"] >= 0
    assert last["perf/gc_collections"] >= last["perf/gc_full_collections"] >= 0
    for k, v in tr.policy.named_parameters():
        assert not torch.equal(v, before[k]), f"policy parameter {k} did not change"
    for k, v in tr.critic.named_parameters() if tr.critic else []:
        assert not torch.equal(v, critic_before[k]), f"critic parameter {k} did not change"
    recs = [json.loads(x) for x in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1, 2]
    for r in recs:
        assert all(v == v and abs(v) != float("inf") for v in r.values() if isinstance(v, float)), r
    assert "policy/loss" in last and ("value/loss" in last) == (algo == "ppo")
    assert (tmp_path / algo / "curves.png").exists() and (
        tmp_path / algo / "trajectories" / "iter_00000.jsonl"
    ).exists()
    evals = {k: v for k, v in last.items() if k.startswith("eval/") and k.count("/") == 1}
    assert evals and all(last[k.replace("eval/", "eval/same/")] == v for k, v in evals.items())
    # A rate over the eval tasks: k / n exactly (its value depends on what 3 iterations learned).
    n = cfg.eval.tasks
    assert last["eval/fresh_kb/success_rate"] * n == pytest.approx(round(last["eval/fresh_kb/success_rate"] * n))
    assert last["eval/fresh_kb/success_rate"] <= last["eval/fresh_kb/answered_rate"]
    # The backend's log-probs and the trainer's recomputation agree.
    assert last["train/logprob_mismatch_max"] < 1e-3


def test_nonfinite_loss_stops_with_a_checkpoint(tmp_path, sft_model):
    # A KL term in the loss keeps every update's forward (an update whose advantages are all 0 and that
    # has no KL or entropy term is skipped whole, and would never compute the poisoned loss): without
    # it the test depended on whether iteration 2's groups happened to have a reward spread.
    cfg = tiny_rl_config(tmp_path / "nan", "grpo", sft_model, iterations=4, kl_coef=0.05)
    tr = build_trainer(cfg)
    tr.setup()
    orig = tr.update

    def poisoned(batch, it):
        if it == 2:
            with torch.no_grad():
                next(tr.policy.parameters()).fill_(float("nan"))
        return orig(batch, it)

    tr.update = poisoned
    with pytest.raises(NonFiniteLossError, match="loss is nan at iteration 2") as err:
        tr.train()
    tr.cleanup()
    assert "iter_00001" in str(err.value)
    assert (tmp_path / "nan" / "checkpoints" / "iter_00001" / "state.pt").exists()


def test_missing_model_path_fails_clearly(tmp_path):
    cfg = tiny_rl_config(tmp_path / "x", "grpo", str(tmp_path / "no_such_model"))
    from trainers.models import ModelLoadError

    with pytest.raises(ModelLoadError, match="does not exist"):
        build_trainer(cfg).setup()
