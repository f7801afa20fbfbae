"""Tests for trainers/algos/advantages.py.

Two layers: small cases worked out by hand in the comments (including a tool-response gap in
the mask, across which GAE must bootstrap), and every estimator checked against a plain Python
loop on seeded random rewards, values, masks and groups.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from trainers.algos import advantages as A
from trainers.algos.advantages import (
    ADV_ESTIMATORS,
    gae,
    get_adv_est,
    grpo,
    kl_in_reward,
    place_rewards,
    register_adv_est,
    reinforce_pp,
    rloo,
)

NAMES = ("gae", "grpo", "reinforce_pp", "rloo")  # the built-in ones, whose formulas are tested one by one
REGISTERED = sorted(ADV_ESTIMATORS)
"""Every registered estimator (a plugin's too, when imported before collection): the generic
contract tests below run on each; ``tests/trainers/test_plugins.py`` runs them on a plugin's."""


def close(a, b, tol=1e-5):
    return torch.allclose(
        torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol, rtol=tol
    )


def call(name, r, m, v=None, groups=None, gamma=1.0, lam=1.0, **kw):
    if groups is None:
        groups = torch.zeros(r.shape[0], dtype=torch.long)
    return get_adv_est(name)(token_rewards=r, loss_mask=m, values=v, group_ids=groups, gamma=gamma, lam=lam, **kw)


# One trajectory, T=6: [prompt | agent agent | tool-output tool-output | agent]
#   index:              0        1     2       3           4             5
# Step 1 is tokens 1-2, its process reward 0.5 sits on token 2; the outcome 1.0 on token 5.
MASK = torch.tensor([[0, 1, 1, 0, 0, 1]])
REW = torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.0, 1.0]])
VAL = torch.tensor([[9.0, 1.0, 2.0, 9.0, 9.0, 3.0]])  # the 9s on env tokens must be ignored


# ----------------------------------------------------------------------------- plain-loop references


def agent_positions(mask_row):
    return [t for t, x in enumerate(mask_row) if x]


def ref_whiten(adv, mask, eps, scale=True):
    xs = [adv[b][t] for b in range(len(adv)) for t in range(len(adv[0])) if mask[b][t]]
    if not xs:
        return adv
    mean = sum(xs) / len(xs)
    std = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return [
        [((x - mean) / (std + eps) if scale else x - mean) if mask[b][t] else 0.0 for t, x in enumerate(row)]
        for b, row in enumerate(adv)
    ]


