"""Plugins: a user's modules, imported before a config is checked, in every process of a run.

A plugin is any importable module (on ``sys.path``/``PYTHONPATH``) that registers what a config
then names: an advantage estimator (``trainers.algos.register_adv_est``), a loss aggregation
(``register_agg``), a KL kind (``register_kl``), a Gymnasium env (``gymnasium.register``). Name it
in the config (``plugins: [my_project.algos]``) or on the command line (``--plugin my_project.algos``,
repeatable, on train_ppo.py, train_grpo.py, train_sft.py and evaluate.py; the command line's
plugins are added to the config's, so they are saved with the run and resumed).

``trainers.config.from_dict`` imports a config's plugins before it checks any key, so every process
that rebuilds the config from its dict loads them too: the main one, each Ray rollout worker
(which also calls ``load`` at start-up) and each torchrun rank (which runs the same command line).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Iterable

from trainers.errors import ConfigError

LOADED: list[str] = []
"""The plugins this process imported, in order."""


class PluginError(ValueError):
    """A plugin could not be imported (``trainers.config.ConfigError`` for the command lines)."""


def load(modules: Iterable[str], source: str = "plugins") -> list[str]:
    """Import each module of ``modules`` once (in order); return the names. A module that is not a
    string, is not found or fails while importing raises ``ConfigError`` naming it."""
    if isinstance(modules, str) or not all(isinstance(m, str) and m for m in modules):
        raise ConfigError(
            f"{source}: plugins must be a list of module names (e.g. [my_project.algos]), got {modules!r}"
        )
    names = list(modules)
    for name in names:
        if name in LOADED:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                raise ConfigError(
                    f"{source}: plugin {name!r} not found: put the directory that holds it on "
                    f"PYTHONPATH (sys.path: {sys.path[:3]}...), or install it"
                ) from None
            raise ConfigError(f"{source}: plugin {name!r} failed to import: {e}") from e
        except Exception as e:  # its own error: say which plugin raised it
            raise ConfigError(f"{source}: plugin {name!r} failed to import: {type(e).__name__}: {e}") from e
        LOADED.append(name)
    return names


def add_argument(ap: argparse.ArgumentParser) -> None:
    """``--plugin MODULE`` (repeatable) on a script's parser."""
    ap.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module to import before the config is checked (registers estimators, losses, envs; "
        "repeatable; added to the config's plugins)",
    )
