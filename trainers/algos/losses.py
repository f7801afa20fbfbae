"""Token-level losses for RL on multi-turn tool-using trajectories: pure functions of tensors.

Notation used for tensor shapes:
    - B: batch of trajectories
    - T: padded token length of the whole multi-turn trajectory (prompt, agent turns, tool
      responses, padding)
    - V: vocabulary size

Every loss takes the single ``loss_mask`` (B, T) that the env built: 1 exactly on the agent's
generated tokens, 0 on prompt, template, tool-output and padding tokens. Loss functions return
``(loss, metrics)``: ``loss`` is a 0-d tensor that carries the gradient, ``metrics`` maps names to
detached 0-d tensors (token means over the mask unless said otherwise). Nothing here calls
``.item()``, so nothing here forces a device sync. Per-token primitives (``kl_penalty``,
``entropy_from_logits``, ``logprobs_from_logits``) return a bare (B, T) tensor.

Where this departs from the papers:
    - ``policy_loss``: PPO (Schulman et al. 2017, arXiv 1707.06347) uses one symmetric clip
      range; here ``clip_low`` and ``clip_high`` may differ (the "clip-higher" of DAPO, arXiv
      2503.14476). The log-ratio is clamped to [-20, 20] before ``exp`` so that one stale token
      cannot overflow the ratio (PPO does not clamp; verl does the same clamp). Dual clip
      follows Ye et al. 2020 (arXiv 1912.09729): for negative advantages the per-token loss is
      capped at ``-c * A``.
    - ``value_loss``: the clipped value loss of the PPO2 baselines code (it is not in the PPO
      paper), with the 0.5 factor. ``clip_eps=None`` gives the plain squared error.
    - ``kl_penalty``: the k1/k2/k3 estimators of Schulman's note "Approximating KL divergence"
      (http://joschu.net/blog/kl-approx.html) for KL(pi || ref) with tokens sampled from pi. k3
      clamps its log-ratio to [-20, 20] before ``exp`` (the note does not).
    - ``aggregate``: the paper losses are written per sequence; the three modes are the ones
      that verl exposes (``loss_agg_mode``). Unlike verl, rows whose mask is all zero are left
      out of the sequence means instead of giving NaN (token-mean) or diluting the mean.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import torch
from torch import Tensor

__all__ = [
    "AGGREGATIONS",
    "AGG_UNITS",
    "STD_RTOL",
    "KLKind",
    "aggregate",
    "register_kl",
    "entropy_from_logits",
    "get_agg",
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_mean_std",
    "masked_stats_f64",
    "masked_whiten",
    "policy_loss",
    "register_agg",
    "value_loss",
]

KLKind = Literal["k1", "k2", "k3"]
from .registry import AGG_UNITS, AGGREGATIONS, KL_KINDS, register_agg, register_kl, resolve  # noqa: E402


@register_kl("k1")
def _kl_k1(d: Tensor) -> Tensor:
    return d


@register_kl("k2")
def _kl_k2(d: Tensor) -> Tensor:
    return 0.5 * d.square()


@register_kl("k3")
def _kl_k3(d: Tensor) -> Tensor:
    neg = (-d).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(neg) - neg - 1.0


# exp(20) ~ 4.9e8: far outside any clip range, still finite in float32 and bfloat16.
_MAX_LOG_RATIO = 20.0


# ----------------------------------------------------------------------------- shape helpers


def expect_shape(name: str, x: Tensor, shape: tuple[int, ...]) -> None:
    """Raise ``ValueError`` unless ``x.shape == shape`` (not ``assert``: it survives ``-O``)."""
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


def expect_bt(**tensors: Tensor) -> tuple[int, int]:
    """Check that every tensor given is 2-D and that they all share one (B, T); return it."""
    items = list(tensors.items())
    name0, x0 = items[0]
    if x0.dim() != 2:
        raise ValueError(f"{name0} must be (B, T), got shape {tuple(x0.shape)}")
    B, T = x0.shape
    for name, x in items[1:]:
        expect_shape(name, x, (B, T))
    return B, T


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1; 0 when the mask is empty.

    ``torch.where`` rather than ``x * mask``: a NaN or inf at a masked-out position (padding)
    must not leak into the result.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros_like(x)).sum()
    return total / m.sum().clamp_min(1)


# A std at or below STD_RTOL times the scale of the values is treated as exactly 0: the values
# are equal up to float rounding (0.2 + 1.0 and -0.3 + 0.5 + 1.0 differ in the last float32
# bits), and dividing their rounding noise by ``std + eps`` would hand out advantages of ~0.1.
STD_RTOL = 1e-5


def masked_stats_f64(x: Tensor, mask: Tensor, rtol: float = STD_RTOL) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std of ``x`` over the masked positions, computed in float64.

    Returns float64 0-d tensors. The std is 0 when fewer than 2 positions are masked, and is
    set to exactly 0 when it is at or below ``rtol * max|x|`` over the masked positions (which
    is at least ``rtol * |mean|``): such values are equal up to rounding.
    """
    m = mask.bool()
    x64 = x.detach().to(torch.float64)
    zeros = torch.zeros_like(x64)
    n = m.sum()
    mean = torch.where(m, x64, zeros).sum() / n.clamp_min(1)
    sq = torch.where(m, (x64 - mean) ** 2, zeros).sum()
    std = (sq / (n - 1).clamp_min(1)).sqrt()
    scale = torch.where(m, x64.abs(), zeros).amax() if x64.numel() else x64.new_zeros(())
    std = torch.where(std <= rtol * scale, torch.zeros_like(std), std)
    return mean, std


