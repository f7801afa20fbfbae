"""DAPO's dynamic sampling (``algorithm.dynamic_sampling``) and the skipped void update: which groups
are dropped, how the batch is refilled, the loss over the kept tokens by hand, and bit-identity
with the plain trainer when no group is dropped."""

import json

import pytest
import torch

from tests.trainers.conftest import tiny_rl_config
from trainers import algos
from trainers.compose import build_trainer, check
from trainers.config import ConfigError, from_dict

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
        adv, _, _ = algos.grpo(
            token_rewards=r[rows], loss_mask=m[rows], values=None, group_ids=groups[rows], gamma=1.0, lam=1.0
        )
        return float(algos.policy_loss(lp[rows], lp[rows], adv, m[rows])[0]), adv

    # Group 0: scores 1 and 0, mean 0.5, unbiased std sqrt(0.5): A = +-0.5 / (sqrt(0.5) + 1e-6).
    a = 0.5 / (0.5**0.5 + 1e-6)
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
        adv, _, _ = algos.grpo(
            token_rewards=r[rows], loss_mask=m[rows], values=None, group_ids=groups[rows], gamma=1.0, lam=1.0
        )
        algos.policy_loss(new, lp[rows], adv, m[rows])[0].backward()
        assert new.grad[0].tolist() == pytest.approx([-a / n_tokens] * 3, rel=1e-6)


def test_dynamic_sampling_config_is_checked():
    base = {"rollout": {"env_id": "AgentR1/FactChain-v0"}}
    with pytest.raises(ConfigError, match="adv_estimator: 'gae', which has no groups"):
        check(from_dict({**base, "algorithm": {"algo": "ppo", "dynamic_sampling": True}}))
    with pytest.raises(ConfigError, match="does not combine with rollout.max_staleness: 1"):
        check(
            from_dict(
                {
                    "rollout": {"env_id": "AgentR1/FactChain-v0", "max_staleness": 1},
                    "algorithm": {"algo": "grpo", "dynamic_sampling": True},
                }
            )
        )
    with pytest.raises(ConfigError, match="does not combine with rollout.workers: 2"):
        check(
            from_dict(
                {
                    "rollout": {"env_id": "AgentR1/FactChain-v0", "workers": 2},
                    "algorithm": {"algo": "grpo", "dynamic_sampling": True},
                }
            )
        )
    with pytest.raises(ConfigError, match="dynamic_sampling_max_extra must be >= 0"):
        from_dict({**base, "algorithm": {"algo": "grpo", "dynamic_sampling": True, "dynamic_sampling_max_extra": -1}})
    cfg = from_dict({**base, "algorithm": {"algo": "rloo", "dynamic_sampling": True, "dynamic_sampling_max_extra": 0}})
    assert cfg.algorithm.dynamic_sampling and cfg.algorithm.dynamic_sampling_max_extra == 0


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train(cfg):
    tr = build_trainer(cfg)
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


def _first_seed(tmp_path, sft_model, want, **kw):
    """The first seed (of 0..5) whose plain first batch has ``want(zero_std_group_frac)``, and that
    batch's record: the tests below need a batch with void groups, or one without, and which seed
    gives one depends on the SFT fixture's weights."""
    for seed in range(6):
        d = tmp_path / f"plain{seed}"
        _train(tiny_rl_config(d, "grpo", sft_model, iterations=1, seed=seed, **kw))
        rec = _records(d)[0]
        if want(rec["adv/zero_std_group_frac"]):
            return seed, rec
    raise AssertionError("no seed of 0..5 gave the batch this test needs")


