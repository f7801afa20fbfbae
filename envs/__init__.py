"""Concrete environments, one module each. Each module's docstring is its card, and each module
registers its own ids (``agent_gym.registration.register_env``) when imported; importing this
package (which ``import agent_gym`` does) imports them all. The multi-agent (PettingZoo) envs are
imported only where PettingZoo is installed (the ``pettingzoo`` and ``dev`` extras)."""

import importlib.util

from envs import code, factchain, hotpotqa, math, musique, naiverag, twowiki  # noqa: F401  (each registers its ids)

if importlib.util.find_spec("pettingzoo") is not None:
    from envs import factchain_team  # noqa: F401  (registers AgentR1/FactChainTeam-v0 with register_multiagent)