def masked_mean_std(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std of ``x`` over the masked positions (0 and 0 when fewer than 2).

    Computed in float64 by ``masked_stats_f64`` (a std within rounding of 0 is 0) and returned
    in ``x``'s dtype (float32 for an integer ``x``). No gradient flows.
    """
    out = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    mean, std = masked_stats_f64(x, mask)
    return mean.to(out), std.to(out)


def masked_whiten(x: Tensor, mask: Tensor, eps: float, scale: bool = True) -> Tensor:
    """Center ``x`` on its mean over the masked positions and divide by ``std + eps`` when
    ``scale``; 0 off the mask. Statistics and arithmetic in float64, result in ``x``'s dtype.

    When the std is 0 (fewer than 2 positions, or all values equal up to rounding, see
    ``masked_stats_f64``) every result is exactly 0: equal values carry no signal.
    """
    m = mask.bool()
    mean, std = masked_stats_f64(x, m)
    x64 = x.detach().to(torch.float64)
    y = (x64 - mean) / (std + eps) if scale else x64 - mean
    keep = m & (std > 0)
    return torch.where(keep, y, torch.zeros_like(y)).to(x.dtype)


# ----------------------------------------------------------------------------- aggregation

AggFn = Callable[[Tensor, Tensor], Tensor]
AggUnits = Callable[[Tensor], Tensor]


def get_agg(name: str) -> AggFn:
    """The aggregation registered under ``name``; an unknown name raises listing valid ones."""
    try:
        return resolve(AGGREGATIONS, name)
    except KeyError:
        raise ValueError(f"unknown loss aggregation {name!r}; valid: {', '.join(sorted(AGGREGATIONS))}") from None


def _loss_tokens(mask: Tensor) -> Tensor:
    return (mask > 0).sum()


def _rows_with_loss_tokens(mask: Tensor) -> Tensor:
    return (mask > 0).any(-1).sum()


@register_agg("token-mean", units=_loss_tokens)
def _token_mean(loss_mat: Tensor, mask: Tensor) -> Tensor:
    # Every agent token in the batch weighs the same (DAPO); long trajectories weigh more.
    return masked_mean(loss_mat, mask)


@register_agg("seq-mean-token-sum", units=_rows_with_loss_tokens)
def _seq_mean_token_sum(loss_mat: Tensor, mask: Tensor) -> Tensor:
    m = mask.bool()
    seq = torch.where(m, loss_mat, torch.zeros_like(loss_mat)).sum(-1)  # (B,)
    has_tokens = m.any(-1)  # (B,)
    return seq.sum() / has_tokens.sum().clamp_min(1)


@register_agg("seq-mean-token-mean", units=_rows_with_loss_tokens)
def _seq_mean_token_mean(loss_mat: Tensor, mask: Tensor) -> Tensor:
    # Each trajectory weighs the same whatever its length (the GRPO paper's 1/|o_i|).
    m = mask.bool()
    n_tok = m.sum(-1)  # (B,)
    seq = torch.where(m, loss_mat, torch.zeros_like(loss_mat)).sum(-1) / n_tok.clamp_min(1)
    has_tokens = n_tok > 0  # (B,)
    return seq.sum() / has_tokens.sum().clamp_min(1)


def aggregate(loss_mat: Tensor, mask: Tensor, mode: str = "token-mean", **kwargs: Any) -> Tensor:
    """Reduce a per-token loss to a scalar over the agent's tokens.

    Modes (registry ``AGGREGATIONS``):
        - ``token-mean``: sum over all masked tokens / number of masked tokens.
        - ``seq-mean-token-sum``: per row, the sum over its masked tokens; then the mean over
          rows that have at least one masked token.
        - ``seq-mean-token-mean``: per row, the mean over its masked tokens; then the mean over
          rows that have at least one masked token.
    An all-zero mask gives 0 (with a zero gradient), never NaN.

    Args:
        loss_mat (Tensor): per-token loss, (B, T).
        mask (Tensor): loss mask, (B, T), bool or 0/1 float.
        mode (str): a name in ``AGGREGATIONS``.
        **kwargs: the aggregation's own keyword parameters (the config's ``algorithm.loss_kwargs``).

    Returns:
        Tensor: 0-d loss.

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    fn = get_agg(mode)
    expect_bt(loss_mat=loss_mat, mask=mask)
    return fn(loss_mat, mask, **kwargs)