def ref_gae(r, m, v, gamma, lam):
    B, T = len(r), len(r[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        next_v, next_a = 0.0, 0.0
        for t in reversed(agent_positions(m[b])):
            delta = r[b][t] + gamma * next_v - v[b][t]
            next_a = delta + gamma * lam * next_a
            next_v = v[b][t]
            adv[b][t] = next_a
            ret[b][t] = next_a + v[b][t]
    return adv, ret


def ref_return_to_go(r, m, gamma):
    B, T = len(r), len(r[0])
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        g = 0.0
        for t in reversed(agent_positions(m[b])):
            g = r[b][t] + gamma * g
            out[b][t] = g
    return out


def ref_scores(r, m):
    return [sum(x for x, k in zip(rr, mm) if k) for rr, mm in zip(r, m)]


def ref_grpo(r, m, groups, norm_by_std, eps):
    s = ref_scores(r, m)
    out = []
    for i, si in enumerate(s):
        members = [s[j] for j in range(len(s)) if groups[j] == groups[i]]
        mean = sum(members) / len(members)
        std = statistics.stdev(members) if len(members) > 1 else 0.0
        a = (si - mean) / (std + eps) if norm_by_std else si - mean
        out.append([a if k else 0.0 for k in m[i]])
    return out


def ref_rloo(r, m, groups):
    s = ref_scores(r, m)
    out = []
    for i, si in enumerate(s):
        others = [s[j] for j in range(len(s)) if groups[j] == groups[i] and j != i]
        a = si - sum(others) / len(others)
        out.append([a if k else 0.0 for k in m[i]])
    return out


def random_batch(seed, need_pairs=False):
    g = torch.Generator().manual_seed(seed)
    B = int(torch.randint(2, 7, (1,), generator=g))
    T = int(torch.randint(1, 12, (1,), generator=g))
    mask = torch.rand(B, T, generator=g) < 0.6
    if seed % 4 == 0:
        mask[0] = False  # a row with no agent token
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64) * (torch.rand(B, T, generator=g) < 0.3)
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    if need_pairs:  # every group has >= 2 members
        groups = torch.arange(B) // 2
        if B % 2:
            groups[-1] = groups[-2]
        groups = groups * 7 + 3  # ids need not be contiguous
    else:
        groups = torch.randint(0, 3, (B,), generator=g) * 5
    return rewards, mask, values, groups


# ----------------------------------------------------------------------------- GAE


def test_gae_bootstraps_across_tool_response_by_hand():
    adv, ret, metrics = gae(
        token_rewards=REW,
        loss_mask=MASK,
        values=VAL,
        group_ids=torch.zeros(1, dtype=torch.long),
        gamma=0.9,
        lam=0.8,
        norm_by_std=False,
    )
    # Agent tokens 1, 2, 5 with V = 1, 2, 3; the next agent token after 2 is 5 (past the tool).
    # t5: delta = 1.0 + 0.9*0 - 3        = -2.0   A5 = -2.0
    # t2: delta = 0.5 + 0.9*V(5)=2.7 - 2 =  1.2   A2 = 1.2 + 0.72*(-2.0)  = -0.24
    # t1: delta = 0.0 + 0.9*V(2)=1.8 - 1 =  0.8   A1 = 0.8 + 0.72*(-0.24) =  0.6272
    assert close(adv, [[0.0, 0.6272, -0.24, 0.0, 0.0, -2.0]])
    # returns = A + V on agent tokens: [1.6272, 1.76, 1.0]
    assert close(ret, [[0.0, 1.6272, 1.76, 0.0, 0.0, 1.0]])
    assert close(metrics["adv/values_mean"], 2.0)


def test_gae_gamma_lam_one_is_return_minus_value():
    adv, ret, _ = gae(
        token_rewards=REW,
        loss_mask=MASK,
        values=VAL,
        group_ids=torch.zeros(1, dtype=torch.long),
        gamma=1.0,
        lam=1.0,
        norm_by_std=False,
    )
    # reward-to-go [1.5, 1.5, 1.0] at tokens 1, 2, 5, minus V [1, 2, 3]
    assert close(adv, [[0.0, 0.5, -0.5, 0.0, 0.0, -2.0]])
    assert close(ret, [[0.0, 1.5, 1.5, 0.0, 0.0, 1.0]])


def test_gae_lam_zero_is_one_step_td():
    adv, _, _ = gae(
        token_rewards=REW,
        loss_mask=MASK,
        values=VAL,
        group_ids=torch.zeros(1, dtype=torch.long),
        gamma=1.0,
        lam=0.0,
        norm_by_std=False,
    )
    # A = r + V(next agent) - V: t1: 0 + 2 - 1 = 1;  t2: 0.5 + 3 - 2 = 1.5;  t5: 1 + 0 - 3 = -2
    assert close(adv, [[0.0, 1.0, 1.5, 0.0, 0.0, -2.0]])


def test_gae_whitened():
    adv, ret, _ = gae(
        token_rewards=REW, loss_mask=MASK, values=VAL, group_ids=torch.zeros(1, dtype=torch.long), gamma=1.0, lam=1.0
    )
    # raw [0.5, -0.5, -2.0]: mean -2/3, unbiased std sqrt(1.75) = 1.322876
    raw = [0.5, -0.5, -2.0]
    mu, sd = sum(raw) / 3, statistics.stdev(raw)
    exp = [(x - mu) / (sd + 1e-6) for x in raw]
    assert close(adv, [[0.0, exp[0], exp[1], 0.0, 0.0, exp[2]]])
    # returns come from the raw advantages, not the whitened ones
    assert close(ret, [[0.0, 1.5, 1.5, 0.0, 0.0, 1.0]])


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        call("gae", REW, MASK, None)


@pytest.mark.parametrize("seed", range(30))
def test_gae_matches_loop(seed):
    r, m, v, groups = random_batch(seed)
    gamma, lam = [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)][seed % 3]
    norm = seed % 2 == 0
    adv, ret, _ = gae(token_rewards=r, loss_mask=m, values=v, group_ids=groups, gamma=gamma, lam=lam, norm_by_std=norm)
    exp_adv, exp_ret = ref_gae(r.tolist(), m.tolist(), v.tolist(), gamma, lam)
    if norm:
        exp_adv = ref_whiten(exp_adv, m.tolist(), 1e-6)
    assert close(adv, exp_adv)
    assert close(ret, exp_ret)


