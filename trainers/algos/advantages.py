"""Advantage estimators for multi-turn tool-using trajectories: pure functions of tensors.

Notation used for tensor shapes:
    - B: batch of trajectories
    - T: padded token length of the whole multi-turn trajectory
    - G: number of distinct groups in ``group_ids`` (one prompt sampled several times)

Inputs the trainer builds (``place_rewards`` does the first):
    - ``token_rewards`` (B, T): each step's process reward on the last token of that step's
      action span, plus the outcome reward on the last agent token of the trajectory.
    - ``loss_mask`` (B, T): 1 exactly on the agent's generated tokens. Env tokens (tool output,
      chat template) and padding are 0. Every estimator looks at agent tokens only.

Rewards on masked-out positions are **ignored** (zeroed) by every estimator, and their total
absolute value is reported as ``adv/reward_off_mask`` so a misplaced reward shows up in the
logs; ``place_rewards``, which gets plain Python lists, raises instead.

Every estimator is registered under a name in ``ADV_ESTIMATORS`` and has the signature
``fn(*, token_rewards, loss_mask, values, group_ids, gamma, lam, norm_by_std=True, eps=1e-6)
-> (advantages (B, T), returns (B, T), metrics)``. Advantages and returns are 0 off the mask.
Estimators run under ``torch.no_grad``.

Where this departs from the papers:
    - ``gae`` (Schulman et al. 2016, arXiv 1506.02438): the recursion steps over agent tokens
      only. The "next state" of an agent token is the next *agent* token, possibly after a tool
      response, so the value bootstraps across env tokens, and gamma/lambda discount once per
      agent token, not per env token. verl's multi-turn GAE does the same skip.
    - ``grpo`` (Shao et al. 2024, arXiv 2402.03300, outcome supervision): the score is the
      trajectory's total reward (outcome plus every process reward), so a step's process
      reward is trajectory-level credit, seen by all the trajectory's agent tokens, as the
      outcome is. The paper's process-supervision variant (return-to-go of normalized step
      rewards) is not used: the steps of the trajectories in a group do not line up.
      ``norm_by_std=False`` is Dr. GRPO (Liu et al. 2025, arXiv 2503.20783). The std is the
      unbiased one over the group, as in the paper's reference code; a group of one gets 0.
    - ``rloo`` (Ahmadian et al. 2024, arXiv 2402.14740): same trajectory-level score as grpo;
      the baseline is the mean score of the other members of the group.
    - ``reinforce_pp`` (Hu 2025, arXiv 2501.03262): the return-to-go runs over agent tokens
      only and carries across tool responses (verl's implementation resets it at masked
      positions, which would cut a multi-turn trajectory's credit at the first tool call).
      The KL penalty the paper folds into the reward is applied separately, by
      ``kl_in_reward``, before the estimator.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import torch
from torch import Tensor

from .losses import (
    STD_RTOL,
    KLKind,
    expect_bt,
    expect_shape,
    kl_penalty,
    masked_mean,
    masked_mean_std,
    masked_whiten,
)

__all__ = [
    "ADV_ESTIMATORS",
    "NEEDS_GROUPS",
    "USES_CRITIC",
    "AdvEstimator",
    "get_adv_est",
    "gae",
    "grpo",
    "kl_in_reward",
    "place_rewards",
    "register_adv_est",
    "reinforce_pp",
    "rloo",
]


class AdvEstimator(Protocol):
    def __call__(
        self,
        *,
        token_rewards: Tensor,
        loss_mask: Tensor,
        values: Tensor | None,
        group_ids: Tensor,
        gamma: float,
        lam: float,
        norm_by_std: bool = True,
        eps: float = 1e-6,
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]: ...


from .registry import ADV_ESTIMATORS, NEEDS_GROUPS, USES_CRITIC, register_adv_est, resolve  # noqa: E402


def get_adv_est(name: str) -> AdvEstimator:
    """The estimator registered under ``name``; an unknown name raises listing valid ones."""
    try:
        return resolve(ADV_ESTIMATORS, name)
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {', '.join(sorted(ADV_ESTIMATORS))}") from None


# ----------------------------------------------------------------------------- helpers


def _check_inputs(
    token_rewards: Tensor, loss_mask: Tensor, values: Tensor | None, group_ids: Tensor
) -> tuple[int, int]:
    B, T = expect_bt(token_rewards=token_rewards, loss_mask=loss_mask)
    if values is not None:
        expect_shape("values", values, (B, T))
    expect_shape("group_ids", group_ids, (B,))
    if not token_rewards.is_floating_point():
        raise ValueError(f"token_rewards must be floating point, got {token_rewards.dtype}")
    return B, T


def _discounted_cumsum_on_mask(x: Tensor, mask: Tensor, discount: float) -> Tensor:
    """``y_t = x_t + discount * y_{t'}`` where t' is the next masked position after t.

    Masked-out positions are skipped (they neither add nor discount) and come back as 0.
    x (B, T), mask (B, T) bool -> (B, T).

    Vectorised: each row's masked entries are packed to the front (in order, by a running
    count), the packed rows are scanned by ``_discounted_reverse_scan`` in float64, and the result
    is scattered back. Equal to the per-token loop to float64 rounding (tests/trainers/
    test_advantages.py; speed in benchmarks/perf/advantages_speed.py).
    """
    if discount == 1.0:
        # Undiscounted: a reverse cumulative sum, no loop.
        xm = torch.where(mask, x, torch.zeros_like(x))
        return torch.where(mask, xm.flip(-1).cumsum(-1).flip(-1), torch.zeros_like(x))
    B, T = x.shape
    if B == 0 or T == 0:
        return torch.zeros_like(x)
    # Pack each row's agent tokens to the front, in order: the k-th agent token goes to column
    # k - 1 (a running count); env tokens go to a spare column T, dropped after.
    dest = torch.where(mask, mask.long().cumsum(1) - 1, torch.full_like(mask, T, dtype=torch.long))
    xm = torch.where(mask, x, torch.zeros_like(x)).to(torch.float64)
    packed = xm.new_zeros(B, T + 1).scatter_(1, dest, xm)[:, :T]  # (B, T), zero tail
    # The zero tail of each packed row adds nothing to the entries before it.
    y_packed = _discounted_reverse_scan(packed, discount)  # (B, T)
    y = y_packed.gather(1, dest.clamp(max=T - 1)).to(x.dtype)
    return torch.where(mask, y, torch.zeros_like(y))


def _powers_matrix(n: int, base: float, offset: int, device: torch.device) -> Tensor:
    """(n, n) float64 with ``base^(j - k - offset)`` where ``j - k >= offset``, else 0 (row k, col j)."""
    k = torch.arange(n, dtype=torch.float64, device=device)
    diff = k.view(1, n) - k.view(n, 1) - offset
    b = torch.as_tensor(base, dtype=torch.float64, device=device)
    return torch.where(diff >= 0, b ** diff.clamp(min=0), torch.zeros((), dtype=torch.float64, device=device))


def _discounted_reverse_scan(x: Tensor, discount: float) -> Tensor:
    """``y_k = sum_{j >= k} discount^(j-k) x_j`` along the last dim (x float64, (B, K)).

    Two matmuls, no Python loop over K: the row is cut into blocks of L ~ sqrt(K) entries;
    inside a block the sum is a matmul with the upper-triangular L x L matrix of
    ``discount^(j-k)``; what the blocks to the right contribute is a discounted sum over the
    blocks' first entries with discount ``discount^L`` (an nb x nb matmul), added as
    ``discount^(L-k) * carry``. Only non-negative powers appear, so nothing overflows for
    ``discount <= 1`` (very small powers underflow to 0, their true weight).
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount} (gamma * lam)")
    B, K = x.shape
    L = max(16, math.isqrt(max(K - 1, 0)) + 1)
    L = min(L, K)
    nb = -(-K // L)
    pad = nb * L - K
    if pad:
        x = torch.cat([x, x.new_zeros(B, pad)], dim=1)
    inner = _powers_matrix(L, discount, 0, x.device)  # [k, j] = d^(j-k), j >= k
    yb = x.view(B, nb, L) @ inner.T  # (B, nb, L): sums inside each block
    if nb > 1:
        # carry[i] = y at the first entry of block i+1 = sum_{j > i} (d^L)^(j-i-1) * yb[j, 0]
        between = _powers_matrix(nb, discount**L, 1, x.device)  # [i, j] = D^(j-i-1), j > i
        carry = yb[:, :, 0] @ between.T  # (B, nb)
        tail = discount ** (L - torch.arange(L, dtype=torch.float64, device=x.device))  # d^(L-k)
        yb = yb + carry.unsqueeze(-1) * tail
    return yb.reshape(B, nb * L)[:, :K]


def _next_on_mask(v: Tensor, mask: Tensor) -> Tensor:
    """For each t, ``v`` at the first masked position strictly after t; 0 if there is none.

    v (B, T), mask (B, T) bool -> (B, T).
    """
    B, T = v.shape
    pos = torch.arange(T, device=v.device).expand(B, T)  # (B, T)
    idx = torch.where(mask, pos, torch.full_like(pos, T))  # masked position or T ("none")
    # Suffix minimum from t+1 on: shift left by one, pad with T, reversed cummin.
    shifted = torch.cat([idx[:, 1:], idx.new_full((B, 1), T)], dim=1)  # (B, T)
    nxt = shifted.flip(-1).cummin(-1).values.flip(-1)  # (B, T), in [0, T]
    v_pad = torch.cat([v, v.new_zeros(B, 1)], dim=1)  # (B, T+1): index T holds the 0
    return v_pad.gather(1, nxt)


def _group_stats(score: Tensor, group_ids: Tensor, scale: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-trajectory group sum, size, mean and unbiased std of ``score``, in float64.

    score (B,), group_ids (B,), scale (B,) -> four float64 (B,) tensors, each the value of the
    row's own group. ``scale`` is each row's rounding scale (the sum of the absolute rewards
    that made its score). The std of a group of one is 0, and so is a std at or below
    ``STD_RTOL`` times the group's largest scale (at least its ``|mean|``): scores equal in
    exact arithmetic but summed in a different order differ only by rounding.
    """
    score = score.to(torch.float64)
    scale = scale.to(torch.float64)
    uniq, inv = torch.unique(group_ids, return_inverse=True)  # uniq (G,), inv (B,) in [0, G)
    G = uniq.numel()
    gsum = score.new_zeros(G).index_add_(0, inv, score)  # (G,)
    gcnt = score.new_zeros(G).index_add_(0, inv, torch.ones_like(score))  # (G,)
    gmean = gsum / gcnt
    gsq = score.new_zeros(G).index_add_(0, inv, (score - gmean[inv]).square())  # (G,)
    gstd = (gsq / (gcnt - 1).clamp_min(1)).sqrt()
    gscale = score.new_zeros(G).scatter_reduce_(0, inv, scale, reduce="amax")  # (G,), scale >= 0
    gscale = torch.maximum(gscale, gmean.abs())
    gstd = torch.where(gstd <= STD_RTOL * gscale, torch.zeros_like(gstd), gstd)
    return gsum[inv], gcnt[inv], gmean[inv], gstd[inv]


def _scores(token_rewards: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """Each trajectory's score (the sum of its agent-token rewards) and rounding scale (the sum
    of their absolute values), both float64 (B,)."""
    r = torch.where(m, token_rewards, torch.zeros_like(token_rewards)).to(torch.float64)
    return r.sum(-1), r.abs().sum(-1)


def _metrics(adv: Tensor, returns: Tensor, token_rewards: Tensor, mask: Tensor) -> dict[str, Tensor]:
    mean, std = masked_mean_std(adv, mask)
    big = torch.finfo(adv.dtype).max
    any_tok = mask.any()
    zero = adv.new_zeros(())
    return {
        "adv/mean": mean,
        "adv/std": std,
        "adv/max": torch.where(any_tok, torch.where(mask, adv, -big).max(), zero),
        "adv/min": torch.where(any_tok, torch.where(mask, adv, big).min(), zero),
        "adv/returns_mean": masked_mean(returns, mask),
        "adv/reward_off_mask": torch.where(mask, 0.0, token_rewards.abs()).sum(),
    }


# ----------------------------------------------------------------------------- reward placement


def place_rewards(
    outcome: Tensor,
    loss_mask: Tensor,
    step_rewards: Sequence[Sequence[float]],
    step_end_index: Sequence[Sequence[int]],
) -> Tensor:
    """Build ``token_rewards`` (B, T) from per-trajectory outcome and per-step process rewards.

    The outcome of row b goes on its last agent token (the last position where ``loss_mask``
    is 1). Process reward ``step_rewards[b][k]`` goes on ``step_end_index[b][k]``: the index of
    the **last token of step k's action span** (inclusive; for a span ``[start, end)`` pass
    ``end - 1``). Rewards landing on the same token add, so the last step's process reward and
    the outcome sum on the last agent token.

    Raises ``ValueError`` if the two lists differ in shape, an index is out of [0, T), an index
    is not an agent token (``loss_mask`` 0 there, which catches an off-by-one ``end``), or a row
    with a nonzero outcome has no agent token.

    Args:
        outcome (Tensor): outcome reward per trajectory, (B,), float.
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        step_rewards (list[list[float]]): B lists, one process reward per step.
        step_end_index (list[list[int]]): B lists, the same lengths as ``step_rewards``.

    Returns:
        Tensor: token_rewards, (B, T), dtype of ``outcome``.

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be (B, T), got shape {tuple(loss_mask.shape)}")
    B, T = loss_mask.shape
    expect_shape("outcome", outcome, (B,))
    if len(step_rewards) != B or len(step_end_index) != B:
        raise ValueError(
            f"step_rewards and step_end_index need {B} rows, got {len(step_rewards)} and {len(step_end_index)}"
        )
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for b, (rs, ends) in enumerate(zip(step_rewards, step_end_index)):
        if len(rs) != len(ends):
            raise ValueError(f"row {b}: {len(rs)} step rewards but {len(ends)} step end indices")
        for r, e in zip(rs, ends):
            if not 0 <= int(e) < T:
                raise ValueError(f"row {b}: step end index {e} is outside [0, {T})")
            rows.append(b)
            cols.append(int(e))
            vals.append(float(r))

    m = loss_mask.bool()
    dev = loss_mask.device
    rewards = torch.zeros(B, T, dtype=outcome.dtype, device=dev)
    if rows:
        r_idx = torch.tensor(rows, device=dev)
        c_idx = torch.tensor(cols, device=dev)
        on_mask = m[r_idx, c_idx]  # (N,)
        if not bool(on_mask.all()):
            k = int((~on_mask).nonzero()[0, 0])
            raise ValueError(
                f"row {rows[k]}: step end index {cols[k]} is not an agent token (loss_mask is 0 "
                "there); pass the inclusive index of the step's last action token (end - 1)"
            )
        flat = (r_idx * T + c_idx).to(dev)  # (N,) into the flattened (B*T,)
        rewards.view(-1).index_add_(0, flat, torch.tensor(vals, dtype=outcome.dtype, device=dev))

    has_tok = m.any(-1)  # (B,)
    lost = ~has_tok & (outcome != 0)  # (B,)
    if bool(lost.any()):
        b = int(lost.nonzero()[0, 0])
        raise ValueError(f"row {b} has a nonzero outcome reward but no agent token")
    pos = torch.arange(T, device=dev).expand(B, T)  # (B, T)
    last = torch.where(m, pos, -1).max(-1).values.clamp_min(0)  # (B,)
    rewards.scatter_add_(1, last.unsqueeze(1), (outcome * has_tok).unsqueeze(1))  # (B, 1)
    return rewards


