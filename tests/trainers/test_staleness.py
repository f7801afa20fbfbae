"""``rollout.max_staleness: 1``: the next iteration's rollout runs while this one trains, on the weights
before the update, and the loss weights its tokens by truncated proximal/behaviour ratios."""

import json
import math
import threading
import time

import pytest
import torch

from tests.trainers.conftest import tiny_rl_config
from trainers import algos
from trainers.compose import build_trainer, check
from trainers.config import ConfigError, from_dict
from trainers.sources import LocalRollout

pytestmark = pytest.mark.timeout(600)


def test_decoupled_loss_by_hand():
    # One row, four tokens, the last off the mask. Per token: w = min(exp(old - behaviour), 2),
    # ratio = exp(new - old), L = w * max(-A * ratio, -A * clip(ratio, 0.8, 1.2)).
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    behaviour = torch.tensor([[-math.log(1.5), -math.log(3.0), math.log(2.0), 0.0]])
    new = torch.tensor([[math.log(1.1), math.log(1.5), math.log(0.5), 0.0]])
    adv = torch.tensor([[1.0, 1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w, wm = algos.behaviour_weights(old, behaviour, mask, cap=2.0)
    # token 0: exp(log 1.5) = 1.5; token 1: exp(log 3) = 3, truncated to 2; token 2: exp(-log 2) = 0.5;
    # token 3 is off the mask: weight 1.
    assert torch.allclose(w, torch.tensor([[1.5, 2.0, 0.5, 1.0]]))
    assert float(wm["policy/is_weight_max"]) == pytest.approx(3.0)
    assert float(wm["policy/is_truncated_frac"]) == pytest.approx(1 / 3)
    assert float(wm["policy/is_weight_mean"]) == pytest.approx((1.5 + 2.0 + 0.5) / 3)
    loss, m = algos.policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2, behaviour_weights=w)
    # token 0: ratio 1.1 inside the clip: max(-1.1, -1.1) = -1.1, times 1.5 = -1.65
    # token 1: ratio 1.5: max(-1.5, -1.2) = -1.2, times 2 = -2.4
    # token 2: ratio 0.5, A = -2: max(1.0, 2 * 0.8 = 1.6) = 1.6, times 0.5 = 0.8
    # token-mean over the 3 masked tokens: (-1.65 - 2.4 + 0.8) / 3
    assert float(loss) == pytest.approx((-1.65 - 2.4 + 0.8) / 3, abs=1e-6)
    plain, _ = algos.policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert float(plain) == pytest.approx((-1.1 - 1.2 + 1.6) / 3, abs=1e-6)
    # The weight carries no gradient: d loss / d new is the plain surrogate's times w.
    new_g = new.clone().requires_grad_(True)
    algos.policy_loss(new_g, old, adv, mask, behaviour_weights=w.requires_grad_(True))[0].backward()
    # token 0 is unclipped: d(-A * w * exp(new - old)) / d new = -1 * 1.5 * 1.1 / 3 (token mean)
    assert float(new_g.grad[0, 0]) == pytest.approx(-1.5 * 1.1 / 3, abs=1e-6)
    assert float(new_g.grad[0, 1]) == 0.0  # clipped: no gradient
    with pytest.raises(ValueError, match="cap must be >= 1"):
        algos.behaviour_weights(old, behaviour, mask, cap=0.5)


def test_staleness_config_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="rollout.max_staleness must be 0"):
        from_dict({"rollout": {"env_id": "AgentR1/FactChain-v0", "max_staleness": 2}})
    with pytest.raises(ConfigError, match="tis_cap must be >= 1"):
        from_dict({"rollout": {"env_id": "AgentR1/FactChain-v0"}, "algorithm": {"tis_cap": 0.5}})
    with pytest.raises(ConfigError, match="does not combine with scale.fsdp"):
        check(from_dict({"rollout": {"env_id": "AgentR1/FactChain-v0", "max_staleness": 1}, "scale": {"fsdp": True}}))


def _checksum(module: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in module.parameters()))


class RecordingRollout(LocalRollout):
    """LocalRollout that records, for each collect, when it ran, in which thread, and a checksum of
    the weights it samples with."""

    log: list = []

    def collect(self, task_indices, group_size, sampling, seed, offset=0):
        start = time.perf_counter()
        weights = _checksum(self.backend.model)
        out = super().collect(task_indices, group_size, sampling, seed, offset)
        RecordingRollout.log.append(
            {"start": start, "end": time.perf_counter(), "weights": weights, "thread": threading.current_thread().name}
        )
        return out