# ----------------------------------------------------------------------------- GRPO


def grpo_example():
    # Four trajectories, T=4, two groups. Row 3 has a process reward 0.2 on its first step.
    r = torch.tensor(
        [
            [0.0, 1.0, 0.0, 0.0],  # score 1
            [0.0, 0.0, 0.0, 0.0],  # score 0
            [0.0, 0.0, 0.5, 0.0],  # score 0.5
            [0.2, 0.0, 0.3, 0.0],
        ]
    )  # score 0.2 + 0.3 = 0.5
    m = torch.tensor([[0, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 0], [1, 0, 1, 1]])
    groups = torch.tensor([4, 4, 9, 9])
    return r, m, groups


def test_grpo_by_hand():
    r, m, groups = grpo_example()
    adv, ret, metrics = grpo(token_rewards=r, loss_mask=m, values=None, group_ids=groups, gamma=1.0, lam=1.0)
    # group 4: scores 1, 0 -> mean 0.5, unbiased std sqrt(0.25+0.25) = 0.707107 -> +-0.707106
    # group 9: scores 0.5, 0.5 -> std 0 -> advantage 0 (no signal)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert close(adv, [[0, a, 0, 0], [-a, -a, -a, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert close(ret, [[0, 1, 0, 0], [0, 0, 0, 0], [0.5, 0, 0.5, 0], [0.5, 0, 0.5, 0.5]])
    assert close(metrics["adv/zero_std_group_frac"], 0.5)
    # Dr. GRPO: no division by std -> +-0.5
    adv, _, _ = grpo(token_rewards=r, loss_mask=m, values=None, group_ids=groups, gamma=1.0, lam=1.0, norm_by_std=False)
    assert close(adv, [[0, 0.5, 0, 0], [-0.5, -0.5, -0.5, 0], [0, 0, 0, 0], [0, 0, 0, 0]])


def test_grpo_group_of_one_gets_zero():
    adv, _, _ = call("grpo", torch.tensor([[1.0, 2.0]]), torch.ones(1, 2))
    assert close(adv, [[0.0, 0.0]])


@pytest.mark.parametrize("seed", range(30))
def test_grpo_matches_loop(seed):
    r, m, _, groups = random_batch(seed)
    norm = seed % 2 == 0
    adv, _, _ = grpo(token_rewards=r, loss_mask=m, values=None, group_ids=groups, gamma=0.9, lam=0.5, norm_by_std=norm)
    assert close(adv, ref_grpo(r.tolist(), m.tolist(), groups.tolist(), norm, 1e-6))


# ----------------------------------------------------------------------------- RLOO


def test_rloo_by_hand():
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.5], [2.0, 0.0], [0.0, 0.0]])
    m = torch.tensor([[1, 0], [1, 1], [1, 1], [1, 1], [0, 1]])
    groups = torch.tensor([0, 0, 0, 1, 1])
    adv, _, _ = rloo(token_rewards=r, loss_mask=m, values=None, group_ids=groups, gamma=1.0, lam=1.0)
    # group 0 scores [1, 0, 0.5]: 1 - (0+0.5)/2 = 0.75; 0 - (1+0.5)/2 = -0.75; 0.5 - (1+0)/2 = 0
    # group 1 scores [2, 0]: 2 - 0 = 2; 0 - 2 = -2
    assert close(adv, [[0.75, 0], [-0.75, -0.75], [0, 0], [2, 2], [0, -2]])


