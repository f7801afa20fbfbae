"""Advantage estimators and losses: pure functions of tensors, chosen by name.

See ``docs/algorithms.md`` for the formulas, the registry names and the metrics. The registries
and their ``register_*`` decorators live in the torch-free ``trainers.algos.registry`` (a config is
checked without importing torch); the functions load on first access of any other name here.
"""

from __future__ import annotations

import importlib
from typing import Any

from .registry import (
    ADV_ESTIMATORS,
    AGG_UNITS,
    AGGREGATIONS,
    KL_KINDS,
    NEEDS_GROUPS,
    USES_CRITIC,
    register_adv_est,
    register_agg,
    register_kl,
)

_ADVANTAGES = (
    "AdvEstimator",
    "gae",
    "get_adv_est",
    "group_spread",
    "grpo",
    "kl_in_reward",
    "place_rewards",
    "reinforce_pp",
    "rloo",
    "soft_overlong_penalty",
)
_LOSSES = (
    "KLKind",
    "aggregate",
    "behaviour_weights",
    "entropy_from_logits",
    "get_agg",
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "policy_loss",
    "value_loss",
)


def __getattr__(name: str) -> Any:
    module = "advantages" if name in _ADVANTAGES else "losses" if name in _LOSSES else None
    if module is None:
        raise AttributeError(f"module 'trainers.algos' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "ADV_ESTIMATORS",
    "AGGREGATIONS",
    "AGG_UNITS",
    "AdvEstimator",
    "KLKind",
    "KL_KINDS",
    "NEEDS_GROUPS",
    "USES_CRITIC",
    "aggregate",
    "behaviour_weights",
    "entropy_from_logits",
    "gae",
    "get_adv_est",
    "get_agg",
    "group_spread",
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
    "soft_overlong_penalty",
    "value_loss",
]