@pytest.mark.parametrize("staleness", [0, 1])
def test_overlapped_rollout_is_at_most_one_version_old(tmp_path, sft_model, staleness):
    iterations = 3
    cfg = tiny_rl_config(tmp_path / "run", "grpo", sft_model, iterations=iterations, eval_every=100)
    cfg.rollout.max_staleness = staleness
    RecordingRollout.log = []
    tr = build_trainer(cfg, rollout=RecordingRollout)
    tr.setup()
    versions = [_checksum(tr.policy)]  # the learner's weights after 0, 1, 2... updates
    updates = []
    orig = tr.update

    def update(batch, it):
        t0 = time.perf_counter()
        out = orig(batch, it)
        updates.append((t0, time.perf_counter()))
        versions.append(_checksum(tr.policy))
        return out

    tr.update = update
    tr.train()
    # The last iteration's evaluation sampled from the learner's final weights, not the sampler's older copy.
    assert _checksum(tr.backend.model) == pytest.approx(versions[-1], rel=0, abs=1e-9)
    tr.cleanup()
    log = RecordingRollout.log
    assert len(log) == iterations  # one rollout per iteration, none wasted
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    staleness_seen = [r["rollout/staleness_max"] for r in recs]
    assert all(s <= staleness for s in staleness_seen)
    for it, r in enumerate(recs):
        version = int(r["rollout/policy_version"])
        # The rollout of iteration `it` sampled with exactly the learner's weights of that version.
        assert log[it]["weights"] == pytest.approx(versions[version], rel=0, abs=1e-9)
        assert it - version == r["rollout/staleness_max"]
        for rec in (
            json.loads(x) for x in (tmp_path / "run" / "trajectories" / f"iter_{it:05d}.jsonl").read_text().splitlines()
        ):
            assert rec["policy_version"] == version and rec["staleness"] == it - version
    if staleness == 0:
        assert staleness_seen == [0.0] * iterations
        assert "policy/is_weight_mean" not in recs[1]
        assert all(e["thread"] == "MainThread" for e in log)
        for it in range(1, iterations):  # each rollout starts after the previous update ended
            assert log[it]["start"] >= updates[it - 1][1]
    else:
        assert staleness_seen == [0.0] + [1.0] * (iterations - 1)
        assert all(e["thread"].startswith("rollout") for e in log[1:])
        for it in range(1, iterations):  # rollout it ran while update it-1 did
            assert log[it]["start"] < updates[it - 1][1]
            assert log[it]["weights"] != pytest.approx(versions[it], rel=0, abs=1e-9)  # not the newest weights
        # Stale tokens are weighted: proximal (recomputed after the update) over behaviour differs from 1.
        assert recs[0]["policy/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert any(abs(r["policy/is_weight_mean"] - 1.0) > 1e-4 for r in recs[1:])
        assert all(0.0 <= r["policy/is_truncated_frac"] <= 1.0 for r in recs)


def test_stale_trainer_loss_uses_the_behaviour_weights(tmp_path, sft_model):
    cfg = tiny_rl_config(tmp_path / "run", "grpo", sft_model, iterations=1)
    cfg.rollout.max_staleness = 1
    tr = build_trainer(cfg)
    tr.setup()
    try:
        trajs, _ = tr.rollout(0)
        batch = tr.score(trajs)
        tr.compute_advantages(batch)
        # Pretend the sampler was an older policy: shift its log-probs on the agent's tokens.
        shift = 0.3 * batch.loss_mask
        batch.sampler_logprobs = batch.old_logprobs - shift  # proximal / behaviour = e^0.3 on every agent token
        batch.behaviour_weights, _ = algos.behaviour_weights(
            batch.old_logprobs, batch.sampler_logprobs, batch.loss_mask, cfg.algorithm.tis_cap
        )
        with torch.no_grad():
            loss, _ = tr.policy_loss(batch)
            lp = batch.old_logprobs  # the policy is unchanged since scoring: ratio 1, so L = -A * w per token
            expect = (-(batch.advantages * math.exp(0.3)) * batch.loss_mask).sum() / batch.loss_mask.sum()
        assert torch.allclose(lp, batch.old_logprobs)
        assert float(loss) == pytest.approx(float(expect), rel=1e-4, abs=1e-6)
    finally:
        tr.cleanup()


class FailingRollout(LocalRollout):
    """Fails on its third collect (iteration 2's rollout, which runs in the background)."""

    calls = 0

    def collect(self, *args, **kwargs):
        FailingRollout.calls += 1
        if FailingRollout.calls == 3:
            raise RuntimeError("tool service down")
        return super().collect(*args, **kwargs)


def test_background_rollout_error_surfaces_and_stop_waits_for_the_rollout_in_flight(tmp_path, sft_model):
    cfg = tiny_rl_config(tmp_path / "fail", "grpo", sft_model, iterations=4, eval_every=100)
    cfg.rollout.max_staleness = 1
    FailingRollout.calls = 0
    tr = build_trainer(cfg, rollout=FailingRollout)
    tr.setup()
    with pytest.raises(RuntimeError, match="tool service down"):
        tr.train()  # raised in the rollout thread, re-raised in the loop at iteration 2
    tr.cleanup()
    recs = [json.loads(x) for x in (tmp_path / "fail" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1]
    assert (tmp_path / "fail" / "checkpoints" / "iter_00001" / "state.pt").exists()

    # A stop (Ctrl-C, max_minutes) during iteration 1's update: the run ends after it with a
    # checkpoint; iteration 2's rollout, already in flight, is waited for at cleanup, not killed.
    cfg = tiny_rl_config(tmp_path / "stop", "grpo", sft_model, iterations=5, eval_every=100)
    cfg.rollout.max_staleness = 1
    RecordingRollout.log = []
    tr = build_trainer(cfg, rollout=RecordingRollout)
    tr.setup()
    orig = tr.update

    def update(batch, it):
        if it == 1:
            tr._stop = True
        return orig(batch, it)

    tr.update = update
    tr.train()
    tr.cleanup()
    recs = [json.loads(x) for x in (tmp_path / "stop" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1]
    assert len(RecordingRollout.log) == 3  # iteration 2's rollout ran to its end
    assert (tmp_path / "stop" / "checkpoints" / "iter_00001" / "state.pt").exists()


@pytest.mark.timeout(600)
def test_overlapped_rollout_on_a_ray_worker_matches_the_in_process_one(tmp_path, sft_model):
    """``max_staleness: 1`` with ``rollout_workers: 1``: the background rollout runs on the Ray
    worker (a blocking collect in the rollout thread; the weights are pushed only when no rollout is
    in flight). Three iterations give the in-process staleness-1 run's trajectories token for token
    and its sampler log-probs (that run is checked against the learner's weight versions above), and
    those log-probs differ from a staleness-0 run's from iteration 1 on: the worker sampled the
    one-version-old weights, not the newest."""
    pytest.importorskip("ray", reason="Ray is in the scale extra")

    def run(name, staleness, **kw):
        cfg = tiny_rl_config(tmp_path / name, "grpo", sft_model, iterations=3, **kw)
        cfg.rollout.max_staleness = staleness
        tr = build_trainer(cfg)
        tr.setup()
        seen, orig = [], tr.score  # every iteration's batch is scored once, in order, whoever collected it

        def score(trajs):
            seen.append(trajs)
            return orig(trajs)

        tr.score = score
        try:
            tr.train()
        finally:
            tr.cleanup()
        recs = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return seen, recs

    fresh, _ = run("fresh", 0)
    ref, ref_recs = run("inproc", 1)
    got, recs = run("ray", 1, rollout_workers=1, rollout_timeout_s=300)
    assert (
        [r["rollout/staleness_max"] for r in recs] == [r["rollout/staleness_max"] for r in ref_recs] == [0.0, 1.0, 1.0]
    )
    assert [r["rollout/policy_version"] for r in recs] == [0.0, 0.0, 1.0]
    assert (
        all(r["rollout/worker_restarts"] == 0 for r in recs) and "rollout/worker_restarts" not in ref_recs[0]
    )  # Ray ran it

    def same(a, b):  # token for token, with the same sampler log-probs
        return [(t.episode.token_ids, t.episode.loss_mask, t.group) for t in a] == [
            (t.episode.token_ids, t.episode.loss_mask, t.group) for t in b
        ] and all(
            torch.allclose(torch.tensor(x.sampler_logprobs), torch.tensor(y.sampler_logprobs), atol=1e-5)
            for x, y in zip(a, b)
        )

    for it in range(3):
        assert same(got[it], ref[it]), f"iteration {it} differs"
    # Iteration 1 of the staleness-0 run sampled with weights 1 from the same seeds: its log-probs
    # differ, so a worker that had sampled with the newest weights would have failed the match above.
    assert same(fresh[0], ref[0]) and not same(fresh[1], ref[1])