def test_rloo_group_of_one_raises():
    with pytest.raises(ValueError, match="at least 2"):
        call("rloo", torch.zeros(3, 2), torch.ones(3, 2), groups=torch.tensor([0, 0, 1]))


@pytest.mark.parametrize("seed", range(30))
def test_rloo_matches_loop(seed):
    r, m, _, groups = random_batch(seed, need_pairs=True)
    adv, _, _ = rloo(token_rewards=r, loss_mask=m, values=None, group_ids=groups, gamma=1.0, lam=1.0)
    assert close(adv, ref_rloo(r.tolist(), m.tolist(), groups.tolist()))


# ----------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_by_hand():
    adv, ret, _ = reinforce_pp(
        token_rewards=REW,
        loss_mask=MASK,
        values=None,
        group_ids=torch.zeros(1, dtype=torch.long),
        gamma=0.5,
        lam=1.0,
        norm_by_std=False,
    )
    # Return-to-go over agent tokens 1, 2, 5, carried across the tool output at 3-4:
    # G5 = 1;  G2 = 0.5 + 0.5*1 = 1.0;  G1 = 0 + 0.5*1.0 = 0.5
    assert close(ret, [[0.0, 0.5, 1.0, 0.0, 0.0, 1.0]])
    # centered on the batch mean 2.5/3 = 0.833333 (norm_by_std=False)
    mu = 2.5 / 3
    assert close(adv, [[0.0, 0.5 - mu, 1.0 - mu, 0.0, 0.0, 1.0 - mu]])
    # whitened: unbiased std of [0.5, 1, 1] = 0.288675
    adv, _, _ = call("reinforce_pp", REW, MASK, gamma=0.5)
    sd = statistics.stdev([0.5, 1.0, 1.0])
    assert close(adv, [[0.0, (0.5 - mu) / (sd + 1e-6), (1 - mu) / (sd + 1e-6), 0, 0, (1 - mu) / (sd + 1e-6)]])


@pytest.mark.parametrize("seed", range(30))
def test_reinforce_pp_matches_loop(seed):
    r, m, _, groups = random_batch(seed)
    gamma = [1.0, 0.99, 0.5][seed % 3]
    norm = seed % 2 == 0
    adv, ret, _ = reinforce_pp(
        token_rewards=r, loss_mask=m, values=None, group_ids=groups, gamma=gamma, lam=1.0, norm_by_std=norm
    )
    exp_ret = ref_return_to_go(r.tolist(), m.tolist(), gamma)
    assert close(ret, exp_ret)
    assert close(adv, ref_whiten(exp_ret, m.tolist(), 1e-6, scale=norm))


# ----------------------------------------------------------------------------- process rewards


def test_process_reward_credit():
    """A step's process reward reaches the tokens of that step and of earlier steps.

    Two rows in one group, the same layout as MASK; bump step 1's reward (token 2) in row 0.
    gae and reinforce_pp give causal credit: tokens 1-2 move, token 5 (a later step) does not.
    grpo and rloo give trajectory-level credit: all of row 0's agent tokens move.
    """
    mask = MASK.repeat(2, 1)  # (1, T) -> (2, T)
    base = REW.repeat(2, 1).double()  # (1, T) -> (2, T)
    bumped = base.clone()
    bumped[0, 2] += 0.7
    values = VAL.repeat(2, 1).double()  # (1, T) -> (2, T)
    groups = torch.zeros(2, dtype=torch.long)
    for name in NAMES:
        kw = dict(v=values, groups=groups, gamma=0.9, lam=0.95, norm_by_std=False)
        a0, _, _ = call(name, base, mask, **kw)
        a1, _, _ = call(name, bumped, mask, **kw)
        diff = (a1 - a0)[0]
        assert diff[1] != 0 and diff[2] != 0, name  # the step itself and the earlier token
        if name in ("gae",):
            assert diff[5] == 0, name  # a later step is untouched
        if name in ("grpo", "rloo"):
            assert diff[5] != 0 and close(diff[1], diff[5]), name
    # reinforce_pp re-centers on the batch mean, so compare its returns (before centering).
    _, g0, _ = call("reinforce_pp", base, mask, gamma=0.9)
    _, g1, _ = call("reinforce_pp", bumped, mask, gamma=0.9)
    d = (g1 - g0)[0]
    assert close(d, [0.0, 0.9 * 0.7, 0.7, 0.0, 0.0, 0.0])