def kl_in_reward(
    token_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    loss_mask: Tensor,
    coef: float,
    kind: KLKind = "k1",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Subtract ``coef * KL`` from the reward of each agent token (the PPO/InstructGPT way).

    ``token_rewards - coef * kl_penalty(logprobs, ref_logprobs, kind) * loss_mask``; env tokens
    and padding keep their reward (0). No gradient flows.

    Args:
        token_rewards (Tensor): (B, T).
        logprobs (Tensor): log-probs under the sampling policy, (B, T).
        ref_logprobs (Tensor): log-probs under the reference model, (B, T).
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        coef (float): KL coefficient beta, >= 0.
        kind (str): ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        tuple[Tensor, dict[str, Tensor]]: new token_rewards (B, T), and the metrics
            ``kl_reward/kl`` (token mean of the KL estimate) and ``kl_reward/penalty``
            (token mean of ``coef * KL``).

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    expect_bt(
        token_rewards=token_rewards,
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        loss_mask=loss_mask,
    )
    if coef < 0:
        raise ValueError(f"coef must be >= 0, got {coef}")
    with torch.no_grad():
        m = loss_mask.bool()
        kl = kl_penalty(logprobs.detach(), ref_logprobs.detach(), kind)  # (B, T)
        penalty = torch.where(m, coef * kl, torch.zeros_like(kl))
        out = token_rewards - penalty.to(token_rewards.dtype)
        metrics = {"kl_reward/kl": masked_mean(kl, m), "kl_reward/penalty": masked_mean(penalty, m)}
    return out, metrics


# ----------------------------------------------------------------------------- estimators


@register_adv_est("gae", uses_critic=True)
@torch.no_grad()
def gae(
    *,
    token_rewards: Tensor,
    loss_mask: Tensor,
    values: Tensor | None,
    group_ids: Tensor,
    gamma: float,
    lam: float,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """GAE over the agent's tokens only, bootstrapping across tool responses.

    Let t_1 < ... < t_n be the agent tokens of a row (``loss_mask`` 1). For each k:
        ``delta_k = r(t_k) + gamma * V(t_{k+1}) - V(t_k)``, with ``V(t_{n+1}) = 0``
        ``A(t_k) = delta_k + gamma * lam * A(t_{k+1})``
        ``returns(t_k) = A(t_k) + V(t_k)`` (before whitening)
    Env tokens between t_k and t_{k+1} are skipped: no reward, no value, no discount.
    ``norm_by_std=True`` whitens the advantages over all agent tokens of the batch (mean 0,
    std 1); ``False`` leaves them raw. ``group_ids`` is not used.

    Args:
        token_rewards (Tensor): (B, T), process and outcome rewards placed on agent tokens.
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        values (Tensor): critic values at rollout time, (B, T); required.
        group_ids (Tensor): (B,), long; unused.
        gamma (float): discount per agent token.
        lam (float): GAE lambda.
        norm_by_std (bool): whiten the advantages over the batch's agent tokens.
        eps (float): added to the std when whitening.

    Returns:
        tuple: advantages (B, T), returns (B, T), metrics (``adv/*``, ``adv/values_mean``).

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    _check_inputs(token_rewards, loss_mask, values, group_ids)
    if values is None:
        raise ValueError("gae needs values from a critic; pass values=(B, T)")
    m = loss_mask.bool()
    zeros = torch.zeros_like(token_rewards)
    r = torch.where(m, token_rewards, zeros)
    v = torch.where(m, values.to(token_rewards.dtype), zeros)
    next_v = _next_on_mask(v, m)  # (B, T): value of the next agent token, 0 after the last
    delta = r + gamma * next_v - v
    adv = _discounted_cumsum_on_mask(delta, m, gamma * lam)
    returns = torch.where(m, adv + v, zeros)
    if norm_by_std:
        adv = masked_whiten(adv, m, eps, scale=True)
    metrics = _metrics(adv, returns, token_rewards, m)
    metrics["adv/values_mean"] = masked_mean(v, m)
    return adv, returns, metrics


def group_spread(token_rewards: Tensor, loss_mask: Tensor, group_ids: Tensor) -> Tensor:
    """(B,) bool: whether row i's group has scores that differ, judged as grpo and rloo judge it
    (the sum of each row's agent-token rewards; a std within rounding of 0 is no spread). Where it
    is False, those estimators give every token of the group the advantage 0. DAPO's dynamic
    sampling (``algorithm.dynamic_sampling``) drops those groups."""
    _check_inputs(token_rewards, loss_mask, None, group_ids)
    score, scale = _scores(token_rewards, loss_mask.bool())
    return _group_stats(score, group_ids, scale)[3] > 0


def soft_overlong_penalty(lengths: Tensor, max_tokens: int, buffer: int) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), per trajectory:
    0 up to ``max_tokens - buffer`` tokens, then falling linearly to -1 at ``max_tokens``, and -1
    past it. ``lengths`` (B,) are the trajectories' agent-token counts; returns (B,) float32."""
    if not 0 < buffer <= max_tokens:
        raise ValueError(f"need 0 < buffer <= max_tokens, got buffer={buffer}, max_tokens={max_tokens}")
    n = lengths.to(torch.float32)
    start = float(max_tokens - buffer)
    return torch.where(n <= start, torch.zeros_like(n), torch.clamp((start - n) / buffer, min=-1.0))


def _per_trajectory(
    a: Tensor, score: Tensor, gstd: Tensor, token_rewards: Tensor, m: Tensor
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Spread per-trajectory advantages ``a`` (B,) and scores (B,) over the agent tokens ``m``
    (B, T); the shared tail of the group estimators (grpo, rloo)."""
    zeros = torch.zeros_like(token_rewards)
    a = torch.where(gstd > 0, a, torch.zeros_like(a))  # equal scores (up to rounding): no signal
    dt = token_rewards.dtype
    adv = torch.where(m, a.to(dt).unsqueeze(-1), zeros)  # (B,) -> (B, 1) -> (B, T)
    returns = torch.where(m, score.to(dt).unsqueeze(-1), zeros)  # (B,) -> (B, 1) -> (B, T)
    metrics = _metrics(adv, returns, token_rewards, m)
    metrics["adv/score_mean"] = score.mean().to(dt)
    metrics["adv/zero_std_group_frac"] = (gstd == 0).to(dt).mean()
    return adv, returns, metrics


@register_adv_est("grpo", needs_groups=True)
@torch.no_grad()
def grpo(
    *,
    token_rewards: Tensor,
    loss_mask: Tensor,
    values: Tensor | None,
    group_ids: Tensor,
    gamma: float,
    lam: float,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Group-normalized trajectory score, the same for every agent token of the trajectory.

    ``s_i = sum_t token_rewards[i, t] * loss_mask[i, t]`` (outcome + all process rewards)
    ``A_i = (s_i - mean_g(s)) / (std_g(s) + eps)``, or ``s_i - mean_g(s)`` when
    ``norm_by_std=False`` (Dr. GRPO), where g is row i's group and std_g is unbiased (0 for a
    group of one). Statistics are float64; a group whose std is within rounding of 0 (see
    ``_group_stats``) gets ``A_i = 0`` exactly and counts in ``adv/zero_std_group_frac``.
    ``advantages[i, t] = A_i`` and ``returns[i, t] = s_i`` on agent tokens.
    ``values``, ``gamma`` and ``lam`` are not used.

    Args:
        token_rewards (Tensor): (B, T).
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        values (Tensor | None): unused.
        group_ids (Tensor): (B,), long; rows with the same id share a prompt.
        gamma (float): unused.
        lam (float): unused.
        norm_by_std (bool): divide by the group std.
        eps (float): added to the group std.

    Returns:
        tuple: advantages (B, T), returns (B, T), metrics (``adv/*``,
            ``adv/score_mean``, ``adv/zero_std_group_frac``: share of trajectories whose group
            has all scores equal, so no learning signal).

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    _check_inputs(token_rewards, loss_mask, values, group_ids)
    m = loss_mask.bool()
    score, scale = _scores(token_rewards, m)  # each (B,), float64
    _, _, gmean, gstd = _group_stats(score, group_ids, scale)  # each (B,), float64
    a = (score - gmean) / (gstd + eps) if norm_by_std else score - gmean  # (B,)
    return _per_trajectory(a, score, gstd, token_rewards, m)


@register_adv_est("rloo", needs_groups=True)
@torch.no_grad()
def rloo(
    *,
    token_rewards: Tensor,
    loss_mask: Tensor,
    values: Tensor | None,
    group_ids: Tensor,
    gamma: float,
    lam: float,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """REINFORCE leave-one-out: the trajectory score minus the mean score of the rest of its
    group, the same for every agent token of the trajectory.

    ``s_i = sum_t token_rewards[i, t] * loss_mask[i, t]``
    ``A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1)``
    ``advantages[i, t] = A_i`` and ``returns[i, t] = s_i`` on agent tokens; 0 in a group whose
    scores are equal up to rounding (float64 statistics, as in grpo). A group of one
    raises ``ValueError``. ``values``, ``gamma``, ``lam``, ``norm_by_std`` and ``eps`` are not
    used (RLOO does not scale by a std).

    Args:
        token_rewards (Tensor): (B, T).
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        values (Tensor | None): unused.
        group_ids (Tensor): (B,), long; every group needs at least 2 rows.
        gamma, lam, norm_by_std, eps: unused.

    Returns:
        tuple: advantages (B, T), returns (B, T), metrics (``adv/*``, ``adv/score_mean``,
            ``adv/zero_std_group_frac``).

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    _check_inputs(token_rewards, loss_mask, values, group_ids)
    m = loss_mask.bool()
    score, scale = _scores(token_rewards, m)  # each (B,), float64
    gsum, gcnt, _, gstd = _group_stats(score, group_ids, scale)  # each (B,), float64
    if bool((gcnt < 2).any()):
        bad = group_ids[gcnt < 2].unique().tolist()
        raise ValueError(f"rloo needs at least 2 trajectories per group; groups of one: {bad}")
    a = score - (gsum - score) / (gcnt - 1)  # (B,)
    return _per_trajectory(a, score, gstd, token_rewards, m)


@register_adv_est("reinforce_pp")
@torch.no_grad()
def reinforce_pp(
    *,
    token_rewards: Tensor,
    loss_mask: Tensor,
    values: Tensor | None,
    group_ids: Tensor,
    gamma: float,
    lam: float,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """REINFORCE++: discounted return-to-go over agent tokens, whitened over the batch.

    Let t_1 < ... < t_n be the agent tokens of a row:
        ``G(t_k) = r(t_k) + gamma * G(t_{k+1})``, ``G(t_{n+1}) = 0`` (env tokens skipped)
        ``A = (G - mean(G)) / (std(G) + eps)`` over every agent token of the batch, or
        ``G - mean(G)`` when ``norm_by_std=False``.
    ``returns`` is G. A step's process reward reaches the tokens of that step and earlier
    steps only. ``values``, ``group_ids`` and ``lam`` are not used.

    Args:
        token_rewards (Tensor): (B, T); fold a KL penalty in first with ``kl_in_reward``.
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        values (Tensor | None): unused.
        group_ids (Tensor): (B,), long; unused.
        gamma (float): discount per agent token.
        lam (float): unused.
        norm_by_std (bool): divide by the batch std (after centering).
        eps (float): added to the std.

    Returns:
        tuple: advantages (B, T), returns (B, T), metrics (``adv/*``).

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    _check_inputs(token_rewards, loss_mask, values, group_ids)
    m = loss_mask.bool()
    returns = _discounted_cumsum_on_mask(token_rewards, m, gamma)  # (B, T)
    adv = masked_whiten(returns, m, eps, scale=norm_by_std)
    return adv, returns, _metrics(adv, returns, token_rewards, m)
