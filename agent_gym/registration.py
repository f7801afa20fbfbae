"""Env-id registration under the ``AgentR1/`` namespace.

Each env module registers its own ids next to its class (``register_env`` at the bottom of
``envs/factchain.py``, ``envs/hotpotqa.py``...); the ``envs`` package imports its modules, and
``import agent_gym`` imports ``envs``, so both forms work::

    import agent_gym; gym.make("AgentR1/FactChain-v0")
    gym.make("agent_gym:AgentR1/FactChain-v0")      # gymnasium imports agent_gym first

An env outside this repository registers the same way from its own module and is made with
``gym.make("mypkg.mymodule:AgentR1/MyEnv-v0")`` (Gymnasium imports the module first).

Each id also gets a ``vector_entry_point``: ``gym.make_vec(id, n)`` (or
``vectorization_mode="vector_entry_point"``) builds a :class:`agent_gym.vector.ToolVectorEnv`.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym

ENV_IDS: dict[str, tuple[str, dict]] = {}
"""id -> (entry point, default kwargs): every id registered through ``register_env``."""


def _vector_creator(entry_point: str, num_envs: int = 1, **kwargs):
    from agent_gym.vector import ToolVectorEnv

    return ToolVectorEnv.from_entry_point(entry_point, num_envs=num_envs, **kwargs)


def register_env(env_id: str, entry_point: str, kwargs: dict[str, Any] | None = None) -> None:
    """Register ``env_id`` with Gymnasium (and ``ENV_IDS``) for ``entry_point`` ("module:Class").

    Registering the same entry again (a module imported twice) is a no-op; a different entry
    point or default kwargs under an id already taken raises ``ValueError``.
    """
    entry = (entry_point, dict(kwargs or {}))
    old = ENV_IDS.get(env_id)
    if old is None and env_id in gym.registry:
        spec = gym.registry[env_id]
        old = (spec.entry_point, dict(spec.kwargs or {}))
    if old is not None:
        if old != entry:
            raise ValueError(f"env id {env_id!r} is already registered to {old[0]!r} with kwargs {old[1]}; "
                             f"cannot register {entry_point!r} with kwargs {entry[1]} under it (pick a new id or version)")
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


__all__ = ["ENV_IDS", "register_env"]
