"""agent_gym: Gymnasium tool-using text environments for LLM agents, token in and token out.

``import agent_gym`` registers every built-in ``AgentR1/...`` id with Gymnasium, and the multi-agent
ids (made with ``agent_gym.make_multiagent``) when PettingZoo is installed, as entry-point strings
(``"envs.factchain:FactChainEnv"``, the table in ``agent_gym/builtin_envs.py``): no env module is
imported until an env is made. This package imports neither ``envs`` nor ``trainers`` nor torch
(the layers and their contract: docs/design.md, "Layers").
"""

from agent_gym.builtin_envs import register_builtin_envs
from agent_gym.env import RewardConfig, ToolEnv
from agent_gym.registration import ENV_IDS, MULTIAGENT_IDS, make_multiagent, register_env, register_multiagent
from agent_gym.tools import Tool, ToolResult, tool

register_builtin_envs()

__all__ = [
    "ENV_IDS",
    "MULTIAGENT_IDS",
    "RewardConfig",
    "Tool",
    "ToolEnv",
    "ToolResult",
    "make_multiagent",
    "register_env",
    "register_multiagent",
    "tool",
]
__version__ = "0.1.0"
