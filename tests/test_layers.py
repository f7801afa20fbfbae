"""The layers of docs/design.md ("Layers") hold, checked by import-linter's contracts in
``.importlinter``: ``agent_gym`` imports neither ``envs`` nor ``trainers``, ``envs`` do not import
``trainers``, ``agent_gym``'s core does not import torch, and the trainer loop (``trainers.trainer``)
is given its parts: it imports no Ray, FSDP, async or multi-agent module, nor ``trainers.compose``
which picks them (every import statement counts, at module level or inside a function, directly or
through another module). The checker is shown to fail on each kind of forbidden import
by running it on a copy of the packages with violations planted, and ``import agent_gym`` is shown
to load neither torch nor an env module nor the trainer in a fresh interpreter."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_gym", "envs", "trainers")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` (the import-linter of the dev extra) on the packages under ``cwd``."""
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: install the dev extra (pip install -e '.[dev]'), which brings import-linter")
    # PYTHONPATH first: the copy under cwd is analysed, not the editable install's packages.
    return subprocess.run(
        [str(exe), "--no-cache", "--config", str(cwd / ".importlinter")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.timeout(150)
def test_the_project_keeps_every_layer_contract():
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 4 kept, 0 broken." in res.stdout, res.stdout


@pytest.mark.timeout(200)
def test_the_checker_fails_on_each_forbidden_import(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    res = lint_imports(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr  # the copy itself is clean

    # One violation of each contract, one of them only inside a function (a lazy import counts).
    (tmp_path / "agent_gym" / "planted_user.py").write_text("def f():\n    from trainers import config\n")
    (tmp_path / "envs" / "planted_trainer.py").write_text("import trainers.rollout\n")
    (tmp_path / "agent_gym" / "planted_torch.py").write_text("import torch\n")
    trainer = tmp_path / "trainers" / "trainer.py"
    trainer.write_text(trainer.read_text() + "\n\ndef planted():\n    from trainers import ray_rollout\n")
    planted_line = len(trainer.read_text().splitlines())
    res = lint_imports(tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Contracts: 0 kept, 4 broken." in res.stdout, res.stdout
    for line in (
        "agent_gym.planted_user -> trainers.config (l.2)",
        "envs.planted_trainer -> trainers.rollout (l.1)",
        "agent_gym.planted_torch -> torch (l.1)",
        f"trainers.trainer -> trainers.ray_rollout (l.{planted_line})",
    ):
        assert line in res.stdout, res.stdout


@pytest.mark.timeout(120)
def test_import_agent_gym_loads_no_torch_no_env_no_trainer():
    code = (
        "import sys, agent_gym\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'envs', 'trainers')))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout
