"""What keyword arguments a built-in env takes, read from its classes' signatures without building
it: for refusing a config's misspelled env argument before anything starts (``trainers.compose``,
SFT, ``trainers/evaluate.py``)."""

from __future__ import annotations

from typing import Any

from gymnasium.envs.registration import load_env_creator

from agent_gym.builtin_envs import BUILTIN_ENVS, BUILTIN_MULTIAGENT
from agent_gym.env import init_arguments, nearest_hint


def env_arguments(env_id: str) -> set[str] | None:
    """The keyword arguments a built-in env id accepts, read from the signatures of its class
    hierarchy (and, for a multi-agent id, of the seats it passes the rest on to), without building
    the env; None for an id that is not built in (whose ``**kwargs`` may be consumed anywhere) or
    whose module cannot be imported."""
    builtin = {**BUILTIN_ENVS, **BUILTIN_MULTIAGENT}
    if env_id not in builtin:
        return None
    try:
        klasses = list(load_env_creator(builtin[env_id][0]).__mro__)
    except Exception:  # its module cannot be imported here (a missing extra): gym.make will say why
        return None
    if env_id in BUILTIN_MULTIAGENT:  # a multi-agent env passes the ToolEnv arguments it does not name to every seat
        from agent_gym.multiagent import SeatEnv  # optional: PettingZoo (extra pettingzoo), only for a team id

        klasses += SeatEnv.__mro__
    return init_arguments(klasses) - {"tools"}


def unknown_env_argument(env_id: str, kwargs: dict[str, Any]) -> str | None:
    """Why ``kwargs`` cannot go to ``gym.make(env_id)``: the first key the built-in env does not take,
    with the nearest valid one; None when every key is taken (or the id is not built in)."""
    return unknown_env_argument_in(env_id, {"": kwargs})


def unknown_env_argument_in(env_id: str, places: dict[str, dict[str, Any] | None]) -> str | None:
    """``unknown_env_argument`` over several argument sets of one config, keyed by where each sits
    (``{"rollout.env_kwargs": {...}, "eval.sets.heldout": {...}}``): the first problem, prefixed
    by its key (unless the key is empty); None when every set is taken. The env's arguments are
    read once for all the sets."""
    accepted = env_arguments(env_id)
    if accepted is None:
        return None
    for where, kwargs in places.items():
        for key in kwargs or {}:
            if key not in accepted:
                why = f"{env_id} takes no argument {key!r}{nearest_hint(key, accepted)}; it takes: {', '.join(sorted(accepted))}"
                return f"{where}: {why}" if where else why
    return None
