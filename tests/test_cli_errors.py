"""Bad input meets one clear line everywhere: every console script, and the ``python
trainers/*.py`` / ``python -m agent_gym.*`` forms, turn a user error into one line on stderr, ``error:
<what is wrong>; <what to type instead>``, with exit status 2 and no traceback (``agent_gym/cli_errors.py``);
``--debug`` or ``AGENT_GYM_DEBUG=1`` shows the traceback; usage lines name what the user typed.

The commands run as subprocesses from this interpreter's bin directory (the venv the tests run in),
offline: ``HF_HUB_OFFLINE=1``, an empty ``AGENT_GYM_CACHE``, and HTTP(S) proxies on a closed local port,
so a QA env without data fails to download at once, as on a machine without network. Timings on the
2-core development machine under load: 0.3 s (argument errors, ``agent-gym-view``) to 3 s (the
commands that import torch before failing: ``agent-gym-eval``, ``-train-ppo/-grpo``), 5 s for
``agent-gym-serve`` (openenv and uvicorn imports) and about 10 s for the training row that builds a
tiny model before the env fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_gym.cli_errors import (
    UsageError,
    UserError,
    describe,
    prog_name,
    registered_ids_hint,
    run_main,
    take_debug_flag,
)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MAX_LINES = 3


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_GYM_DEBUG", "no_proxy", "NO_PROXY", "PYTHONPATH")}
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, a download is refused at once
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "AGENT_GYM_CACHE": str(tmp / "cache"),
            "http_proxy": closed,
            "https_proxy": closed,
            "HTTP_PROXY": closed,
            "HTTPS_PROXY": closed,
            "OMP_NUM_THREADS": "1",
        },
        **extra,
    )
    return env


def _run(cmd: list[str], tmp: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=tmp, env=_env(tmp, **env), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def bad_inputs(tmp_path: Path) -> Path:
    """The files the table names, in ``tmp_path`` (also the commands' working directory)."""
    (tmp_path / "unknown_key.yaml").write_text("algorithm:\n  algo: grpo\n  no_such_key: 1\n")
    (tmp_path / "bad.yaml").write_text("algorithm: [1, 2\n  algo: grpo: x\n")
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "not_a_model").mkdir()
    (tmp_path / "qa_offline.yaml").write_text(  # a QA env with no data_path: the official file, offline
        "run: {run_dir: run_qa, iterations: 1, tensorboard: false}\n"
        "model: {name: tiny, device: cpu}\n"
        "algorithm: {algo: grpo}\n"
        "rollout: {env_id: AgentR1/HotpotQA-v0, backend: hf}\n"
    )
    return tmp_path


def _script(name: str) -> str:
    exe = BIN / name
    assert exe.is_file(), f"{exe} is missing: reinstall the project (pip install -e .) after a pyproject change"
    return str(exe)


