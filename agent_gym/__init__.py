"""agent_gym: Gymnasium tool-using text environments for LLM agents, token in and token out.

``import agent_gym`` registers every ``AgentR1/...`` id with Gymnasium.
"""

from agent_gym.env import RewardConfig, ToolEnv
from agent_gym.registration import ENV_IDS, register_env
from agent_gym.tools import Tool, ToolResult, tool

import envs  # noqa: E402,F401  (each env module registers its own ids)

__all__ = ["ENV_IDS", "RewardConfig", "Tool", "ToolEnv", "ToolResult", "register_env", "tool"]
__version__ = "0.1.0"
