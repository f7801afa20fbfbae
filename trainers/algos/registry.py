"""The registries of advantage estimators, loss aggregations and KL kinds: torch-free.

A config names its estimator, aggregation and KL kind (``algorithm.adv_estimator``,
``algorithm.loss_agg``, ``algorithm.kl_kind``) and passes them free keyword arguments
(``algorithm.adv_kwargs``, ``algorithm.loss_kwargs``). ``trainers.config`` checks those names and
keys here without importing torch: the built-in functions are declared by entry point
(``"module:function"``, as Gymnasium registers env ids) and replaced by the function itself when
their module is imported (``trainers.algos.advantages`` and ``losses`` register them with the same
decorators a plugin uses). ``resolve`` imports a declared entry on first use.

Each registration records the keyword parameters the function takes beyond the ones the trainer
passes itself (``ADV_PARAMS``, ``AGG_PARAMS``), so that ``adv_kwargs: {tau: 0.5}`` is checked at
start against the estimator's signature (``None``: the function takes ``**kwargs``, any key goes).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, Callable

ADV_ESTIMATORS: dict[str, Any] = {}
"""name -> estimator, or its ``"module:function"`` entry point until that module is imported."""
USES_CRITIC: dict[str, bool] = {}
"""name -> whether the estimator needs a critic's values (the trainer builds one only then)."""
NEEDS_GROUPS: dict[str, bool] = {}
"""name -> whether the estimator compares the trajectories of a group (the config then asks for
``group_size >= 2``)."""
ADV_PARAMS: dict[str, frozenset[str] | None] = {}
"""name -> the keyword parameters ``adv_kwargs`` may set (None: any)."""
AGGREGATIONS: dict[str, Any] = {}
"""name -> ``fn(loss_mat (B,T), mask (B,T), **loss_kwargs) -> 0-d``, or its entry point."""
AGG_UNITS: dict[str, Any] = {}
"""name -> ``units(mask (B,T)) -> 0-d`` count of the aggregation's denominator (or its entry
point), for the aggregations registered with ``units=`` (micro-batching and FSDP re-weight by it)."""
AGG_PARAMS: dict[str, frozenset[str] | None] = {}
"""name -> the keyword parameters ``loss_kwargs`` may set (None: any)."""
KL_KINDS: dict[str, Any] = {}
"""name -> per-token KL estimate ``fn(d = logprobs - ref_logprobs (B,T)) -> (B,T)``, or its entry point."""

ADV_TRAINER_ARGS = frozenset({"token_rewards", "loss_mask", "values", "group_ids", "gamma", "lam", "norm_by_std"})
"""What the trainer passes every estimator itself: ``adv_kwargs`` cannot set these (``gamma``,
``lam`` and ``norm_adv_by_std`` are keys of the algorithm section)."""
AGG_TRAINER_ARGS = frozenset({"loss_mat", "mask"})

_ADV = "trainers.algos.advantages"
_LOSS = "trainers.algos.losses"
for _name, _fn, _critic, _groups in (
    ("gae", "gae", True, False),
    ("grpo", "grpo", False, True),
    ("rloo", "rloo", False, True),
    ("reinforce_pp", "reinforce_pp", False, False),
):
    ADV_ESTIMATORS[_name], USES_CRITIC[_name], NEEDS_GROUPS[_name] = f"{_ADV}:{_fn}", _critic, _groups
    ADV_PARAMS[_name] = frozenset({"eps"})
for _name, _fn, _units in (
    ("token-mean", "_token_mean", "_loss_tokens"),
    ("seq-mean-token-sum", "_seq_mean_token_sum", "_rows_with_loss_tokens"),
    ("seq-mean-token-mean", "_seq_mean_token_mean", "_rows_with_loss_tokens"),
):
    AGGREGATIONS[_name], AGG_UNITS[_name], AGG_PARAMS[_name] = f"{_LOSS}:{_fn}", f"{_LOSS}:{_units}", frozenset()
for _name in ("k1", "k2", "k3"):
    KL_KINDS[_name] = f"{_LOSS}:_kl_{_name}"