# ----------------------------------------------------------------------------- per-token primitives


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KLKind = "k3") -> Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled from pi.

    With ``d = logprobs - ref_logprobs``:
        - ``k1``: ``d`` (unbiased, high variance, can be negative)
        - ``k2``: ``0.5 * d**2`` (biased, low variance, >= 0)
        - ``k3``: ``exp(-d) - (-d) - 1`` (unbiased, low variance, >= 0); ``-d`` is clamped to
          [-20, 20] before ``exp``.

    Args:
        logprobs (Tensor): log pi(token), (B, T).
        ref_logprobs (Tensor): log ref(token), (B, T).
        kind (str): ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        Tensor: per-token KL estimate, (B, T). Masked-out positions are not zeroed here.

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    expect_bt(logprobs=logprobs, ref_logprobs=ref_logprobs)
    fn = resolve(KL_KINDS, kind) if kind in KL_KINDS else None
    if fn is None:
        raise ValueError(f"unknown KL kind {kind!r}; valid: {', '.join(sorted(KL_KINDS))}")
    return fn(logprobs - ref_logprobs)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax distribution at each position, numerically stable.

    ``H = -sum_v p_v log p_v`` from one ``log_softmax`` (``p = exp(log p)``): fewer passes over
    the (B, T, V) logits than ``logsumexp(z) - sum_v softmax(z)_v z_v`` (the entropy monitor,
    ``policy/entropy``, computes it on every update) and closer to the float64 value. Logits of
    ``-inf`` (a masked vocabulary) are allowed: they are raised to the dtype's finite minimum
    first, where their probability is exactly 0 (``0 * log p = 0``), so neither the value nor the
    gradient becomes NaN.

    Args:
        logits (Tensor): (B, T, V).

    Returns:
        Tensor: entropy in nats, (B, T).

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
        - V: vocabulary size
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}")
    logp = torch.log_softmax(logits.clamp_min(torch.finfo(logits.dtype).min), dim=-1)  # (B, T, V)
    return -(logp.exp() * logp).sum(-1)


