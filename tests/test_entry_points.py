"""The commands run without patching ``sys.path``: the console scripts of
``[project.scripts]`` (installed by ``pip install -e .``, which ``make setup`` runs) and the scripts
run by path (``python trainers/train_ppo.py``), from a directory outside the repository, where only
the editable install can find ``agent_gym``, ``envs`` and ``trainers``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainers.console import config_algo

ROOT = Path(__file__).resolve().parents[1]


def _project_scripts() -> list[str]:
    """The names under pyproject.toml's ``[project.scripts]`` (tomllib is Python 3.11+; the project runs on 3.10)."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    return re.findall(r"^([\w-]+)\s*=", section, re.M)


SCRIPTS = _project_scripts()
BY_PATH = (
    "trainers/train_ppo.py",
    "trainers/train_grpo.py",
    "trainers/train_sft.py",
    "trainers/evaluate.py",
    "scripts/merge_qa.py",
    "benchmarks/perf/env_step.py",
)


def _help(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}  # no PYTHONPATH: the install alone must do
    return subprocess.run([*cmd, "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
def test_every_console_script_is_installed_and_answers_help(tmp_path):
    assert {"agent-gym-train", "agent-gym-sft", "agent-gym-eval", "agent-gym-serve"} <= set(SCRIPTS)
    for name in SCRIPTS:
        exe = Path(sys.executable).parent / name
        assert exe.is_file(), f"{exe} is missing: reinstall the project (pip install -e .) after a pyproject change"
        res = _help([str(exe)], tmp_path)
        assert res.returncode == 0 and "usage:" in res.stdout, (name, res.stdout[-2000:], res.stderr[-2000:])


@pytest.mark.timeout(300)
def test_scripts_run_by_path_from_outside_the_repository(tmp_path):
    for script in BY_PATH:
        text = (ROOT / script).read_text()
        assert "sys.path.insert" not in text and "sys.path[" not in text, script
        res = _help([sys.executable, str(ROOT / script)], tmp_path)
        assert res.returncode == 0 and "usage:" in res.stdout, (script, res.stdout[-2000:], res.stderr[-2000:])


def test_agent_gym_train_reads_the_algo_from_overrides_config_or_run(tmp_path):
    flat, sectioned, run = tmp_path / "flat.yaml", tmp_path / "sectioned.yaml", tmp_path / "run"
    flat.write_text("algo: grpo\n")
    sectioned.write_text("algorithm:\n  algo: rloo\n")
    run.mkdir()
    (run / "config.yaml").write_text("algorithm: {algo: ppo}\n")
    assert config_algo(["--config", str(flat)]) == "grpo"
    assert config_algo([f"--config={sectioned}"]) == "rloo"
    assert config_algo(["--resume", str(run)]) == "ppo"
    assert config_algo(["--config", str(flat), "algorithm.algo=ppo"]) == "ppo"  # an override wins
    (tmp_path / "none.yaml").write_text("seed: 1\n")
    assert config_algo(["--config", str(tmp_path / "none.yaml")]) == "ppo"  # TrainConfig's default
    with pytest.raises(ValueError, match="not found"):
        config_algo(["--config", str(tmp_path / "missing.yaml")])
    with pytest.raises(ValueError, match="needs the algorithm"):
        config_algo(["seed=3"])
