"""Concrete environments, one module each; each module's docstring is its card.

The ids are registered by ``import agent_gym`` from one table of entry-point strings
(``agent_gym/builtin_envs.py``), not by these modules: ``gym.make(id)`` imports an env's module
when the env is made, so importing this package, or any one env module, imports only that.
Every env module imports ``agent_gym`` (its base classes), so ``import envs.factchain`` alone
also registers every id; ``import envs`` does the same here.
"""

import agent_gym  # noqa: F401  (registers the built-in ids: envs -> agent_gym, never the other way)