def logprobs_from_logits(logits: Tensor, ids: Tensor) -> Tensor:
    """Log-probability of ``ids`` under ``logits``, position by position.

    No shift is done here: ``logits[:, t]`` scores ``ids[:, t]``. The caller aligns them (for a
    causal LM, the logits at position t-1 score the token at t).

    Args:
        logits (Tensor): (B, T, V).
        ids (Tensor): token ids, (B, T), integer.

    Returns:
        Tensor: log p(ids), (B, T).

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
        - V: vocabulary size
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}")
    expect_shape("ids", ids, tuple(logits.shape[:2]))
    # logsumexp + gather avoids materializing a second (B, T, V) tensor of log-softmax.
    picked = logits.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)  # (B, T, 1) -> (B, T)
    return picked - torch.logsumexp(logits, dim=-1)


# ----------------------------------------------------------------------------- losses


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = None,
    agg: str = "token-mean",
    agg_kwargs: dict[str, Any] | None = None,
    behaviour_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, with optional dual clip, over the agent's tokens.

    With ``ratio = exp(logprobs - old_logprobs)`` and advantage ``A`` per token:
        ``L = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``
    and, when ``dual_clip_c = c`` is given (c > 1), for tokens with ``A < 0``:
        ``L = min(L, -c * A)``
    then, with ``behaviour_weights = w`` (the decoupled objective of off-policy trajectories,
    ``behaviour_weights`` below), ``L = w * L``; then ``loss = aggregate(L, loss_mask, agg)``.

    Args:
        logprobs (Tensor): log-probs under the policy being trained, with grad, (B, T).
        old_logprobs (Tensor): log-probs under the policy that sampled the batch, (B, T).
        advantages (Tensor): per-token advantages, (B, T).
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        clip_low (float): lower clip range, ratio >= 1 - clip_low; in [0, 1).
        clip_high (float): upper clip range, ratio <= 1 + clip_high; >= 0.
        dual_clip_c (float | None): dual-clip constant c > 1, or None for no dual clip.
        agg (str): a name in ``AGGREGATIONS``; agg_kwargs: its own keyword parameters (``loss_kwargs``).
        behaviour_weights (Tensor | None): (B, T), no grad: per-token weights for trajectories
            sampled by an older (behaviour) policy than ``old_logprobs``' proximal one, e.g.
            ``behaviour_weights(old_logprobs, sampler_logprobs, loss_mask, cap)``; None: all 1.

    Returns:
        tuple[Tensor, dict[str, Tensor]]: the 0-d loss and the metrics
            ``policy/loss``, ``policy/clipfrac``, ``policy/dual_clipfrac``,
            ``policy/approx_kl``, ``policy/ratio_mean``, ``policy/ratio_max``.

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    expect_bt(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, loss_mask=loss_mask)
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")

    log_ratio = (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    if dual_clip_c is not None:
        capped = torch.minimum(pg, -dual_clip_c * advantages)
        dual_active = (advantages < 0) & (pg > -dual_clip_c * advantages)
        pg = torch.where(advantages < 0, capped, pg)
    else:
        dual_active = torch.zeros_like(pg, dtype=torch.bool)
    if behaviour_weights is not None:
        expect_bt(behaviour_weights=behaviour_weights, loss_mask=loss_mask)
        pg = behaviour_weights.detach() * pg

    loss = aggregate(pg, loss_mask, agg, **(agg_kwargs or {}))
    with torch.no_grad():
        m = loss_mask.bool()
        metrics = {
            "policy/loss": loss.detach(),
            "policy/clipfrac": masked_mean((pg_clipped > pg_unclipped).float(), m),
            "policy/dual_clipfrac": masked_mean(dual_active.float(), m),
            # KL(old || new) from tokens sampled by old: k3 with the roles of the two swapped.
            "policy/approx_kl": masked_mean(kl_penalty(old_logprobs, logprobs.detach(), "k3"), m),
            "policy/ratio_mean": masked_mean(ratio.detach(), m),
            # ratio > 0, so a 0 at masked-out positions never wins unless the mask is empty.
            "policy/ratio_max": torch.where(m, ratio.detach(), torch.zeros_like(ratio)).max(),
        }
    return loss, metrics


def behaviour_weights(
    old_logprobs: Tensor, sampler_logprobs: Tensor, loss_mask: Tensor, cap: float = 2.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance weights of the proximal policy over the behaviour policy.

    ``w = min(exp(old_logprobs - sampler_logprobs), cap)`` on the agent's tokens, 1 elsewhere: the
    factor of the decoupled PPO objective (Hilton et al. 2021, "Batch size-invariance for policy
    optimization", arXiv 2110.00641), where PPO's ratio is taken against the proximal policy
    (``old_logprobs``, recomputed by the learner before the update) while the tokens were sampled
    by an older behaviour policy (``sampler_logprobs``, recorded by the sampler), truncated at
    ``cap`` as in truncated importance sampling (Yao et al. 2025; cap 2). The log-ratio is clamped
    to +-20 before ``exp``, as the policy ratio is.

    Returns:
        tuple[Tensor, dict[str, Tensor]]: ``w`` (B, T) and the metrics ``policy/is_weight_mean``,
            ``policy/is_weight_max`` (before truncation) and ``policy/is_truncated_frac``.
    """
    expect_bt(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, loss_mask=loss_mask)
    if not cap >= 1.0:
        raise ValueError(f"cap must be >= 1, got {cap}")
    m = loss_mask.bool()
    raw = torch.exp((old_logprobs - sampler_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    raw = torch.where(m, raw, torch.ones_like(raw))
    w = raw.clamp(max=cap)
    metrics = {
        "policy/is_weight_mean": masked_mean(w, m),
        "policy/is_weight_max": torch.where(m, raw, torch.zeros_like(raw)).max(),
        "policy/is_truncated_frac": masked_mean((raw > cap).float(), m),
    }
    return w, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    *,
    clip_eps: float | None = 0.2,
    agg: str = "token-mean",
    agg_kwargs: dict[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss over the agent's tokens.

    ``v_clip = old_values + clip(values - old_values, -clip_eps, clip_eps)``
    ``L = 0.5 * max((values - returns)**2, (v_clip - returns)**2)``;
    with ``clip_eps=None``: ``L = 0.5 * (values - returns)**2``. Then
    ``loss = aggregate(L, loss_mask, agg)``.

    Args:
        values (Tensor): critic predictions with grad, (B, T).
        old_values (Tensor): critic predictions at rollout time, (B, T).
        returns (Tensor): value targets (GAE advantages + old values), (B, T).
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        clip_eps (float | None): clip range around ``old_values``; None for no clipping.
        agg (str): a name in ``AGGREGATIONS``; agg_kwargs: its own keyword parameters (``loss_kwargs``).

    Returns:
        tuple[Tensor, dict[str, Tensor]]: the 0-d loss and the metrics ``value/loss``,
            ``value/clipfrac``, ``value/explained_var``, ``value/pred_mean``.
            ``explained_var = 1 - Var(returns - values) / Var(returns)`` over masked tokens;
            0 when the returns are constant up to rounding at the scale of the returns and
            values they were computed from.

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    expect_bt(values=values, old_values=old_values, returns=returns, loss_mask=loss_mask)
    if clip_eps is not None and clip_eps < 0.0:
        raise ValueError(f"clip_eps must be >= 0 or None, got {clip_eps}")

    vf_unclipped = (values - returns).square()
    if clip_eps is None:
        vf = vf_unclipped
        clipped_active = torch.zeros_like(vf, dtype=torch.bool)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        vf_clipped = (v_clip - returns).square()
        vf = torch.maximum(vf_unclipped, vf_clipped)
        clipped_active = vf_clipped > vf_unclipped
    loss = aggregate(0.5 * vf, loss_mask, agg, **(agg_kwargs or {}))

    with torch.no_grad():
        m = loss_mask.bool()
        v = values.detach()
        _, ret_std = masked_mean_std(returns, m)
        _, res_std = masked_mean_std(returns - v, m)
        # Returns are computed from the values (GAE: advantages + old values), so returns that are
        # constant in truth (an all-zero-reward micro-batch) come out as float32 noise of the values'
        # size: constant up to that rounding counts as constant (else 1 - Var(res)/Var(noise) ~ -1e13).
        scale = (
            torch.where(
                m, torch.maximum(returns.abs(), torch.maximum(v.abs(), old_values.abs())), torch.zeros_like(v)
            ).amax()
            if m.any()
            else v.new_zeros(())
        )
        var_ret = torch.where(ret_std > STD_RTOL * scale, ret_std, torch.zeros_like(ret_std)).square()
        explained = torch.where(
            var_ret > 0, 1.0 - res_std.square() / var_ret.clamp_min(1e-30), torch.zeros_like(var_ret)
        )
        metrics = {
            "value/loss": loss.detach(),
            "value/clipfrac": masked_mean(clipped_active.float(), m),
            "value/explained_var": explained,
            "value/pred_mean": masked_mean(v, m),
        }
    return loss, metrics


def kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    loss_mask: Tensor,
    kind: KLKind = "k3",
    agg: str = "token-mean",
    agg_kwargs: dict[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL(pi || ref) as a loss term over the agent's tokens (the GRPO way; the coefficient is
    applied by the caller).

    ``loss = aggregate(kl_penalty(logprobs, ref_logprobs, kind), loss_mask, agg)``.

    Args:
        logprobs (Tensor): log-probs under the policy being trained, with grad, (B, T).
        ref_logprobs (Tensor): log-probs under the reference model, (B, T).
        loss_mask (Tensor): 1 on agent tokens, (B, T).
        kind (str): ``"k1"``, ``"k2"`` or ``"k3"``.
        agg (str): a name in ``AGGREGATIONS``; agg_kwargs: its own keyword parameters (``loss_kwargs``).

    Returns:
        tuple[Tensor, dict[str, Tensor]]: the 0-d loss and the metric ``kl/loss``.

    Notation used for tensor shapes:
        - B: batch of trajectories
        - T: padded token length
    """
    expect_bt(logprobs=logprobs, ref_logprobs=ref_logprobs, loss_mask=loss_mask)
    kl = kl_penalty(logprobs, ref_logprobs.detach(), kind)  # (B, T)
    loss = aggregate(kl, loss_mask, agg, **(agg_kwargs or {}))
    return loss, {"kl/loss": loss.detach()}
