"""Stopping a run cleanly (trainers/stop_signals.py): the first Ctrl-C or SIGTERM finishes the unit of
work (an RL iteration, an SFT step), saves and exits 0; a second quits at once; a finished run puts the
process's handlers back. The runs are the real CLIs on the tiny model, each in its own session, read
through files with deadlines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainers.stop_signals import GracefulStop

ROOT = Path(__file__).resolve().parents[2]


def test_the_first_signal_asks_the_second_quits_and_the_handlers_come_back(capsys):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    called = []
    with GracefulStop("finishing the thing", on_request=lambda: called.append(1)) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs between bytecodes of the main thread
        assert stop.requested and called == [1]
        assert "SIGTERM: finishing the thing (send it again, or Ctrl-C, to quit now)" in capsys.readouterr().out
        with pytest.raises(SystemExit) as e:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert e.value.code == 128 + signal.SIGTERM
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before
    with GracefulStop("again") as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.requested  # Ctrl-C asks too
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _wait_for(pred, proc: subprocess.Popen, log: Path, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not pred():
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before it was signalled:\n{log.read_text()[-3000:]}")
        if time.monotonic() > end:
            pytest.fail(f"nothing after {deadline_s} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _finish(proc: subprocess.Popen, log: Path, deadline_s: float) -> int:
    try:
        return proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {deadline_s} s after the signal:\n{log.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


RL = [
    "trainers/train_grpo.py",
    "--config",
    "configs/factchain_grpo.yaml",
    "model.init_from=null",
    "rollout.tasks_per_iter=2",
    "rollout.group_size=2",
    "algorithm.minibatch_size=4",
    "eval.tasks=2",
    "eval.sets={}",
    "eval.every=1000",
    "run.checkpoint_every=1000",
    "run.max_minutes=null",
    "run.progress_bar=false",
    "run.tensorboard=false",
]


def _rl_run_after_one_iteration(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """The run, once iteration 1 is in flight. Iteration 0's metrics line is written before its
    trajectories and its stop check, so a signal sent the moment the line appears can land while
    iteration 0 is still the one in flight (then the run rightly stops after 0); its trajectories file
    is the last thing it writes, and the next iteration starts microseconds later."""
    run, log = tmp_path / "run", tmp_path / "log.txt"
    proc = _start([*RL, f"run.run_dir={run}"], log)
    _wait_for(lambda: (run / "trajectories" / "iter_00000.jsonl").exists(), proc, log, 240)
    time.sleep(0.5)
    return proc, run, log


@pytest.mark.timeout(400)
def test_sigterm_finishes_the_iteration_saves_a_checkpoint_and_exits_0(tmp_path):
    proc, run, log = _rl_run_after_one_iteration(tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    rc = _finish(proc, log, 120)
    out = log.read_text()
    assert rc == 0, out[-3000:]
    assert "SIGTERM: finishing this iteration and saving a checkpoint" in out
    last = _lines(run / "metrics.jsonl")[-1]["iteration"]
    assert 1 <= last < 999  # it stopped early, after the iteration in flight
    assert (run / "checkpoints" / f"iter_{last:05d}").is_dir(), sorted(os.listdir(run / "checkpoints"))


@pytest.mark.timeout(400)
def test_a_second_sigterm_quits_at_once(tmp_path):
    proc, _, log = _rl_run_after_one_iteration(tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    _wait_for(lambda: "SIGTERM: finishing" in log.read_text(), proc, log, 30)
    os.kill(proc.pid, signal.SIGTERM)
    rc = _finish(proc, log, 60)
    assert rc == 128 + signal.SIGTERM, log.read_text()[-3000:]


@pytest.mark.timeout(400)
def test_sft_stopped_by_sigterm_evaluates_and_saves_what_it_trained(tmp_path):
    run = tmp_path / "sft"
    log = tmp_path / "log.txt"
    args = [
        "trainers/train_sft.py",
        "--config",
        "configs/factchain_sft.yaml",
        f"run_dir={run}",
        "steps=100000",
        "num_demos=64",
        "batch_size=4",
        "eval.tasks=2",
        "eval.every=0",
    ]
    proc = _start(args, log)
    _wait_for(lambda: len(_lines(run / "metrics.jsonl")) >= 3, proc, log, 240)
    os.kill(proc.pid, signal.SIGTERM)
    rc = _finish(proc, log, 120)
    out = log.read_text()
    assert rc == 0, out[-3000:]
    assert "SIGTERM: finishing this step" in out
    final = json.loads((run / "final.json").read_text())
    assert 3 <= final["sft/steps_done"] < 100000 and "eval/success_rate" in final
    assert (run / "model" / "config.json").is_file()