# ----------------------------------------------------------------------------- off-mask rewards


@pytest.mark.parametrize("name", REGISTERED)
def test_rewards_off_mask_are_ignored_and_reported(name):
    check_rewards_off_mask_are_ignored(name)


def check_rewards_off_mask_are_ignored(name, **extra):
    r = REW.clone()
    r[0, 3] = 5.0  # on a tool-output token
    r[0, 0] = -1.0  # on the prompt
    groups = torch.tensor([0, 0])
    kw = dict(v=VAL.repeat(2, 1), groups=groups, gamma=0.9, lam=0.9, **extra)
    a_clean, ret_clean, m_clean = call(name, REW.repeat(2, 1), MASK.repeat(2, 1), **kw)
    a_dirty, ret_dirty, m_dirty = call(name, torch.cat([r, REW]), MASK.repeat(2, 1), **kw)
    assert close(a_clean, a_dirty) and close(ret_clean, ret_dirty)
    assert close(m_clean["adv/reward_off_mask"], 0.0)
    assert close(m_dirty["adv/reward_off_mask"], 6.0)


# ----------------------------------------------------------------------------- shared contract


@pytest.mark.parametrize("name", REGISTERED)
def test_estimator_contract(name):
    check_estimator_contract(name)


def check_estimator_contract(name, **extra):
    """What the trainer relies on from any estimator: shapes, zeros off the mask, finite values,
    0-d metrics without grad, shape errors naming the input, no grad tracked, an all-zero mask
    giving zeros (``extra``: the estimator's own keyword arguments, as ``adv_kwargs``)."""
    r, m, v, groups = random_batch(3, need_pairs=True)
    adv, ret, metrics = call(name, r, m, v, groups, gamma=0.95, lam=0.9, **extra)
    assert adv.shape == ret.shape == r.shape
    assert (adv[~m] == 0).all() and (ret[~m] == 0).all()
    assert torch.isfinite(adv).all()
    for key, t in metrics.items():
        assert t.dim() == 0 and not t.requires_grad, key
    with pytest.raises(ValueError, match="group_ids"):
        call(name, r, m, v, groups[:-1], **extra)
    with pytest.raises(ValueError, match="loss_mask"):
        call(name, r, m[:, :-1], v, groups, **extra)
    adv, ret, _ = call(name, r, m, v.clone().requires_grad_(True), groups, **extra)
    assert not adv.requires_grad and not ret.requires_grad
    adv, ret, metrics = call(name, torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), **extra)
    assert (adv == 0).all() and (ret == 0).all()
    assert all(torch.isfinite(t) for t in metrics.values())


def test_estimators_do_not_track_grad():
    v = VAL.clone().requires_grad_(True)
    adv, ret, _ = call("gae", REW, MASK, v)
    assert not adv.requires_grad and not ret.requires_grad


def test_empty_batch_mask_gives_zeros():
    for name in REGISTERED:
        adv, ret, metrics = call(name, torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3))
        assert (adv == 0).all() and (ret == 0).all(), name
        assert all(torch.isfinite(t) for t in metrics.values()), name


# ----------------------------------------------------------------------------- registry


