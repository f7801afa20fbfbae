"""The verifiers plugin module of the project's envs: ``vf-eval agent-gym-verifiers ...``.

verifiers 0.4 resolves a taskset, env or harness id by importing the module of that name (``-`` as
``_``) and taking the ``Taskset``, ``Env`` and ``Harness`` subclasses it exports in ``__all__``; a
dotted id (``agent_gym.integrations.verifiers``) is not accepted, so this top-level module re-exports
:mod:`agent_gym.integrations.verifiers`, where everything is defined and documented.
"""

from agent_gym.integrations.verifiers import (
    TASKSET_ID,
    AgentGymData,
    AgentGymEnv,
    AgentGymEnvConfig,
    AgentGymHarness,
    AgentGymHarnessConfig,
    AgentGymTask,
    AgentGymTaskset,
    AgentGymTasksetConfig,
    load_environment,
)

__all__ = [
    "AgentGymData",
    "AgentGymEnv",
    "AgentGymEnvConfig",
    "AgentGymHarness",
    "AgentGymHarnessConfig",
    "AgentGymTask",
    "AgentGymTaskset",
    "AgentGymTasksetConfig",
    "TASKSET_ID",
    "load_environment",
]
