"""Tests for trainers/algos/losses.py.

Two layers: small cases whose expected values are worked out by hand in the comments, and every
vectorized function checked against a plain Python loop on seeded random inputs and masks.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from trainers.algos import losses as L
from trainers.algos.losses import (
    AGGREGATIONS,
    KL_KINDS,
    aggregate,
    entropy_from_logits,
    get_agg,
    kl_loss,
    kl_penalty,
    logprobs_from_logits,
    policy_loss,
    register_agg,
    value_loss,
)

ALGOS_DIR = Path(__file__).resolve().parents[2] / "trainers" / "algos"


def close(a, b, tol=1e-5):
    return torch.allclose(
        torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol, rtol=tol
    )


# ----------------------------------------------------------------------------- plain-loop references


def ref_aggregate(loss, mask, mode):
    B, T = len(loss), len(loss[0])
    if mode == "token-mean":
        vals = [loss[b][t] for b in range(B) for t in range(T) if mask[b][t]]
        return sum(vals) / len(vals) if vals else 0.0
    per_row = []
    for b in range(B):
        vals = [loss[b][t] for t in range(T) if mask[b][t]]
        if not vals:
            continue
        per_row.append(sum(vals) if mode == "seq-mean-token-sum" else sum(vals) / len(vals))
    return sum(per_row) / len(per_row) if per_row else 0.0


def ref_kl(lp, ref, kind):
    d = lp - ref
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    return math.exp(-d) + d - 1.0


def ref_policy_token(lp, old, a, clip_low, clip_high, c):
    ratio = math.exp(lp - old)
    loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
    if c is not None and a < 0:
        loss = min(loss, -c * a)
    return loss


def rand_mask(B, T, g):
    m = torch.rand(B, T, generator=g) < 0.6
    if B > 1:
        m[torch.randint(0, B, (1,), generator=g)] = False  # an all-zero row now and then
    return m


# ----------------------------------------------------------------------------- aggregate


def test_aggregate_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    # token-mean: (1 + 2 + 5) / 3 masked tokens = 8/3; the NaN sits on a masked-out position.
    assert close(aggregate(loss, mask, "token-mean"), 8 / 3)
    # seq-mean-token-sum: rows sum to 3 and 5; row 2 has no tokens and is left out -> 4.
    assert close(aggregate(loss, mask, "seq-mean-token-sum"), 4.0)
    # seq-mean-token-mean: rows average 1.5 and 5 -> 3.25.
    assert close(aggregate(loss, mask, "seq-mean-token-mean"), 3.25)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregate_empty_mask_is_zero_not_nan(mode):
    check_aggregation_contract(mode)


def check_aggregation_contract(mode, **extra):
    """What micro-batching, FSDP and the trainer rely on from any registered aggregation (a
    plugin's too: tests/trainers/test_plugins.py): an empty mask gives 0 with a zero gradient; a
    0-d result that ignores what is off the mask; and, with ``units``, the minibatch's value is the
    units-weighted sum over a split of its rows (``extra``: its ``loss_kwargs``)."""
    loss = torch.randn(2, 5, requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 5), mode, **extra)
    out.backward()
    assert out.item() == 0.0
    assert torch.isfinite(loss.grad).all() and (loss.grad == 0).all()
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = rand_mask(4, 6, g)
    whole = aggregate(loss, mask, mode, **extra)
    assert whole.dim() == 0 and torch.isfinite(whole)
    assert close(aggregate(torch.where(mask > 0, loss, 1e6), mask, mode, **extra), whole)
    units = L.AGG_UNITS.get(mode)
    if units is not None:
        parts = [slice(0, 1), slice(1, 4)]
        total = sum(units(mask[p]) / units(mask) * aggregate(loss[p], mask[p], mode, **extra) for p in parts)
        assert close(total, whole)


@pytest.mark.parametrize("kind", sorted(KL_KINDS))
def test_kl_kind_contract(kind):
    """Any registered KL kind: per-token, (B, T) in and out, 0 where the distributions agree, finite."""
    g = torch.Generator().manual_seed(1)
    lp, ref = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    out = kl_penalty(lp, ref, kind)
    assert out.shape == (3, 7) and torch.isfinite(out).all()
    assert close(kl_penalty(lp, lp, kind), torch.zeros(3, 7))


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_aggregate_matches_loop(seed, mode):
    g = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g))
    loss = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = rand_mask(B, T, g)
    assert close(aggregate(loss, mask, mode), ref_aggregate(loss.tolist(), mask.tolist(), mode))


def test_agg_registry_errors():
    with pytest.raises(ValueError) as e:
        get_agg("sum")
    for name in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert name in str(e.value)
    with pytest.raises(ValueError, match="already registered"):
        register_agg("token-mean")(lambda loss, mask: loss.sum())
    # Registering the very same function (and units) again is harmless; other units raise.
    fn, units = AGGREGATIONS["token-mean"], L.AGG_UNITS["token-mean"]
    assert register_agg("token-mean", units=units)(fn) is fn
    with pytest.raises(ValueError, match="'token-mean' is already registered with units="):
        register_agg("token-mean")(fn)
    with pytest.raises(ValueError, match="'token-mean' is already registered with units="):
        register_agg("token-mean", units=lambda mask: mask.sum())(fn)
    assert L.AGG_UNITS["token-mean"] is units
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(torch.zeros(1, 2), torch.ones(1, 2), "mean")


# ----------------------------------------------------------------------------- kl_penalty


def test_kl_penalty_by_hand():
    # p = 0.5, ref = 0.25: d = log 2 = 0.693147
    lp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert close(kl_penalty(lp, ref, "k1"), math.log(2))  # d
    assert close(kl_penalty(lp, ref, "k2"), 0.5 * math.log(2) ** 2)  # 0.240227
    assert close(kl_penalty(lp, ref, "k3"), 0.5 + math.log(2) - 1)  # e^-d + d - 1 = 0.193147
    # Equal distributions: all three are 0.
    for kind in ("k1", "k2", "k3"):
        assert close(kl_penalty(lp, lp, kind), 0.0)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(lp, ref, "k4")


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalty_matches_loop(seed, kind):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(3, 7, generator=g, dtype=torch.float64)
    ref = torch.randn(3, 7, generator=g, dtype=torch.float64)
    out = kl_penalty(lp, ref, kind)
    exp = [[ref_kl(a, b, kind) for a, b in zip(ra, rb)] for ra, rb in zip(lp.tolist(), ref.tolist())]
    assert close(out, exp)


def test_kl_penalty_k3_does_not_overflow():
    out = kl_penalty(torch.tensor([[-200.0]]), torch.tensor([[0.0]]), "k3")
    assert torch.isfinite(out).all()


def test_kl_loss_by_hand():
    lp = torch.tensor([[math.log(0.5), math.log(0.5), 0.0]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -5.0]])
    mask = torch.tensor([[1, 1, 0]])
    # k1 per token: [log 2, 0, (masked)] -> token-mean = log(2) / 2
    loss, metrics = kl_loss(lp, ref, mask, "k1", "token-mean")
    assert close(loss, math.log(2) / 2)
    assert close(metrics["kl/loss"], math.log(2) / 2) and not metrics["kl/loss"].requires_grad
    loss.backward()
    assert close(lp.grad, [[0.5, 0.5, 0.0]])  # d(mean of d)/d lp = 1/2 on the 2 masked tokens


# ----------------------------------------------------------------------------- policy_loss


def test_policy_loss_by_hand():
    lp_old = torch.zeros(1, 4)
    lp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0, 5.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 2.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, m = policy_loss(lp, lp_old, adv, mask)
    # t0: A=1,  r=1.5: max(-1.5, -1.2) = -1.2  (clipped at 1.2)
    # t1: A=-1, r=0.5: max(0.5, 0.8)   =  0.8  (clipped at 0.8)
    # t2: A=2,  r=1:   max(-2, -2)     = -2
    # t3 is masked out. token-mean = (-1.2 + 0.8 - 2) / 3 = -0.8
    assert close(loss, -0.8)
    assert close(m["policy/clipfrac"], 2 / 3)
    assert close(m["policy/ratio_mean"], (1.5 + 0.5 + 1.0) / 3)
    assert close(m["policy/ratio_max"], 1.5)  # e^5 at t3 is masked out
    # approx_kl = mean(r - log r - 1): (0.094535 + 0.193147 + 0) / 3
    assert close(m["policy/approx_kl"], (0.5 - math.log(1.5) + (-0.5 + math.log(2))) / 3)
    assert close(m["policy/dual_clipfrac"], 0.0)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
    loss.backward()
    # Clipped tokens get no gradient; t2: d(-A r)/d lp = -A r / 3 = -2/3.
    assert close(lp.grad, [[0.0, 0.0, -2 / 3, 0.0]])


def test_policy_loss_clip_higher():
    lp = torch.tensor([[math.log(1.25)]])
    adv = torch.ones(1, 1)
    # clip_high=0.28 (DAPO): r=1.25 is inside [0.8, 1.28], so the loss is -1.25, no clip.
    loss, m = policy_loss(lp, torch.zeros(1, 1), adv, torch.ones(1, 1), clip_high=0.28)
    assert close(loss, -1.25) and close(m["policy/clipfrac"], 0.0)
    # the symmetric 0.2 clips it to -1.2
    loss, m = policy_loss(lp, torch.zeros(1, 1), adv, torch.ones(1, 1))
    assert close(loss, -1.2) and close(m["policy/clipfrac"], 1.0)


def test_policy_loss_dual_clip_by_hand():
    lp = torch.tensor([[math.log(5.0), math.log(2.0), math.log(5.0)]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, m = policy_loss(lp, torch.zeros(1, 3), adv, torch.ones(1, 3), dual_clip_c=3.0)
    # t0: A=-1, r=5: max(5, 1.2) = 5, capped at c*|A| = 3      -> 3 (dual clip)
    # t1: A=-1, r=2: max(2, 1.2) = 2 < 3                       -> 2
    # t2: A=+1, r=5: max(-5, -1.2) = -1.2 (no dual clip for A>0) -> -1.2
    # mean = (3 + 2 - 1.2) / 3 = 1.266667
    assert close(loss, 3.8 / 3)
    assert close(m["policy/dual_clipfrac"], 1 / 3)
    loss.backward()
    # t0 is a constant (-c A), t2 is clipped; t1: d(-A r)/d lp = r/3 = 2/3
    assert close(lp.grad, [[0.0, 2 / 3, 0.0]])
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss(lp, torch.zeros(1, 3), adv, torch.ones(1, 3), dual_clip_c=1.0)


@pytest.mark.parametrize("seed", range(20))
def test_policy_loss_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
    lp = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    old = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = rand_mask(B, T, g)
    c = [None, 2.0, 3.0][seed % 3]
    mode = sorted(AGGREGATIONS)[seed % len(AGGREGATIONS)]
    loss, m = policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.3, dual_clip_c=c, agg=mode)
    per_tok = [
        [ref_policy_token(lp[b, t].item(), old[b, t].item(), adv[b, t].item(), 0.2, 0.3, c) for t in range(T)]
        for b in range(B)
    ]
    assert close(loss, ref_aggregate(per_tok, mask.tolist(), mode))
    toks = [(b, t) for b in range(B) for t in range(T) if mask[b, t]]
    ratios = [math.exp(lp[b, t].item() - old[b, t].item()) for b, t in toks]
    if toks:
        assert close(m["policy/ratio_mean"], sum(ratios) / len(ratios))
        assert close(m["policy/ratio_max"], max(ratios))
        assert close(m["policy/approx_kl"], sum(r - math.log(r) - 1 for r in ratios) / len(toks))


def test_policy_loss_shape_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(x, x, torch.zeros(2, 4), x)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        policy_loss(torch.zeros(6), torch.zeros(6), torch.zeros(6), torch.zeros(6))


# ----------------------------------------------------------------------------- value_loss


def test_value_loss_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0, 7.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.5, 3.5, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, m = value_loss(values, old, returns, mask, clip_eps=0.2)
    # t0: unclipped (1-2)^2 = 1;  v_clip = 1 + 0 = 1       -> (1-2)^2 = 1     -> max 1
    # t1: unclipped (2-1)^2 = 1;  v_clip = 1.5 + 0.2 = 1.7 -> (1.7-1)^2 = .49 -> max 1
    # t2: unclipped 0;            v_clip = 3.5 - 0.2 = 3.3 -> .09             -> max .09 (clipped)
    # loss = 0.5 * (1 + 1 + 0.09) / 3 = 0.348333
    assert close(loss, 0.5 * 2.09 / 3)
    assert close(m["value/clipfrac"], 1 / 3)
    # residuals returns - values = [1, -1, 0]: unbiased var 1; returns [2, 1, 3]: var 1 -> EV 0
    assert close(m["value/explained_var"], 0.0)
    assert close(m["value/pred_mean"], 2.0)
    loss.backward()
    # t0: d/dv 0.5 (v-R)^2 / 3 = (1-2)/3; t1: (2-1)/3; t2: clipped branch wins -> 0
    assert close(values.grad, [[-1 / 3, 1 / 3, 0.0, 0.0]])
    # Without clipping: 0.5 * (1 + 1 + 0) / 3
    loss, m = value_loss(values, old, returns, mask, clip_eps=None)
    assert close(loss, 1 / 3) and close(m["value/clipfrac"], 0.0)


def test_value_loss_explained_var_perfect_and_constant():
    r = torch.tensor([[1.0, 2.0, 3.0]])
    _, m = value_loss(r.clone(), r, r, torch.ones(1, 3))
    assert close(m["value/explained_var"], 1.0)
    c = torch.ones(1, 3)
    _, m = value_loss(c * 0, c * 0, c, torch.ones(1, 3))  # Var(returns) = 0 -> reported as 0
    assert close(m["value/explained_var"], 0.0)
    # A zero-reward micro-batch: GAE's returns (advantages + old values) are 0 in truth and float32
    # noise in fact. Seen in a SmolLM2 PPO run as explained_var -2.4e13; constant up to the values'
    # rounding is constant.
    g = torch.Generator().manual_seed(0)
    old = 0.3 * torch.randn(4, 50, generator=g)
    returns = 3e-8 * torch.randn(4, 50, generator=g)  # float32 rounding (eps 1.2e-7) of values ~0.3
    _, m = value_loss(old + 0.01, old, returns, torch.ones(4, 50))
    assert close(m["value/explained_var"], 0.0)
    # Genuinely varying small returns beside larger values still count.
    small = 1e-3 * torch.randn(4, 50, generator=g)
    _, m = value_loss(old, old, small, torch.ones(4, 50))  # a bad critic: very negative, and reported
    want = 1 - (small - old).var() / small.var()
    assert close(m["value/explained_var"], float(want), tol=1e-3 * abs(float(want)))


@pytest.mark.parametrize("seed", range(15))
def test_value_loss_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 6
    v, old, ret = (torch.randn(B, T, generator=g, dtype=torch.float64) for _ in range(3))
    mask = rand_mask(B, T, g)
    eps = [None, 0.1, 0.5][seed % 3]
    mode = sorted(AGGREGATIONS)[seed % len(AGGREGATIONS)]
    loss, _ = value_loss(v, old, ret, mask, clip_eps=eps, agg=mode)
    per_tok = []
    for b in range(B):
        row = []
        for t in range(T):
            e1 = (v[b, t].item() - ret[b, t].item()) ** 2
            if eps is not None:
                vc = old[b, t].item() + min(max(v[b, t].item() - old[b, t].item(), -eps), eps)
                e1 = max(e1, (vc - ret[b, t].item()) ** 2)
            row.append(0.5 * e1)
        per_tok.append(row)
    assert close(loss, ref_aggregate(per_tok, mask.tolist(), mode))


# ----------------------------------------------------------------------------- entropy, logprobs


def test_entropy_by_hand():
    logits = torch.tensor(
        [
            [
                [0.0, 0.0, 0.0, 0.0],  # uniform over 4: log 4
                [0.0, float("-inf"), 0.0, float("-inf")],  # uniform over 2: log 2
                [1000.0, 0.0, 0.0, 0.0],
            ]
        ],  # one-hot: 0
        requires_grad=True,
    )
    h = entropy_from_logits(logits)
    assert h.shape == (1, 3)
    assert close(h, [[math.log(4), math.log(2), 0.0]])
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("seed", range(5))
def test_entropy_and_logprobs_match_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, T, V = 2, 3, 5
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3
    ids = torch.randint(0, V, (B, T), generator=g)
    h = entropy_from_logits(logits)
    lp = logprobs_from_logits(logits, ids)
    for b in range(B):
        for t in range(T):
            z = logits[b, t].tolist()
            zmax = max(z)
            norm = sum(math.exp(x - zmax) for x in z)
            p = [math.exp(x - zmax) / norm for x in z]
            assert close(h[b, t], -sum(pi * math.log(pi) for pi in p))
            assert close(lp[b, t], math.log(p[ids[b, t].item()]))


def test_logprobs_by_hand():
    # probs [0.25, 0.75]: logits [0, log 3]
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    lp = logprobs_from_logits(logits, torch.tensor([[1, 0]]))
    assert close(lp, [[math.log(0.75), math.log(0.25)]])
    with pytest.raises(ValueError, match="ids"):
        logprobs_from_logits(logits, torch.tensor([[1, 0, 1]]))


# ----------------------------------------------------------------------------- hygiene


def test_no_item_calls_in_algos():
    # .item() forces a device sync and breaks torch.compile graphs; the math must not use it.
    # Walk the AST rather than grep, so docstrings that mention .item() do not count.
    paths = sorted(ALGOS_DIR.glob("*.py"))
    assert {"advantages.py", "losses.py"} <= {p.name for p in paths}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr != "item", f"{path.name}:{node.lineno} calls .item()"


def test_metrics_are_detached_0d():
    lp = torch.randn(2, 4, requires_grad=True)
    v = torch.randn(2, 4, requires_grad=True)
    mask = torch.ones(2, 4)
    for _, metrics in (
        policy_loss(lp, lp.detach(), torch.randn(2, 4), mask),
        value_loss(v, v.detach(), torch.randn(2, 4), mask),
        kl_loss(lp, torch.randn(2, 4), mask),
    ):
        for name, t in metrics.items():
            assert isinstance(t, torch.Tensor) and t.dim() == 0 and not t.requires_grad, name
    assert L.masked_mean(torch.tensor([1.0, float("nan")]), torch.tensor([1, 0])).item() == 1.0


# ----------------------------------------------------------------------------- float64 statistics


def test_masked_mean_std_equal_values_up_to_rounding_have_zero_std():
    a = torch.tensor(1.2)
    b = torch.nextafter(a, torch.tensor(2.0))  # one float32 ulp above
    x = torch.stack([a, b] * 4).reshape(2, 4)
    m = torch.ones(2, 4)
    mean, std = L.masked_mean_std(x, m)
    assert std.item() == 0.0 and mean.dtype == torch.float32
    assert mean.item() == pytest.approx(1.2, abs=1e-6)
    y = L.masked_whiten(x, m, eps=1e-6)
    assert torch.equal(y, torch.zeros_like(y))
    # A real spread is untouched, and padding (NaN off the mask) never leaks in.
    x2 = torch.tensor([[1.0, 2.0, 3.0, float("nan")]])
    m2 = torch.tensor([[1, 1, 1, 0]])
    mean, std = L.masked_mean_std(x2, m2)
    assert mean.item() == pytest.approx(2.0) and std.item() == pytest.approx(1.0)
    y = L.masked_whiten(x2, m2, eps=0.0)
    assert torch.allclose(y, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))


def test_masked_mean_std_is_float64_inside():
    # float32 sums of many values lose bits; float64 statistics of the same float32 inputs do not.
    x = torch.full((1, 100_000), 0.1) + torch.tensor([1e-3, -1e-3]).repeat(50_000)
    m = torch.ones_like(x)
    mean, std = L.masked_mean_std(x, m)
    ref = x.double()
    assert mean.item() == pytest.approx(ref.mean().item(), rel=1e-7)
    assert std.item() == pytest.approx(ref.std().item(), rel=1e-6)
