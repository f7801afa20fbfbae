"""kill -9 at a random point, resume, and get the same metrics as an uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.trainers.conftest import tiny_rl_config
from trainers.config import to_dict

REPO = Path(__file__).resolve().parents[2]


def _metrics(run_dir):
    recs = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "memory/"))} for r in recs]


def _cmd(*args):
    return [sys.executable, str(REPO / "trainers" / "train_grpo.py"), *args]


def _straight_then_start_killed(tmp_path, sft_model, **kw):
    """Run the tiny GRPO config (``kw`` over it) to its end in tmp_path/straight, then start the
    same config in tmp_path/killed and return (env, its process), for the test to kill."""
    cfg = to_dict(tiny_rl_config(tmp_path / "unused", "grpo", sft_model, **kw))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    paths = {}
    for name in ("straight", "killed"):
        cfg["run_dir"] = str(tmp_path / name)
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text("# python trainers/train_grpo.py --config this.yaml\n" + yaml.safe_dump(cfg))
    subprocess.run(
        _cmd("--config", str(paths["straight"])),
        check=True,
        env=env,
        cwd=REPO,
        timeout=600,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc = subprocess.Popen(
        _cmd("--config", str(paths["killed"])), env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return env, proc


def test_kill_9_then_resume_matches_uninterrupted_run(tmp_path, sft_model):
    env, proc = _straight_then_start_killed(tmp_path, sft_model, iterations=6, eval_every=2)
    rng = random.Random(int(time.time()))
    kill_after = rng.randint(1, 4)  # completed iterations before the kill, then a random delay
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        text = metrics.read_text() if metrics.exists() else ""
        lines = text[: text.rfind("\n") + 1].splitlines()  # complete records only
        if len(lines) >= kill_after:
            # a random point inside the next iteration: at most one iteration's time, so the kill
            # lands mid-run however fast iterations are on this machine
            time.sleep(rng.uniform(0, json.loads(lines[-1])["time/iteration_s"]))
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    done_before = len(_metrics(tmp_path / "killed"))
    assert done_before < 6
    _resume(tmp_path / "killed", env)
    straight, resumed = _metrics(tmp_path / "straight"), _metrics(tmp_path / "killed")
    assert [r["iteration"] for r in resumed] == list(range(6))
    assert resumed == straight, f"killed after {done_before} logged iterations"


def _resume(run_dir, env):
    r = subprocess.run(_cmd("--resume", str(run_dir)), env=env, cwd=REPO, timeout=600, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.timeout(600)
@pytest.mark.parametrize("logged", [0, 1])
def test_killed_before_its_first_checkpoint_the_run_starts_over(tmp_path, sft_model, logged):
    """kill -9 before any checkpoint exists (before any iteration ends, or after one ends but
    before the first checkpoint, which only the last iteration writes here): --resume starts the run
    over from iteration 0, drops the lines it logged, and ends as the uninterrupted run does."""
    env, proc = _straight_then_start_killed(tmp_path, sft_model, iterations=3, checkpoint_every=100)
    run_dir = tmp_path / "killed"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if logged == 0 and (run_dir / "config.yaml").exists():
            break
        if (
            logged
            and (run_dir / "metrics.jsonl").exists()
            and (run_dir / "metrics.jsonl").read_text().count("\n") >= logged
        ):
            break  # complete lines only
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert not list(run_dir.glob("checkpoints/iter_*"))
    assert len(_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []) == logged

    out = _resume(run_dir, env)
    assert "yet (the run stopped before its first one); starting it over from iteration 0" in out, out[-2000:]
    assert _metrics(run_dir) == _metrics(tmp_path / "straight")
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*")) == ["iter_00002"]
