"""Env-id registration under the ``AgentR1/`` namespace.

The built-in ids are one table of entry-point strings (``agent_gym/builtin_envs.py``), registered
by ``import agent_gym`` without importing any env module (Gymnasium imports ``envs.factchain``
when the env is made), so both forms work::

    import agent_gym; gym.make("AgentR1/FactChain-v0")
    gym.make("agent_gym:AgentR1/FactChain-v0")      # gymnasium imports agent_gym first

An env outside this repository registers the same way from its own module and is made with
``gym.make("mypkg.mymodule:AgentR1/MyEnv-v0")`` (Gymnasium imports the module first).

Each id also gets a ``vector_entry_point``: ``gym.make_vec(id, n)`` (or
``vectorization_mode="vector_entry_point"``) builds a :class:`agent_gym.vector.ToolVectorEnv`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

import gymnasium as gym

from agent_gym.env_ids import ENV_IDS, MULTIAGENT_IDS  # the tables this module fills (their own module: env_ids.py)


def _vector_creator(entry_point: str, num_envs: int = 1, **kwargs):
    from agent_gym.vector import ToolVectorEnv  # deferred: ~15 ms kept out of `import agent_gym` (and --help)

    return ToolVectorEnv.from_entry_point(entry_point, num_envs=num_envs, **kwargs)


def register_env(env_id: str, entry_point: str, kwargs: dict[str, Any] | None = None) -> None:
    """Register ``env_id`` with Gymnasium (and ``ENV_IDS``) for ``entry_point`` ("module:Class").

    Registering the same entry again (a module imported twice) is a no-op; a different entry
    point or default kwargs under an id already taken raises ``ValueError``, and so does an id
    taken by a multi-agent env (``register_multiagent``).
    """
    entry = (entry_point, dict(kwargs or {}))
    if env_id in MULTIAGENT_IDS:
        raise ValueError(f"{env_id!r} is a multi-agent (make_multiagent) id; pick another id for the single-agent env")
    old = ENV_IDS.get(env_id)
    if old is None and env_id in gym.registry:
        spec = gym.registry[env_id]
        old = (spec.entry_point, dict(spec.kwargs or {}))
    if old is not None:
        if old != entry:
            raise ValueError(
                f"env id {env_id!r} is already registered to {old[0]!r} with kwargs {old[1]}; "
                f"cannot register {entry_point!r} with kwargs {entry[1]} under it (pick a new id or version)"
            )
        ENV_IDS[env_id] = entry
        return
    ENV_IDS[env_id] = entry
    gym.register(
        id=env_id,
        entry_point=entry_point,
        vector_entry_point=functools.partial(_vector_creator, entry_point),
        kwargs=dict(entry[1]),
        disable_env_checker=True,  # the project's own conformance suite runs check_env on every id
    )


def register_multiagent(env_id: str, entry_point: str, kwargs: dict[str, Any] | None = None) -> None:
    """Register a multi-agent id for ``entry_point`` ("module:Class" of an
    :class:`agent_gym.multiagent.MultiAgentToolEnv`). Gymnasium's ``gym.make`` cannot return a
    PettingZoo env, so these ids live in their own registry and are made with :func:`make_multiagent`.
    The same rules as ``register_env``: the same entry again is a no-op, a different one raises."""
    entry = (entry_point, dict(kwargs or {}))
    old = MULTIAGENT_IDS.get(env_id)
    if old is not None and old != entry:
        raise ValueError(
            f"multi-agent id {env_id!r} is already registered to {old[0]!r} with kwargs {old[1]}; "
            f"cannot register {entry_point!r} with kwargs {entry[1]} under it (pick a new id or version)"
        )
    if env_id in ENV_IDS:
        raise ValueError(f"{env_id!r} is a single-agent (gym.make) id; pick another id for the multi-agent env")
    MULTIAGENT_IDS[env_id] = entry


def make_multiagent(env_id: str, parallel: bool = False, **kwargs: Any):
    """Build a registered multi-agent env: PettingZoo's AEC view by default (the env wrapped by
    ``pettingzoo.utils.conversions.parallel_to_aec``), or the ``ParallelEnv`` itself with
    ``parallel=True``. ``kwargs`` override the registered defaults."""
    if env_id not in MULTIAGENT_IDS:
        hint = (
            ""
            if importlib.util.find_spec("pettingzoo")
            else " (pettingzoo is not installed, so the multi-agent envs are not registered: "
            "pip install 'agent-gym[pettingzoo]')"
        )
        raise ValueError(f"unknown multi-agent id {env_id!r}; registered: {sorted(MULTIAGENT_IDS)}{hint}")
    entry_point, defaults = MULTIAGENT_IDS[env_id]
    module, _, name = entry_point.partition(":")
    cls = getattr(importlib.import_module(module), name)
    env = cls(**{**defaults, **kwargs})
    if parallel:
        return env
    from pettingzoo.utils.conversions import parallel_to_aec  # optional: pettingzoo (extra pettingzoo)

    return parallel_to_aec(env)


__all__ = ["ENV_IDS", "MULTIAGENT_IDS", "make_multiagent", "register_env", "register_multiagent"]