PY = "{python}"
# (command, arguments, exit status, the fix the line must name); MISSING is a path that does not exist.
TABLE = [
    ("agent-gym-train", ["--config", "MISSING.yaml"], 2, "--config takes a YAML file"),
    ("agent-gym-train", ["--config", "bad.yaml"], 2, "at line 2, column 7; fix the YAML there"),
    ("agent-gym-train", ["--resume", "not_a_run"], 2, "--resume a run directory that holds config.yaml"),
    ("agent-gym-train", [], 2, "pass --config FILE"),
    ("agent-gym-train-ppo", ["--config", "MISSING.yaml"], 2, "configs live in configs/*.yaml"),
    ("agent-gym-train-ppo", ["--resume", "not_a_run"], 2, "start a new run with --config FILE"),
    ("agent-gym-train-ppo", ["--no-such-flag"], 2, "see agent-gym-train-ppo --help"),
    ("agent-gym-train-grpo", ["--config", "unknown_key.yaml"], 2, "did you mean 'algorithm."),
    ("agent-gym-train-grpo", ["--config", "bad.yaml"], 2, "at line 2, column 7"),
    ("agent-gym-train-grpo", ["--config", "qa_offline.yaml"], 2, "rollout: {env_kwargs: {data_path: FILE_OR_DIR"),
    ("agent-gym-sft", ["--config", "MISSING.yaml"], 2, "configs live in configs/*.yaml"),
    ("agent-gym-sft", ["--config", "bad.yaml"], 2, "at line 2, column 7"),
    (
        "agent-gym-eval",
        ["--env", "AgentR1/NoSuch-v0", "--policy", "oracle"],
        2,
        "pass a registered id, e.g. AgentR1/FactChain-v0",
    ),
    (
        "agent-gym-eval",
        ["--env", "AgentR1/Factchain-v0", "--policy", "oracle"],
        2,
        "did you mean AgentR1/FactChain-v0?",
    ),
    (
        "agent-gym-eval",
        ["--env", "AgentR1/HotpotQA-v0", "--policy", "oracle", "--tasks", "1"],
        2,
        "--env-kwargs '{data_path: FILE_OR_DIR, corpus_path: CORPUS.jsonl}'",
    ),
    (
        "agent-gym-eval",
        ["--env", "AgentR1/HotpotQA-v0", "--policy", "oracle", "--env-kwargs", "{data_path: MISSING.json}"],
        2,
        "--env-kwargs '{data_path: PATH}'",
    ),
    (
        "agent-gym-eval",
        ["--env", "AgentR1/FactChain-v0", "--model", "nosuch_dir", "--tasks", "1"],
        2,
        "--checkpoint RUN_DIR for an RL run's policy",
    ),
    (
        "agent-gym-eval",
        ["--env", "AgentR1/FactChain-v0", "--model", "not_a_model", "--tasks", "1"],
        2,
        "not a model directory (no config.json); pass a local model directory",
    ),
    ("agent-gym-eval", ["--checkpoint", "not_a_run"], 2, "pass an RL run directory"),
    ("agent-gym-eval", ["--policy", "oracle"], 2, "--env AgentR1/FactChain-v0"),
    ("agent-gym-eval", ["--env", "AgentR1/FactChain-v0", "--env-kwargs", "{a: [1"], 2, "fix the YAML there"),
    ("agent-gym-serve", ["AgentR1/NoSuch-v0"], 2, "pass a registered id, e.g. AgentR1/FactChain-v0"),
    ("agent-gym-serve", ["--config", "MISSING.yaml"], 2, "pass a YAML file with env_id"),
    ("agent-gym-retrieval-server", ["serve", "--corpus", "MISSING.jsonl"], 2, "pass a corpus JSONL file"),
    ("agent-gym-retrieval-server", [], 2, "see agent-gym-retrieval-server --help"),
    ("agent-gym-view", ["MISSING"], 2, "pass a run's trajectories directory"),
    # the same main functions run by path or with -m
    (PY, ["trainers/train_ppo.py", "--config", "MISSING.yaml"], 2, "configs live in configs/*.yaml"),
    (PY, ["trainers/train_grpo.py", "--resume", "not_a_run"], 2, "start a new run with --config FILE"),
    (PY, ["trainers/train_sft.py", "--config", "bad.yaml"], 2, "at line 2, column 7"),
    (
        PY,
        ["trainers/evaluate.py", "--env", "AgentR1/FactChain-v0", "--model", "nosuch_dir", "--tasks", "1"],
        2,
        "--checkpoint RUN_DIR",
    ),
    (PY, ["-m", "agent_gym.serve", "AgentR1/NoSuch-v0"], 2, "AgentR1/FactChain-v0"),
    (PY, ["-m", "agent_gym.view", "MISSING"], 2, "pass a run's trajectories directory"),
    (PY, ["-m", "agent_gym.retrievers.http", "serve", "--corpus", "MISSING.jsonl"], 2, "pass a corpus JSONL file"),
]


