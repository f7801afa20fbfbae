"""agent_gym: Gymnasium tool-using text environments for LLM agents, token in and token out.

``import agent_gym`` registers every ``AgentR1/...`` id with Gymnasium, and the multi-agent ids
(made with ``agent_gym.make_multiagent``) when PettingZoo is installed.
"""

from agent_gym.env import RewardConfig, ToolEnv
from agent_gym.registration import ENV_IDS, MULTIAGENT_IDS, make_multiagent, register_env, register_multiagent
from agent_gym.tools import Tool, ToolResult, tool

import envs  # noqa: E402,F401  (each env module registers its own ids)

__all__ = ["ENV_IDS", "MULTIAGENT_IDS", "RewardConfig", "Tool", "ToolEnv", "ToolResult", "make_multiagent", "register_env",
           "register_multiagent", "tool"]
__version__ = "0.1.0"
