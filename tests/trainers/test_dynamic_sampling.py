"""DAPO's dynamic sampling (``algorithm.dynamic_sampling``) and the skipped void update: which groups
are dropped, how the batch is refilled, the loss over the kept tokens by hand, and bit-identity
with the plain trainer when no group is dropped."""

import json

import pytest
import torch

from tests.trainers.conftest import tiny_rl_config
from trainers import algos
from trainers.config import ConfigError, from_dict
from trainers.trainer import Trainer

pytestmark = pytest.mark.timeout(600)


def test_group_spread_by_hand():
    # Three groups of two rows, rewards on the last agent token. Group 0: 1 and 0 (a spread);
    # group 1: 0.5 and 0.5 (none); group 2: 0.3 = 0.1 + 0.2 against 0.3 in one token (equal up to
    # rounding: none, as grpo judges it).
    r = torch.zeros(6, 4)
    m = torch.tensor([[0, 1, 1, 0]] * 6, dtype=torch.float32)
    r[0, 2], r[1, 2] = 1.0, 0.0
    r[2, 2], r[3, 2] = 0.5, 0.5
    r[4, 1], r[4, 2], r[5, 2] = 0.1, 0.2, 0.3
    r[1, 3] = 7.0  # off the mask: not part of the score
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    spread = algos.group_spread(r, m, groups)
    assert spread.tolist() == [True, True, False, False, False, False]
    adv, _, met = algos.grpo(token_rewards=r, loss_mask=m, values=None, group_ids=groups, gamma=1.0, lam=1.0)
    # Where there is no spread grpo's advantage is exactly 0; where there is, it is not.
    assert bool((adv[~spread] == 0).all()) and bool((adv[spread][:, 1:3] != 0).all())
    assert float(met["adv/zero_std_group_frac"]) == pytest.approx(4 / 6)


def test_loss_over_the_kept_groups_by_hand():
    # Two groups of two rows, three agent tokens each; group 1 is void (both score 1). Old and new
    # log-probs are equal (ratio 1), so the clipped surrogate of a token is -A.
    r = torch.zeros(4, 3)
    r[0, 2], r[1, 2], r[2, 2], r[3, 2] = 1.0, 0.0, 1.0, 1.0
    m = torch.ones(4, 3)
    groups = torch.tensor([0, 0, 1, 1])
    lp = torch.zeros(4, 3)

    def loss_of(rows):
        adv, _, _ = algos.grpo(token_rewards=r[rows], loss_mask=m[rows], values=None, group_ids=groups[rows],
                               gamma=1.0, lam=1.0)
        return float(algos.policy_loss(lp[rows], lp[rows], adv, m[rows])[0]), adv

    # Group 0: scores 1 and 0, mean 0.5, unbiased std sqrt(0.5): A = +-0.5 / (sqrt(0.5) + 1e-6).
    a = 0.5 / (0.5 ** 0.5 + 1e-6)
    kept = algos.group_spread(r, m, groups).nonzero().flatten()
    assert kept.tolist() == [0, 1]
    loss, adv = loss_of(kept)
    # token-mean over the 6 kept tokens: (3 * -a + 3 * a) / 6 = 0, and the advantages themselves:
    assert loss == pytest.approx(0.0, abs=1e-7)
    assert adv[0].tolist() == pytest.approx([a] * 3) and adv[1].tolist() == pytest.approx([-a] * 3)
    # The gradient is what shows the normalization: d loss / d lp of row 0's tokens is -a / 6 kept
    # tokens; with the void group left in, the same tokens get -a / 12 (its 6 zero tokens dilute).
    for rows, n_tokens in ((kept, 6), (torch.arange(4), 12)):
        new = lp[rows].clone().requires_grad_(True)
        adv, _, _ = algos.grpo(token_rewards=r[rows], loss_mask=m[rows], values=None, group_ids=groups[rows],
                               gamma=1.0, lam=1.0)
        algos.policy_loss(new, lp[rows], adv, m[rows])[0].backward()
        assert new.grad[0].tolist() == pytest.approx([-a / n_tokens] * 3, rel=1e-6)


def test_dynamic_sampling_config_is_checked():
    base = {"rollout": {"env_id": "AgentR1/FactChain-v0"}}
    with pytest.raises(ConfigError, match="adv_estimator: 'gae', which has no groups"):
        from_dict({**base, "algorithm": {"algo": "ppo", "dynamic_sampling": True}})
    with pytest.raises(ConfigError, match="does not combine with rollout.max_staleness: 1"):
        from_dict({"rollout": {"env_id": "AgentR1/FactChain-v0", "max_staleness": 1},
                   "algorithm": {"algo": "grpo", "dynamic_sampling": True}})
    with pytest.raises(ConfigError, match="does not combine with rollout.workers: 2"):
        from_dict({"rollout": {"env_id": "AgentR1/FactChain-v0", "workers": 2},
                   "algorithm": {"algo": "grpo", "dynamic_sampling": True}})
    with pytest.raises(ConfigError, match="dynamic_sampling_max_extra must be >= 0"):
        from_dict({**base, "algorithm": {"algo": "grpo", "dynamic_sampling": True, "dynamic_sampling_max_extra": -1}})
    cfg = from_dict({**base, "algorithm": {"algo": "rloo", "dynamic_sampling": True, "dynamic_sampling_max_extra": 0}})
    assert cfg.algorithm.dynamic_sampling and cfg.algorithm.dynamic_sampling_max_extra == 0


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train(cfg):
    tr = Trainer(cfg)
    tr.setup()
    seen = []
    orig = tr.update

    def update(batch, it):
        seen.append(batch.group_ids.tolist())
        return orig(batch, it)

    tr.update = update
    tr.train()
    weights = [p.detach().clone() for p in tr.policy.parameters()]
    tr.cleanup()
    return seen, weights


