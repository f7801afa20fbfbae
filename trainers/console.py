"""The console scripts of ``pyproject.toml``'s ``[project.scripts]`` (installed by ``pip install -e .``,
which ``make setup`` runs):

    agent-gym-train --config configs/factchain_grpo.yaml [key=value ...]   # PPO or GRPO, from the config's algo
    agent-gym-train-ppo / agent-gym-train-grpo ...                        # = python trainers/train_ppo.py / train_grpo.py
    agent-gym-sft --config configs/factchain_sft.yaml                     # = python trainers/train_sft.py
    agent-gym-eval --env AgentR1/FactChain-v0 --checkpoint RUN_DIR        # = python trainers/evaluate.py
    agent-gym-serve AgentR1/FactChain-v0                                  # = python -m agent_gym.serve (OpenEnv)

Each one calls the same ``main`` as the script it names, so flags, output and exit status are the
same; called without ``argv``, each ``main`` runs under ``agent_gym.cli_errors.run_main``: a bad input
prints one line, ``error: <what is wrong>; <what to type instead>``, and exits 2 (``--debug`` or
``AGENT_GYM_DEBUG=1`` shows the traceback). The env-side commands that need no trainer
(``agent-gym-serve``, ``agent-gym-retrieval-server``, ``agent-gym-view``) point at ``agent_gym``'s own
``main`` functions directly.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from agent_gym.cli_errors import UsageError, yaml_message
from trainers.cli import script_main
from trainers.evaluate import main as evaluate_main
from trainers.train_sft import main as sft_main


def train_ppo() -> None:
    script_main("ppo")


def train_grpo() -> None:
    script_main("grpo")


def train() -> None:
    """``agent-gym-train``: ``train_ppo`` for ``algo: ppo``, ``train_grpo`` for the group algorithms
    (grpo, rloo, reinforce_pp); the algo is read from the overrides, the config file, or with
    ``--resume RUN_DIR`` the run's own config.yaml."""
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(
            "usage: agent-gym-train (--config CONFIG | --resume RUN_DIR) [--plugin MODULE] [key=value ...]\n\n"
            "Train with PPO or GRPO as the config's algorithm.algo says (ppo -> agent-gym-train-ppo, "
            "grpo/rloo/reinforce_pp -> agent-gym-train-grpo); every other flag is theirs:\n"
        )
        script_main("grpo")  # prints train_grpo's own help and exits 0
    script_main(config_algo)  # a config that names no algo, or is missing or bad YAML: one line, exit 2


def config_algo(argv: list[str]) -> str:
    """The ``algo`` a training command line asks for, without building the config: the last
    ``algo=``/``algorithm.algo=`` override, else the config file's (``--config``, or ``--resume``'s
    ``RUN_DIR/config.yaml``) ``algorithm: {algo: ...}`` or flat ``algo:`` (``ppo``, the config's default,
    when the file names none). The training script then
    checks it against the whole config, so a wrong guess here is an error there, never a silent switch."""
    algo, path = None, None
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if flag in ("--config", "--resume"):
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            path = Path(value) / "config.yaml" if flag == "--resume" else Path(value)
        elif eq and flag in ("algo", "algorithm.algo"):
            algo = yaml.safe_load(value)
    if algo is None and path is not None:
        if not path.is_file():
            raise UsageError(
                f"config file {str(path)!r} not found (--config takes a YAML file, e.g. "
                "configs/factchain_grpo.yaml; --resume a run directory that holds config.yaml)"
            )
        try:
            data: Any = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise UsageError(yaml_message(e, str(path))) from e
        section = data.get("algorithm") if isinstance(data, dict) else None
        algo = (section or {}).get("algo") if isinstance(section, dict) else None
        if algo is None and isinstance(data, dict):
            algo = data.get("algo", "ppo")  # TrainConfig's default algo
    if algo is None:
        raise UsageError(
            "agent-gym-train needs the algorithm: pass --config FILE (with algorithm: {algo: ...}), "
            "--resume RUN_DIR, or an override algorithm.algo=ppo|grpo|rloo|reinforce_pp; or run "
            "agent-gym-train-ppo / agent-gym-train-grpo"
        )
    return str(algo)


def sft() -> None:
    sys.exit(sft_main())  # main() without argv: a bad input is one line, exit 2 (agent_gym/cli_errors.py)


def evaluate() -> None:
    sys.exit(evaluate_main())  # main() without argv: a bad input is one line, exit 2 (agent_gym/cli_errors.py)
