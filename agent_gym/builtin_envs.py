"""The built-in env ids: one table of entry-point strings, registered by ``import agent_gym``.

Registration names each env by its ``"module:Class"`` string, as Gymnasium's own ids do
(``"gymnasium.envs.classic_control.cartpole:CartPoleEnv"``): nothing under ``envs/`` is
imported until an env is made (``gym.make`` imports the module then). So the framework does not
import its users (docs/design.md, "Layers"), and ``import agent_gym`` stays cheap.

An env outside this repository registers itself from its own module with
:func:`agent_gym.registration.register_env` (see that module's docstring); this table is only the
ids that ship with the project. Adding a built-in env is one row here plus its module.
"""

from __future__ import annotations

import importlib.util

from agent_gym.registration import register_env, register_multiagent

BUILTIN_ENVS: dict[str, tuple[str, dict]] = {
    "AgentR1/FactChain-v0": ("envs.factchain:FactChainEnv", {}),
    "AgentR1/HotpotQA-v0": ("envs.hotpotqa:HotpotQAEnv", {}),
    "AgentR1/2WikiMultiHopQA-v0": ("envs.twowiki:TwoWikiMultiHopQAEnv", {}),
    "AgentR1/MuSiQue-v0": ("envs.musique:MuSiQueEnv", {}),
    "AgentR1/HotpotQA-NaiveRAG-v0": ("envs.naiverag:HotpotQANaiveRAGEnv", {}),
    "AgentR1/2WikiMultiHopQA-NaiveRAG-v0": ("envs.naiverag:TwoWikiMultiHopQANaiveRAGEnv", {}),
    "AgentR1/MuSiQue-NaiveRAG-v0": ("envs.naiverag:MuSiQueNaiveRAGEnv", {}),
    "AgentR1/Math-v0": ("envs.math:MathEnv", {}),
    "AgentR1/HumanEval-v0": ("envs.code:HumanEvalEnv", {}),
    "AgentR1/MBPP-v0": ("envs.code:MBPPEnv", {}),
}
"""id -> (entry point, default kwargs) of every built-in single-agent env (``gym.make``)."""

BUILTIN_MULTIAGENT: dict[str, tuple[str, dict]] = {
    "AgentR1/FactChainTeam-v0": ("envs.factchain_team:FactChainTeamEnv", {}),
}
"""id -> (entry point, default kwargs) of the built-in multi-agent (PettingZoo) envs
(``agent_gym.make_multiagent``); registered only where PettingZoo is installed."""


def register_builtin_envs() -> None:
    """Register every id of the two tables (idempotent: registering the same entry is a no-op)."""
    for env_id, (entry_point, kwargs) in BUILTIN_ENVS.items():
        register_env(env_id, entry_point, kwargs)
    if importlib.util.find_spec("pettingzoo") is not None:
        for env_id, (entry_point, kwargs) in BUILTIN_MULTIAGENT.items():
            register_multiagent(env_id, entry_point, kwargs)


__all__ = ["BUILTIN_ENVS", "BUILTIN_MULTIAGENT", "register_builtin_envs"]
