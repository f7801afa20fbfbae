"""The tables of registered ids, filled by :mod:`agent_gym.registration`.

A module of its own that imports nothing, so that :mod:`agent_gym.cli_errors` can name the
registered ids in its messages without importing the registration, which reaches the env and
vector modules, which raise ``cli_errors.UserError`` (an import circle). Import the tables from
``agent_gym`` or :mod:`agent_gym.registration`; they are the same objects.
"""

from __future__ import annotations

ENV_IDS: dict[str, tuple[str, dict]] = {}
"""id -> (entry point, default kwargs): every id registered through ``register_env``."""

MULTIAGENT_IDS: dict[str, tuple[str, dict]] = {}
"""id -> (entry point, default kwargs): the multi-agent (PettingZoo) ids, made with ``make_multiagent``."""

__all__ = ["ENV_IDS", "MULTIAGENT_IDS"]
