"""Experiment trackers beside metrics.jsonl: MLflow to a local file store and Weights & Biases in
offline mode (trainers/logger.py, ``run.mlflow`` / ``run.wandb``). A short real run of the tiny
model on FactChain logs to each; what the tracker stored is read back with the tracker's own
reader and must equal metrics.jsonl, value for value. Neither needs a server, a login or the
network. A tracker asked for but not installed stops the run with one line naming the extra.

Both packages are the ``mlflow`` and ``wandb`` extras (pyproject.toml), installed by ``make setup``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainers.errors import ConfigError
from trainers.logger import RunLogger, read_metrics


def _tiny_run(run_dir: Path, **run_keys) -> list[dict]:
    """Two PPO iterations of a one-layer random tiny model on FactChain (the critic makes every
    update a real one, so the policy metrics are logged too); returns metrics.jsonl's records."""
    from trainers.compose import run
    from trainers.config import from_dict

    cfg = from_dict(
        {
            "run": {
                "run_dir": str(run_dir),
                "iterations": 2,
                "checkpoint_every": 100,
                "tensorboard": False,
                "progress_bar": False,
                "log_trajectories": 0,
                **run_keys,
            },
            "model": {"name": "tiny", "tiny_layers": 1, "torch_threads": 1},
            "rollout": {
                "env_id": "AgentR1/FactChain-v0",
                "tasks_per_iter": 2,
                "group_size": 2,
                "max_turn_tokens": 8,
                "env_kwargs": {"tools_in_prompt": False},
            },
            "algorithm": {"algo": "ppo", "minibatch_size": 4},
            "eval": {"env_kwargs": {"split": "test"}, "every": 100, "tasks": 1},
        }
    )
    run(cfg)
    recs = read_metrics(run_dir)
    assert [r["iteration"] for r in recs] == [0, 1]
    return recs


def _scalars(rec: dict) -> dict[str, float]:
    """What MLflow gets of a metrics.jsonl record: its finite numbers (as TensorBoard)."""
    return {
        k: float(v) for k, v in rec.items() if k != "iteration" and isinstance(v, (int, float)) and math.isfinite(v)
    }


@pytest.mark.timeout(400)
def test_mlflow_file_store_holds_the_metrics_of_metrics_jsonl(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow-skinny is missing: pip install -e '.[mlflow]' (make setup does)")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run"
    recs = _tiny_run(run_dir, mlflow=True)
    assert "policy/loss" in recs[-1] and "eval/success_rate" in recs[0]

    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("agent_gym")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    keys = set().union(*(_scalars(r) for r in recs))
    assert set(run.data.metrics) == keys
    for key in sorted(keys):
        want = [(r["iteration"], _scalars(r)[key]) for r in recs if key in _scalars(r)]
        got = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert got == want, key
    # The run's config, flattened: one param per key.
    assert run.data.params["run.iterations"] == "2"
    assert run.data.params["algorithm.algo"] == "ppo"
    assert run.data.params["rollout.env_id"] == "AgentR1/FactChain-v0"


@pytest.mark.timeout(400)
def test_wandb_offline_run_holds_the_metrics_of_metrics_jsonl(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is missing: pip install -e '.[wandb]' (make setup does)")
    # No login, no key, no mode: the logger's default is offline.
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no saved settings
    run_dir = tmp_path / "run"
    recs = _tiny_run(run_dir, wandb=True)

    [log] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb's own reader of the transaction log (`wandb leet inspect`), as JSON lines.
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    history = [r["history"] for r in records if r.get("type") == "history"]
    assert [h["step"]["num"] for h in history] == [0, 1]
    for h, rec in zip(history, recs):
        item = {k: v for k, v in h["item"].items() if not k.startswith("_")}
        assert item == rec  # every key, the iteration included, with the same value
    [run] = [r["run"] for r in records if r.get("type") == "run"]
    assert run["project"] == "agent_gym" and run["display_name"] == "run"
    config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
    assert config == yaml.safe_load((run_dir / "config.yaml").read_text())  # the run's whole config


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tracker, extra", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_tracker_asked_for_but_missing_stops_with_one_line(tmp_path, monkeypatch, tracker, extra):
    # A None entry in sys.modules is Python's own "this module cannot be imported".
    monkeypatch.setitem(sys.modules, tracker, None)
    with pytest.raises(ConfigError) as e:
        RunLogger(tmp_path, 2, tensorboard=False, progress_bar=False, **{tracker: True})
    msg = str(e.value)
    assert "\n" not in msg
    assert f"run.{tracker} is true but" in msg and f".[{extra}]" in msg and f"run.{tracker}=false" in msg