def test_drop_and_refill(tmp_path, sft_model):
    # Seed 4, 4 tasks x 2: the plain trainer's first batch has half its groups without a spread
    # (adv/zero_std_group_frac 0.5), so dynamic sampling must drop 2 and refill.
    cfg = tiny_rl_config(tmp_path / "run", "grpo", sft_model, iterations=2, seed=4)
    cfg.algorithm.dynamic_sampling = True
    cfg.algorithm.dynamic_sampling_max_extra = 16  # two refill rounds at most
    seen, _ = _train(cfg)
    recs = _records(tmp_path / "run")
    for r, groups in zip(recs, seen):
        rounds = r["dynamic/rounds"]
        assert r["dynamic/extra_episodes"] == 8 * rounds and rounds <= 2
        kept = int(r["dynamic/kept_groups"])
        assert kept + r["dynamic/short_groups"] == 4
        # Every group sampled is dropped, kept, or (past the 4 wanted) left out.
        assert r["dynamic/dropped_groups"] + kept <= 4 * (1 + rounds)
        # The update saw exactly the kept groups, renumbered, each of two rows, every one with a spread.
        assert groups == [g for g in range(kept) for _ in range(2)]
        assert r["adv/zero_std_group_frac"] == 0.0 and r["update/skipped"] == 0.0
        if r["dynamic/short_groups"] > 0:  # refilled as far as the cap allowed
            assert rounds == 2
    assert recs[0]["dynamic/dropped_groups"] >= 2 and recs[0]["dynamic/rounds"] >= 1
    # The rollout metrics are the first round's (the iteration's own tasks), as without dynamic sampling.
    plain = tiny_rl_config(tmp_path / "plain", "grpo", sft_model, iterations=1, seed=4)
    _train(plain)
    p0 = _records(tmp_path / "plain")[0]
    assert p0["adv/zero_std_group_frac"] == 0.5
    assert recs[0]["rollout/reward_mean"] == p0["rollout/reward_mean"]


def test_no_drop_is_bit_identical_to_the_plain_trainer(tmp_path, sft_model):
    # Seed 0, 2 tasks x 4: every group of the first batch has a spread.
    runs = {}
    for dyn in (False, True):
        cfg = tiny_rl_config(tmp_path / str(dyn), "grpo", sft_model, iterations=1, seed=0, tasks_per_iter=2,
                             group_size=4)
        cfg.algorithm.dynamic_sampling = dyn
        runs[dyn] = _train(cfg)
    rec = _records(tmp_path / "True")[0]
    assert rec["dynamic/dropped_groups"] == 0 and rec["dynamic/rounds"] == 0  # the precondition
    assert runs[True][0] == runs[False][0]
    for a, b in zip(runs[True][1], runs[False][1]):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(runs[True][1], _initial_weights(tmp_path, sft_model)))


def _initial_weights(tmp_path, sft_model):
    cfg = tiny_rl_config(tmp_path / "init", "grpo", sft_model, iterations=1)
    tr = Trainer(cfg)
    tr.setup()
    w = [p.detach().clone() for p in tr.policy.parameters()]
    tr.cleanup()
    return w


def test_void_batch_skips_the_update(tmp_path, sft_model):
    # No reward at all: every group is void. Plain GRPO skips the forward, backward and optimizer
    # step; with dynamic sampling and no refill there is no batch at all.
    for dyn in (False, True):
        cfg = tiny_rl_config(tmp_path / str(dyn), "grpo", sft_model, iterations=2)
        cfg.rollout.env_kwargs["rewards"] = {"answer_weights": {"em": 0.0}}
        cfg.algorithm.dynamic_sampling = dyn
        cfg.algorithm.dynamic_sampling_max_extra = 0
        tr = Trainer(cfg)
        tr.setup()
        tr.train()
        assert tr.opt.state == {}  # no optimizer step was taken
        assert tr.sched.last_epoch == 0
        tr.cleanup()
        recs = _records(tmp_path / str(dyn))
        assert [r["update/skipped"] for r in recs] == [1.0, 1.0]
        # The surrogate of A = 0 is exactly 0; what needs a forward (ratio, clip fraction) is not logged.
        assert all(r["policy/loss"] == 0.0 and "policy/clipfrac" not in r for r in recs)
        if dyn:
            assert [r["dynamic/kept_groups"] for r in recs] == [0.0, 0.0]
            assert [r["dynamic/dropped_groups"] for r in recs] == [4.0, 4.0]
        else:
            assert [r["adv/zero_std_group_frac"] for r in recs] == [1.0, 1.0]


def test_void_update_is_not_skipped_with_an_entropy_bonus(tmp_path, sft_model):
    cfg = tiny_rl_config(tmp_path / "run", "grpo", sft_model, iterations=1, entropy_coef=0.01)
    cfg.rollout.env_kwargs["rewards"] = {"answer_weights": {"em": 0.0}}
    tr = Trainer(cfg)
    tr.setup()
    tr.train()
    assert tr.opt.state != {}  # the entropy term has a gradient: the step was taken
    tr.cleanup()
    assert _records(tmp_path / "run")[0]["update/skipped"] == 0.0