def test_drop_and_refill(tmp_path, sft_model):
    # 4 tasks x 2: a seed whose plain first batch has void groups, so dynamic sampling must drop
    # them and refill.
    seed, p0 = _first_seed(tmp_path, sft_model, lambda frac: frac > 0)
    cfg = tiny_rl_config(tmp_path / "run", "grpo", sft_model, iterations=2, seed=seed)
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
    # The first round is the plain batch: its void groups were dropped, and a refill followed.
    assert recs[0]["dynamic/dropped_groups"] >= 4 * p0["adv/zero_std_group_frac"] and recs[0]["dynamic/rounds"] >= 1
    # The rollout metrics are the first round's (the iteration's own tasks), as without dynamic sampling.
    assert recs[0]["rollout/reward_mean"] == p0["rollout/reward_mean"]


def test_no_drop_is_bit_identical_to_the_plain_trainer(tmp_path, sft_model):
    # 2 tasks x 4: a seed whose first batch has a spread in every group.
    seed, _ = _first_seed(tmp_path, sft_model, lambda frac: frac == 0, tasks_per_iter=2, group_size=4)
    runs = {}
    for dyn in (False, True):
        cfg = tiny_rl_config(
            tmp_path / str(dyn), "grpo", sft_model, iterations=1, seed=seed, tasks_per_iter=2, group_size=4
        )
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
    tr = build_trainer(cfg)
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
        tr = build_trainer(cfg)
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
    tr = build_trainer(cfg)
    tr.setup()
    tr.train()
    assert tr.opt.state != {}  # the entropy term has a gradient: the step was taken
    tr.cleanup()
    assert _records(tmp_path / "run")[0]["update/skipped"] == 0.0


# -- overlong handling (algorithm.overlong) ---------------------------------------------------------


def test_soft_overlong_penalty_by_hand():
    # L_max 10, L_cache 4: 0 up to 6 tokens, then (6 - n) / 4 down to -1 at 10, -1 past it.
    n = torch.tensor([0, 6, 7, 8, 10, 11, 100])
    got = algos.soft_overlong_penalty(n, max_tokens=10, buffer=4)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    with pytest.raises(ValueError, match="0 < buffer <= max_tokens"):
        algos.soft_overlong_penalty(n, max_tokens=4, buffer=5)


def _traj(n_agent, reward, reason, group):
    """A hand-built two-turn episode: 2 prompt tokens, then per turn n_agent agent tokens and one env token."""
    from agent_gym.episode import Episode
    from trainers.rollout import Trajectory

    ids, mask, spans = [1, 2], [0, 0], []
    for _ in range(2):
        spans.append([len(ids), len(ids) + n_agent])
        ids += [5] * n_agent + [9]
        mask += [1] * n_agent + [0]
    ep = Episode(
        token_ids=ids,
        loss_mask=mask,
        prompt_len=2,
        step_spans=spans,
        step_rewards=[0.0, reward],
        step_reward_components=[{}, {"em": reward}],
        step_call_statuses=[[], []],
        task_id="t",
        task_index=0,
        answer=None if reason else "x",
        answer_scores={},
        success=False,
        truncation_reason=reason,
    )
    return Trajectory(ep, [0.0] * len(ids), group)


def _trainer(tmp_path, sft_model, **algorithm):
    cfg = tiny_rl_config(tmp_path / "run", "grpo", sft_model, iterations=1)
    for k, v in algorithm.items():
        setattr(cfg.algorithm, k, v)
    cfg.algorithm.check()
    return build_trainer(cfg)  # not set up: only its batch arithmetic is used