def _command(name: str, args: list[str]) -> list[str]:
    if name == PY:
        return [sys.executable, *[str(ROOT / a) if a.startswith("trainers/") else a for a in args]]
    return [_script(name), *args]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "name, args, status, fix", TABLE, ids=[f"{n if n != PY else 'python'} {' '.join(a)}"[:80] for n, a, _, _ in TABLE]
)
def test_a_bad_input_is_one_line_naming_the_fix(bad_inputs, name, args, status, fix):
    r = _run(_command(name, args), bad_inputs)
    lines = r.stderr.strip().splitlines()
    where = f"exit {r.returncode}\nstderr:\n{r.stderr[-3000:]}\nstdout:\n{r.stdout[-1000:]}"
    assert r.returncode == status, where
    assert "Traceback" not in r.stderr, where
    assert 1 <= len(lines) <= MAX_LINES, where
    assert lines[-1].startswith("error: "), where
    assert fix in lines[-1], (fix, where)


@pytest.mark.timeout(120)
def test_the_reported_bad_inputs_say_what_is_wrong(bad_inputs):
    """The reported cases: the missing model directory is named as such (not the network), and
    the QA env offline gives the flag, not Python."""
    r = _run(
        [_script("agent-gym-eval"), "--env", "AgentR1/FactChain-v0", "--model", "nosuch_dir", "--tasks", "1"],
        bad_inputs,
    )
    assert "'nosuch_dir' does not exist" in r.stderr and "huggingface.co" not in r.stderr, r.stderr
    r = _run([_script("agent-gym-eval"), "--env", "AgentR1/HotpotQA-v0", "--policy", "oracle"], bad_inputs)
    assert "could not download" in r.stderr and "load_qa(" not in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_debug_shows_the_traceback_and_keeps_the_status(bad_inputs):
    for cmd, env in [
        ([_script("agent-gym-view"), "MISSING", "--debug"], {}),
        ([_script("agent-gym-eval"), "--debug", "--env", "AgentR1/NoSuch-v0", "--policy", "oracle"], {}),
        ([_script("agent-gym-train-grpo"), "--config", "unknown_key.yaml"], {"AGENT_GYM_DEBUG": "1"}),
    ]:
        r = _run(cmd, bad_inputs, **env)
        assert r.returncode == 2, (cmd, r.stderr[-3000:])
        assert "Traceback (most recent call last)" in r.stderr, (cmd, r.stderr[-3000:])
        assert r.stderr.strip().splitlines()[-1].startswith("error: "), (cmd, r.stderr[-3000:])
        assert "unrecognized arguments" not in r.stderr, cmd  # --debug was taken out before parsing


@pytest.mark.timeout(180)
def test_usage_lines_name_what_the_user_typed(tmp_path):
    for cmd, prog in [
        ([_script("agent-gym-train-ppo")], "agent-gym-train-ppo"),
        ([_script("agent-gym-train-grpo")], "agent-gym-train-grpo"),
        ([_script("agent-gym-sft")], "agent-gym-sft"),
        ([_script("agent-gym-eval")], "agent-gym-eval"),
        ([_script("agent-gym-serve")], "agent-gym-serve"),
        ([_script("agent-gym-retrieval-server")], "agent-gym-retrieval-server"),
        ([_script("agent-gym-view")], "agent-gym-view"),
        ([sys.executable, str(ROOT / "trainers" / "train_ppo.py")], "train_ppo.py"),
        ([sys.executable, str(ROOT / "trainers" / "evaluate.py")], "evaluate.py"),
        ([sys.executable, "-m", "agent_gym.serve"], "python -m agent_gym.serve"),
    ]:
        r = _run([*cmd, "--help"], tmp_path)
        assert r.returncode == 0 and r.stdout.startswith(f"usage: {prog} "), (cmd, r.stdout[:500], r.stderr[-2000:])
        assert "--debug" in r.stdout and "AGENT_GYM_DEBUG=1" in r.stdout, (cmd, r.stdout[-500:])
    r = _run([_script("agent-gym-train"), "--help"], tmp_path)
    assert r.returncode == 0 and "usage: agent-gym-train " in r.stdout, r.stdout[:500]


