"""Advantage estimators and losses: pure functions of tensors, chosen by name.

See ``docs/algorithms.md`` for the formulas, the registry names and the metrics.
"""

from .advantages import (
    ADV_ESTIMATORS,
    USES_CRITIC,
    AdvEstimator,
    gae,
    get_adv_est,
    grpo,
    kl_in_reward,
    place_rewards,
    register_adv_est,
    reinforce_pp,
    rloo,
)
from .losses import (
    AGGREGATIONS,
    KL_KINDS,
    KLKind,
    aggregate,
    entropy_from_logits,
    get_agg,
    kl_loss,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    policy_loss,
    register_agg,
    register_kl,
    value_loss,
)

__all__ = [
    "ADV_ESTIMATORS",
    "AGGREGATIONS",
    "KL_KINDS",
    "USES_CRITIC",
    "AdvEstimator",
    "KLKind",
    "aggregate",
    "entropy_from_logits",
    "gae",
    "get_adv_est",
    "get_agg",
    "grpo",
    "kl_in_reward",
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "place_rewards",
    "policy_loss",
    "register_adv_est",
    "register_agg",
    "register_kl",
    "reinforce_pp",
    "rloo",
    "value_loss",
]