def test_builtin_declarations_match_the_functions():
    """The torch-free registry declares the built-ins (entry point, uses_critic, needs_groups,
    keyword parameters) so a config is checked without importing torch: the declarations must
    be what the functions, once imported, register."""
    from trainers.algos import registry

    assert set(NAMES) <= set(REGISTERED)
    for name in NAMES:
        fn = get_adv_est(name)
        assert registry.ADV_ESTIMATORS[name] is fn and registry.entry_point(fn) == f"trainers.algos.advantages:{name}"
        assert registry.ADV_PARAMS[name] == registry.keyword_params(fn, registry.ADV_TRAINER_ARGS) == {"eps"}
    assert [n for n in NAMES if registry.USES_CRITIC[n]] == ["gae"]
    assert [n for n in NAMES if registry.NEEDS_GROUPS[n]] == ["grpo", "rloo"]


def test_registry_names_and_errors():
    assert set(NAMES) <= set(ADV_ESTIMATORS)
    assert get_adv_est("grpo") is grpo
    with pytest.raises(ValueError) as e:
        get_adv_est("ppo")
    for name in NAMES:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(rloo)
    assert register_adv_est("grpo", needs_groups=True)(grpo) is grpo  # the same entry again is fine
    with pytest.raises(ValueError, match="'grpo' is already registered with needs_groups=True"):
        register_adv_est("grpo")(grpo)
    assert ADV_ESTIMATORS["grpo"] is grpo


def test_register_new_estimator():
    @register_adv_est("_test_zero")
    def zero(*, token_rewards, loss_mask, values, group_ids, gamma, lam, norm_by_std=True, eps=1e-6):
        z = torch.zeros_like(token_rewards)
        return z, z, {}

    try:
        assert get_adv_est("_test_zero") is zero
    finally:
        del A.ADV_ESTIMATORS["_test_zero"]


# ----------------------------------------------------------------------------- place_rewards


def test_place_rewards_by_hand():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [0, 1, 1, 1, 0, 0, 0]])
    out = place_rewards(torch.tensor([1.0, 0.0]), mask, step_rewards=[[0.5, -0.1], [0.2]], step_end_index=[[2, 5], [3]])
    # row 0: step 1 ends at 2 (0.5); step 2 ends at 5 (-0.1) which is also the last agent token,
    #        so the outcome adds there: -0.1 + 1.0 = 0.9
    # row 1: one step ending at 3 (0.2), the outcome 0.0 on the last agent token 3 -> 0.2
    assert close(out, [[0, 0, 0.5, 0, 0, 0.9, 0], [0, 0, 0, 0.2, 0, 0, 0]])


def test_place_rewards_errors():
    mask = torch.tensor([[0, 1, 1, 0]])
    one = torch.tensor([1.0])
    with pytest.raises(ValueError, match="not an agent token"):
        place_rewards(one, mask, [[0.5]], [[3]])  # index 3 is an env token: an off-by-one end
    with pytest.raises(ValueError, match="outside"):
        place_rewards(one, mask, [[0.5]], [[4]])
    with pytest.raises(ValueError, match="step rewards"):
        place_rewards(one, mask, [[0.5, 0.1]], [[2]])
    with pytest.raises(ValueError, match="rows"):
        place_rewards(one, mask, [], [])
    with pytest.raises(ValueError, match="no agent token"):
        place_rewards(one, torch.zeros(1, 4), [[]], [[]])
    # A row without agent tokens and a zero outcome is fine.
    assert (place_rewards(torch.zeros(1), torch.zeros(1, 4), [[]], [[]]) == 0).all()