# -- the rule itself, in this process ----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_run_main_maps_known_errors_to_one_line_and_keeps_bugs(capsys, monkeypatch):
    monkeypatch.delenv("AGENT_GYM_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["agent-gym-x"])

    def raising(e: BaseException):
        def main():
            raise e

        return main

    assert run_main(lambda: 0) == 0 and run_main(lambda: None) == 0 and run_main(lambda: 3) == 3
    cases = [
        (UsageError("bad thing; pass --good"), 2, "error: bad thing; pass --good"),
        (SystemExit("error: no checkpoint there; pass a run"), 2, "error: no checkpoint there; pass a run"),
        (
            FileNotFoundError(2, "No such file or directory", "x.yaml"),
            2,
            "error: no such file or directory: 'x.yaml'; check the path",
        ),
        (KeyboardInterrupt(), 130, "error: interrupted (Ctrl-C)"),
    ]
    for e, status, line in cases:
        assert run_main(raising(e)) == status, e
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(line) and "Traceback" not in err, err
    import yaml

    try:
        yaml.safe_load("a: [1\n")
    except yaml.YAMLError as e:
        assert run_main(raising(e)) == 2 and "not valid YAML" in capsys.readouterr().err
    import gymnasium

    with pytest.raises(gymnasium.error.Error) as gym_err:
        gymnasium.make("AgentR1/NoSuch-v0")
    assert run_main(raising(gym_err.value)) == 2 and "AgentR1/FactChain-v0" in capsys.readouterr().err
    # a bug keeps its traceback: a library's or Python's own ValueError, any other exception
    for bug in (ZeroDivisionError("x"), RuntimeError("internal"), KeyError("k")):
        with pytest.raises(type(bug)):
            run_main(raising(bug))
    with pytest.raises(ValueError):
        run_main(lambda: int("not a number"))  # raised by Python, not a project check
    with pytest.raises(SystemExit) as ex:
        run_main(lambda: sys.exit(5))  # a status of its own passes through
    assert ex.value.code == 5


@pytest.mark.timeout(30)
def test_debug_flag_and_prog_name(monkeypatch):
    argv = ["cmd", "--debug", "x", "--", "--debug"]
    assert take_debug_flag(argv) and argv == ["cmd", "x", "--", "--debug"]
    assert not take_debug_flag(["cmd", "x"])
    monkeypatch.setattr(sys, "argv", ["/venv/bin/agent-gym-train-ppo", "--config", "x"])
    assert prog_name("train_ppo") == "agent-gym-train-ppo"
    assert prog_name("train_ppo", argv=["--config", "x"]) == "train_ppo"  # called from Python
    assert "did you mean AgentR1/FactChain-v0?" in registered_ids_hint("AgentR1/Factchain-v1")


@pytest.mark.timeout(60)
def test_project_errors_are_user_errors_with_their_old_bases():
    """The project's error types are ``UserError`` (one line at the command line) and keep the base
    classes Python callers catch."""
    from agent_gym.datasets.base import DataPathError, DatasetDownloadError, DatasetFormatError
    from agent_gym.view import ViewerError
    from trainers.errors import ConfigError
    from trainers.models import ModelLoadError

    for cls, base in [
        (ConfigError, ValueError),
        (ModelLoadError, ValueError),
        (ViewerError, ValueError),
        (DatasetFormatError, ValueError),
        (DatasetDownloadError, RuntimeError),
        (DataPathError, FileNotFoundError),
    ]:
        assert issubclass(cls, UserError) and issubclass(cls, base), cls
    e = DatasetDownloadError(
        "hotpotqa: ... e.g. load_qa('hotpotqa', data_path=...)",
        dataset="hotpotqa",
        filename="f.json",
        url="http://x/f.json",
        reason="offline",
    )
    assert "load_qa(" in str(e)  # Python users keep the Python form
    assert "--env-kwargs '{data_path: FILE_OR_DIR" in describe(e)
    assert "load_qa(" not in describe(e)