def entry_point(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"


def resolve(registry: dict[str, Any], name: str) -> Any:
    """``registry[name]``, importing a declared entry point (and storing the function) on first use."""
    value = registry[name]
    if isinstance(value, str):
        module, attr = value.split(":")
        importlib.import_module(module)  # its decorators replace the entry point by the function
        value = registry[name]
        if isinstance(value, str):
            value = registry[name] = getattr(importlib.import_module(module), attr)
    return value


def keyword_params(fn: Callable[..., Any], fixed: frozenset[str]) -> frozenset[str] | None:
    """The keyword parameters of ``fn`` beyond ``fixed`` (None when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)) - fixed


def _same(old: Any, fn: Any) -> bool:
    return old is fn or (isinstance(old, str) and old == entry_point(fn))


def _check_free(registry: dict[str, Any], what: str, name: str, fn: Any, **meta: tuple[dict[str, Any], Any]) -> None:
    old = registry.get(name)
    if old is None:
        return
    if not _same(old, fn):
        raise ValueError(f"{what} {name!r} is already registered to {old!r}")
    for key, (table, value) in meta.items():
        if table.get(name) != value:
            raise ValueError(f"{what} {name!r} is already registered with {key}={table.get(name)!r}")


def register_adv_est(name: str, *, uses_critic: bool = False, needs_groups: bool = False) -> Callable[[Any], Any]:
    """Register an advantage estimator under ``name``; ``uses_critic=True`` when it reads ``values``,
    ``needs_groups=True`` when it compares each trajectory with the others of its group (grpo, rloo),
    so that a config with ``group_size < 2`` is refused.

    The estimator is called ``fn(*, token_rewards, loss_mask, values, group_ids, gamma, lam,
    norm_by_std, **adv_kwargs)``: its own hyperparameters are further keyword parameters, set from
    the config's ``algorithm.adv_kwargs`` (checked against the signature at start).

    Registering the same function twice is a no-op; a different function (or a different
    ``uses_critic`` or ``needs_groups``) under a name already taken raises ``ValueError``. A
    registered name is selectable from YAML (``algorithm: {adv_estimator: NAME}``); a module that
    registers one is loaded before the config is checked by ``plugins: [MODULE]`` or ``--plugin``.
    """

    def deco(fn: Any) -> Any:
        _check_free(
            ADV_ESTIMATORS,
            "advantage estimator",
            name,
            fn,
            uses_critic=(USES_CRITIC, uses_critic),
            needs_groups=(NEEDS_GROUPS, needs_groups),
        )
        ADV_ESTIMATORS[name], USES_CRITIC[name], NEEDS_GROUPS[name] = fn, uses_critic, needs_groups
        ADV_PARAMS[name] = keyword_params(fn, ADV_TRAINER_ARGS)
        return fn

    return deco


def register_agg(name: str, *, units: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """Register a loss aggregation ``fn(loss_mat (B,T), mask (B,T), **loss_kwargs) -> 0-d`` under ``name``.

    ``units(mask) -> 0-d`` counts what ``fn`` divides by (token-mean: loss tokens; the seq-mean
    modes: rows with a loss token), so that ``fn`` over a minibatch equals the sum over a split of
    its rows of ``units(part) / units(whole) * fn(part)``. Without it the aggregation works on
    whole minibatches but ``max_tokens_per_microbatch`` and ``fsdp`` refuse it. Further keyword
    parameters of ``fn`` are set from the config's ``algorithm.loss_kwargs``.

    Registering the same function (and units) again is a no-op; a different function or
    different ``units`` under a name already taken raises ``ValueError``.
    """

    def deco(fn: Any) -> Any:
        old_units = AGG_UNITS.get(name)
        if name in AGGREGATIONS and not (old_units is units or (units is not None and _same(old_units, units))):
            if not _same(AGGREGATIONS[name], fn):
                raise ValueError(f"loss aggregation {name!r} is already registered to {AGGREGATIONS[name]!r}")
            raise ValueError(f"loss aggregation {name!r} is already registered with units={old_units!r}")
        _check_free(AGGREGATIONS, "loss aggregation", name, fn)
        AGGREGATIONS[name] = fn
        if units is not None:
            AGG_UNITS[name] = units
        AGG_PARAMS[name] = keyword_params(fn, AGG_TRAINER_ARGS)
        return fn

    return deco


def register_kl(name: str) -> Callable[[Any], Any]:
    """Register a KL estimator ``fn(d) -> (B, T)`` under ``name`` (selectable as ``kl_kind: NAME``).
    A different function under a name already taken raises ``ValueError``."""

    def deco(fn: Any) -> Any:
        _check_free(KL_KINDS, "KL kind", name, fn)
        KL_KINDS[name] = fn
        return fn

    return deco


def check_kwargs(
    what: str, name: str, kwargs: dict[str, Any], params: frozenset[str] | None, fixed: frozenset[str]
) -> str | None:
    """Why ``kwargs`` cannot be passed to the registered ``name`` (None when they can)."""
    bad = sorted(k for k in kwargs if not isinstance(k, str) or k in fixed or (params is not None and k not in params))
    if not bad:
        return None
    takes = "any keyword" if params is None else (", ".join(sorted(params)) or "no further keyword arguments")
    hints = []
    for k in bad:
        if k in fixed:
            hints.append(f"{k!r} (passed by the trainer itself)")
        else:
            close = difflib.get_close_matches(str(k), sorted(params or ()), n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"{', '.join(hints)}: not a parameter of the {what} {name!r}, which takes {takes}"