@pytest.mark.parametrize("seed", range(15))
def test_place_rewards_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 8
    mask = torch.rand(B, T, generator=g) < 0.5
    mask[:, 1] = True
    outcome = torch.randn(B, generator=g, dtype=torch.float64)
    steps, ends = [], []
    for b in range(B):
        pos = agent_positions(mask[b].tolist())
        k = int(torch.randint(0, len(pos) + 1, (1,), generator=g))
        ends.append(pos[:k])
        steps.append(torch.randn(k, generator=g).tolist())
    out = place_rewards(outcome, mask, steps, ends)
    exp = [[0.0] * T for _ in range(B)]
    for b in range(B):
        for r, e in zip(steps[b], ends[b]):
            exp[b][e] += r
        exp[b][agent_positions(mask[b].tolist())[-1]] += outcome[b].item()
    assert close(out, exp)


# ----------------------------------------------------------------------------- kl_in_reward


def test_kl_in_reward_by_hand():
    lp = torch.tensor([[0.0, -1.0, -1.0, -2.0]])
    ref = torch.tensor([[5.0, -1.5, -0.5, -2.0]])
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[0, 1, 1, 1]])
    out, metrics = kl_in_reward(r, lp, ref, mask, 0.1, "k1")
    # k1 = lp - ref on agent tokens: [0.5, -0.5, 0]; reward - 0.1 * k1; token 0 (prompt) untouched
    assert close(out, [[0.0, -0.05, 0.05, 1.0]])
    assert close(metrics["kl_reward/kl"], 0.0)
    out, metrics = kl_in_reward(r, lp, ref, mask, 0.1, "k2")
    # k2 = 0.5 * d^2 = [0.125, 0.125, 0] -> mean 0.083333
    assert close(out, [[0.0, -0.0125, -0.0125, 1.0]])
    assert close(metrics["kl_reward/kl"], 0.25 / 3)
    assert close(metrics["kl_reward/penalty"], 0.025 / 3)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_in_reward_matches_loop(seed, kind):
    r, m, _, _ = random_batch(seed)
    g = torch.Generator().manual_seed(seed + 100)
    lp = torch.randn(r.shape, generator=g, dtype=torch.float64)
    ref = torch.randn(r.shape, generator=g, dtype=torch.float64)
    out, _ = kl_in_reward(r, lp, ref, m, 0.3, kind)
    exp = r.tolist()
    for b in range(r.shape[0]):
        for t in agent_positions(m[b].tolist()):
            d = lp[b, t].item() - ref[b, t].item()
            kl = {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1}[kind]
            exp[b][t] -= 0.3 * kl
    assert close(out, exp)


# ----------------------------------------------------------------------------- equal scores


def _score_rows(parts_per_row, T=4):
    """float32 (B, T) rewards whose row b holds parts_per_row[b] on its first tokens."""
    r = torch.zeros(len(parts_per_row), T)
    for b, parts in enumerate(parts_per_row):
        for t, x in enumerate(parts):
            r[b, t] = x
    return r, torch.ones_like(r)


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize(
    "rows",
    [
        [(0.2, 1.0)] * 8,  # the shipped demo: hop 0.2 + em 1.0, eight times
        [(1.0, 0.2)] * 4 + [(-0.3, 0.5, 1.0)] * 4,  # equal in exact arithmetic, summed differently
        [(0.2, 1.0)] * 7 + [(-0.3, 0.5, 1.0)],
        [(0.1, 0.2, -0.3)] * 3 + [(0.0,)] * 5,  # equal to 0, not exactly 0 in float32
    ],
)
def test_grpo_equal_scores_get_exactly_zero(rows, norm_by_std):
    # Before the float64 statistics and the std tolerance: +0.106 on every token of the first
    # case and adv/zero_std_group_frac 0.
    r, m = _score_rows(rows)
    adv, _, met = call("grpo", r, m, norm_by_std=norm_by_std)
    assert adv.dtype == torch.float32
    assert torch.equal(adv, torch.zeros_like(adv))
    assert float(met["adv/zero_std_group_frac"]) == 1.0


def test_rloo_equal_scores_get_exactly_zero():
    r, m = _score_rows([(1.0, 0.2)] * 4 + [(-0.3, 0.5, 1.0)] * 4)
    adv, _, met = call("rloo", r, m)
    assert torch.equal(adv, torch.zeros_like(adv))
    assert float(met["adv/zero_std_group_frac"]) == 1.0