def test_overlong_mask_and_soft_penalty_by_hand(tmp_path, sft_model):
    from trainers.rollout import build_batch
    from trainers.trainer import overlong_shaping

    # Group 0: an answer (reward 1, 3+3 agent tokens) and an episode cut at the context (reward 0).
    # Group 1: an answer of 5+5 agent tokens (reward 1) and one cut by max_turns (2+2, reward 0.5).
    trajs = [_traj(3, 1.0, None, 0), _traj(3, 0.0, "context", 0), _traj(5, 1.0, None, 1), _traj(2, 0.5, "max_turns", 1)]
    a = 0.5 / (0.5**0.5 + 1e-6)  # GRPO on two scores 1 apart: +-0.5 / (std sqrt(0.5) + eps)
    a2 = 0.25 / (0.125**0.5 + 1e-6)  # and 0.5 apart: +-0.25 / (std sqrt(0.125) + eps)

    tr = _trainer(tmp_path, sft_model, overlong="mask")
    batch = build_batch(trajs, 0)
    tr._overlong_metrics, tr._overlong_rows = overlong_shaping(batch, trajs, tr.cfg.algorithm)
    m = tr.compute_advantages(batch)
    assert m["overlong/masked_frac"] == 0.5
    # The truncated rows counted in their groups' statistics (row 0's advantage is +a, not 0) but
    # carry no loss now; the answered rows keep theirs.
    assert batch.loss_mask[1].sum() == 0 and batch.loss_mask[3].sum() == 0
    assert batch.loss_mask[0].sum() == 6 and batch.loss_mask[2].sum() == 10
    assert float(batch.advantages[0, 2]) == pytest.approx(a, rel=1e-6)
    assert float(batch.advantages[2, 2]) == pytest.approx(a2, rel=1e-6)  # 1 against 0.5

    # soft, L_max 10, L_cache 4: row 0 has 6 agent tokens (no penalty), row 1 6 (none), row 2 10
    # (-1), row 3 4 (none). Group 1's scores become 1 - 1 = 0 and 0.5: row 2 is now the worse one.
    tr = _trainer(tmp_path, sft_model, overlong="soft", overlong_max_tokens=10, overlong_buffer=4)
    batch = build_batch(trajs, 0)
    tr._overlong_metrics, tr._overlong_rows = overlong_shaping(batch, trajs, tr.cfg.algorithm)
    assert float(batch.token_rewards[2].sum()) == pytest.approx(0.0)
    assert float(batch.token_rewards[2, 2 + 5 + 1 + 4]) == pytest.approx(
        0.0
    )  # the penalty sits on the last agent token
    m = tr.compute_advantages(batch)
    assert m["overlong/penalty_mean"] == pytest.approx(-0.25) and m["overlong/penalized_frac"] == 0.25
    assert float(batch.advantages[2, 2]) == pytest.approx(-a2, rel=1e-6)
    assert batch.loss_mask.sum() == 6 + 6 + 10 + 4  # soft masks nothing


def test_overlong_config_is_checked():
    base = {"rollout": {"env_id": "AgentR1/FactChain-v0"}}
    with pytest.raises(ConfigError, match="overlong: soft needs overlong_max_tokens"):
        check(from_dict({**base, "algorithm": {"overlong": "soft", "overlong_max_tokens": 100}}))
    with pytest.raises(ConfigError, match="apply to overlong: soft only"):
        check(from_dict({**base, "algorithm": {"overlong": "mask", "overlong_buffer": 10}}))
    with pytest.raises(ConfigError, match="overlong"):
        from_dict({**base, "algorithm": {"overlong": "drop"}})


def test_overlong_mask_in_a_run(tmp_path, sft_model):
    # One turn only: the tiny model's first turn is a lookup, so most episodes end at max_turns.
    cfg = tiny_rl_config(tmp_path / "run", "grpo", sft_model, iterations=1, entropy_coef=0.01)
    cfg.rollout.env_kwargs["max_turns"] = 1
    cfg.algorithm.overlong = "mask"
    tr = build_trainer(cfg)
    tr.setup()
    seen = []
    orig = tr.update
    tr.update = lambda batch, it: (seen.append(batch.loss_mask.sum(-1).tolist()), orig(batch, it))[1]
    tr.train()
    tr.cleanup()
    rec = _records(tmp_path / "run")[0]
    assert rec["overlong/masked_frac"] > 0
    masked = [n == 0 for n in seen[0]]
    assert sum(masked) / len(masked) == rec["overlong/masked_frac"]