def test_grpo_tolerance_keeps_real_differences():
    # A real difference far above rounding keeps its sign and size; only the equal group is 0.
    r, m = _score_rows([(0.2, 1.0)] * 4 + [(1.0,)] * 4 + [(0.2, 1.0)] * 2 + [(-0.3, 0.5, 1.0)] * 2)
    groups = torch.tensor([0] * 8 + [1] * 4)
    adv, _, met = call("grpo", r, m, groups=groups)
    assert (adv[:4, 0] > 0.9).all() and (adv[4:8, 0] < -0.9).all()
    assert torch.equal(adv[8:], torch.zeros_like(adv[8:]))
    assert float(met["adv/zero_std_group_frac"]) == pytest.approx(4 / 12)


def _ulp_apart(n):
    """n float32 values alternating 1.2 and the next float32 above it: equal up to rounding."""
    a = torch.tensor(1.2)
    b = torch.nextafter(a, torch.tensor(2.0))
    return torch.stack([a if i % 2 else b for i in range(n)])


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_reinforce_pp_equal_returns_get_exactly_zero(norm_by_std):
    # One agent token per row whose return is 1.2 up to one float32 ulp. Before the fix the
    # whitened advantages were about +-0.1.
    r = torch.zeros(8, 3)
    r[:, 1] = _ulp_apart(8)
    m = torch.tensor([[0, 1, 0]] * 8)
    adv, _, _ = call("reinforce_pp", r, m, norm_by_std=norm_by_std)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_gae_whitening_equal_advantages_get_exactly_zero():
    r = torch.zeros(8, 3)
    r[:, 1] = _ulp_apart(8)
    m = torch.tensor([[0, 1, 0]] * 8)
    adv, _, _ = call("gae", r, m, v=torch.zeros_like(r))
    assert torch.equal(adv, torch.zeros_like(adv))
    # and a real spread is still whitened to std 1
    r[:4, 1] = 0.0
    adv, _, _ = call("gae", r, m, v=torch.zeros_like(r))
    assert torch.std(adv[:, 1].double()).item() == pytest.approx(1.0, abs=1e-5)


# ----------------------------------------------------------------------------- the blocked scan


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200, 1000])
@pytest.mark.parametrize("discount", [0.0, 0.5, 0.9405, 0.999])
def test_discounted_scan_matches_loop_across_blocks(T, discount):
    # Rows longer than the scan's block (64) exercise the carry between blocks; rows with gaps
    # (env tokens) and a row with no agent token exercise the packing. Reference: the loop.
    g = torch.Generator().manual_seed(T * 7 + int(discount * 1000))
    B = 5
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[1] = False
    mask[2, : T // 2] = False  # a long tool response
    x = torch.randn(B, T, generator=g, dtype=torch.float64)
    got = A._discounted_cumsum_on_mask(x, mask, discount)
    exp = ref_return_to_go(torch.where(mask, x, torch.zeros_like(x)).tolist(), mask.tolist(), discount)
    assert torch.allclose(got, torch.tensor(exp, dtype=torch.float64), atol=1e-9, rtol=1e-9)
    assert got.dtype == x.dtype and bool((got[~mask] == 0).all())


def test_discounted_scan_float32_long_row_within_1e_6():
    # B=4, T=4096 in float32, gamma*lam of PPO's defaults: equal to the float64 loop to 1e-6
    # (relative to the values' scale), with no under- or overflow from large powers.
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 4096, generator=g) < 0.8
    x = torch.randn(4, 4096, generator=g) * 0.1
    got = A._discounted_cumsum_on_mask(x, mask, 0.99 * 0.95)
    exp = torch.tensor(
        ref_return_to_go(torch.where(mask, x, torch.zeros_like(x)).double().tolist(), mask.tolist(), 0.99 * 0.95),
        dtype=torch.float64,
    )
    assert torch.isfinite(got).all()
    assert (got.double() - exp).abs().max().item() < 1e-6
