"""Run outputs: ``metrics.jsonl``, TensorBoard events, optional MLflow and wandb runs, a live
progress bar, ``curves.png``, and sampled ``trajectories/iter_XXXXX.jsonl``. Every metric name is
listed with its meaning in ``docs/metrics.md``.

Trackers (decision): TensorBoard is on by default and skipped with a warning when missing; MLflow
(``run.mlflow``) and wandb (``run.wandb``) are off by default, and one that was switched on but is
not installed stops the run at set-up with one line naming its extra (``ConfigError``), rather than
training for hours without the tracking that was asked for. Neither needs a server, a login or the
network by default: MLflow writes a local file store, ``RUN_DIR/mlruns`` (``MLFLOW_TRACKING_URI``
names another store: a server, ``sqlite:///...``), and wandb runs offline into ``RUN_DIR/wandb``
(``WANDB_MODE=online`` syncs live; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads later).
Both get the scalars TensorBoard gets, at step = iteration, and the run's config.

``python -m trainers.logger RUN_DIR`` redraws ``curves.png`` of a run, live or finished.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from trainers.errors import ConfigError

TRACKER_PROJECT = "agent_gym"
"""The wandb project and the MLflow experiment a run logs to (``WANDB_PROJECT`` and
``MLFLOW_EXPERIMENT_NAME`` name others); the tracker's run is named after the run dir."""


class NullLogger:
    """The logger of a process that does not log: the ranks other than 0 of a torchrun run."""

    def truncate_after(self, iteration: int) -> None:
        pass

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        pass

    def log_trajectories(self, iteration: int, records: Sequence[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


RUN_FILES = (
    "metrics.jsonl",
    "checkpoints",
    "trajectories",
    "tb",
    "mlruns",
    "wandb",
    "curves.png",
    "model",
    "final.json",
    "config.yaml",
)
"""What a run (RL or SFT) writes in its run_dir; ``claim_run_dir`` removes these for ``overwrite``."""
RUN_MARKERS = ("metrics.jsonl", "checkpoints", "model", "final.json")
"""Their presence means the folder holds a run (a lone config.yaml is a run that failed at set-up)."""


def claim_run_dir(run_dir: str | Path, *, overwrite: bool, key: str, resumable: bool) -> None:
    """Make ``run_dir`` a new run's: refused (``ConfigError``) when it already holds a run
    (``RUN_MARKERS``) unless ``overwrite``, which removes that run's files (``RUN_FILES``) first. A
    fresh run would otherwise append its metrics to the old run's ``metrics.jsonl`` (two records per
    iteration) and keep its checkpoints beside the new ones."""
    root = Path(run_dir)
    held = [name for name in RUN_MARKERS if (root / name).exists() and not _empty_dir(root / name)]
    if not held:
        return
    if not overwrite:
        how = f"continue it with --resume {root}, " if resumable else ""
        raise ConfigError(
            f"run_dir {str(root)!r} already holds a run ({', '.join(held)}); {how}choose another "
            f"run_dir, or set {key}=true to replace it"
        )
    for name in RUN_FILES:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


class RunLogger:
    def __init__(
        self,
        run_dir: str | Path,
        total_iterations: int,
        tensorboard: bool = True,
        wandb: bool = False,
        progress_bar: bool = True,
        config: dict[str, Any] | None = None,
        fsync_every_s: float = 30.0,
        mlflow: bool = False,
    ):
        """``fsync_every_s``: metrics.jsonl is flushed to the OS on every line (a killed process
        loses nothing) and fsynced at most this often and at ``close`` (an OS crash loses at most
        that many seconds of lines; 0: fsync every line, about 4 ms each here). ``wandb``,
        ``mlflow``: log to those trackers too (the module docstring); ``ConfigError`` when one is
        asked for and cannot be imported."""
        self.run_dir = Path(run_dir)
        self.fsync_every_s = fsync_every_s
        self._last_fsync = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "trajectories").mkdir(exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional: TensorBoard's writer (extra train)

                self._tb = SummaryWriter(str(self.run_dir / "tb"))
            except ImportError:
                print(
                    "tensorboard is not installed; skipping TensorBoard events (pip install tensorboard)",
                    file=sys.stderr,
                )
        # Both imports first: a missing tracker stops the run before the other one has started a run.
        wandb_mod = _require_tracker("wandb", "wandb") if wandb else None
        mlflow_mod = _require_tracker("mlflow", "mlflow", package="mlflow-skinny") if mlflow else None
        self._wandb = None
        if wandb_mod is not None:
            self._wandb = wandb_mod.init(
                project=os.environ.get("WANDB_PROJECT") or TRACKER_PROJECT,
                name=self.run_dir.resolve().name,
                dir=str(self.run_dir),
                config=config or {},
                mode=os.environ.get("WANDB_MODE") or "offline",
            )
        self._mlflow = MlflowRun(self.run_dir, config or {}) if mlflow_mod is not None else None
        self._bar = None
        if progress_bar:
            try:
                from tqdm import tqdm  # optional: tqdm (extra train)

                self._bar = tqdm(total=total_iterations, desc="train", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass

    def truncate_after(self, iteration: int) -> None:
        """Drop metric lines past ``iteration`` (a resumed run re-does them)."""
        if not self.metrics_path.exists():
            return
        keep = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut by a kill
                continue
            if rec.get("iteration", -1) <= iteration:
                keep.append(line)
        self.metrics_path.write_text("".join(k + "\n" for k in keep))
        if self._bar is not None:
            self._bar.update(iteration + 1 - self._bar.n)

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        rec = {"iteration": iteration, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            if time.monotonic() - self._last_fsync >= self.fsync_every_s:
                os.fsync(f.fileno())
                self._last_fsync = time.monotonic()
        if self._tb is not None:
            for k, v in _scalars(rec).items():
                self._tb.add_scalar(k, v, iteration)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(rec, step=iteration)
        if self._mlflow is not None:
            self._mlflow.log(iteration, _scalars(rec))
        if self._bar is not None:
            post = {
                "reward": metrics.get("rollout/reward_mean"),
                "success": metrics.get("rollout/success_rate"),
                "tok/s": metrics.get("perf/generated_tokens_per_s"),
            }
            if "eval/success_rate" in metrics:
                post["eval"] = metrics["eval/success_rate"]
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in post.items() if v is not None})
            self._bar.update(1)

    def log_trajectories(self, iteration: int, records: Sequence[dict[str, Any]]) -> None:
        path = self.run_dir / "trajectories" / f"iter_{iteration:05d}.jsonl"
        with open(path, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    def sync(self) -> None:
        """fsync metrics.jsonl now."""
        if self.metrics_path.exists():
            with open(self.metrics_path, "a") as f:
                os.fsync(f.fileno())
        self._last_fsync = time.monotonic()

    def close(self) -> None:
        self.sync()
        plot_curves(self.run_dir)
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.close()


def _require_tracker(module: str, key: str, package: str | None = None) -> Any:
    """``module`` imported, or a one-line ``ConfigError`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            f"run.{key} is true but {package or module} cannot be imported ({e}); install it with "
            f"pip install -e '.[{key}]', or set run.{key}=false"
        ) from None


def _scalars(rec: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record (a bool counts as 0 or 1), without its iteration:
    what TensorBoard and MLflow get (wandb gets the whole record)."""
    return {k: v for k, v in rec.items() if k != "iteration" and isinstance(v, (int, float)) and math.isfinite(v)}


class MlflowRun:
    """One MLflow run through ``MlflowClient`` (no global active run): the run's config as params
    (``section.key``; a value that is not a string as JSON), then each iteration's scalars at
    step = iteration. The store is ``MLFLOW_TRACKING_URI`` or the local file store
    ``RUN_DIR/mlruns``; MLflow 3 refuses a file store unless ``MLFLOW_ALLOW_FILE_STORE`` is true
    (it is in maintenance mode there, hence the extra's ``<4``), so it is set to true for this
    process unless already set. ``mlflow ui --backend-store-uri RUN_DIR/mlruns`` shows it."""

    BATCH = 100  # the fewest entries MLflow's log_batch takes of any kind (params: 100, metrics: 1000)
    MAX_PARAM = 6000  # MLflow's longest param value

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param  # optional: mlflow-skinny (extra mlflow)
        from mlflow.tracking import MlflowClient  # optional: mlflow-skinny (extra mlflow)

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        self.client = MlflowClient(self.uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or TRACKER_PROJECT
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(exp_id, run_name=run_dir.resolve().name).info.run_id
        params = [Param(k, v[: self.MAX_PARAM]) for k, v in _flat_params(config).items()]
        for i in range(0, len(params), self.BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + self.BATCH], synchronous=True)

    def log(self, iteration: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric  # optional: mlflow-skinny (extra mlflow)

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, iteration) for k, v in scalars.items()]
        for i in range(0, len(metrics), self.BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + self.BATCH], synchronous=True)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


def _flat_params(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in config.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            out[key if sub is None else f"{key}.{sub}"] = (
                v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            )
    return out


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def plot_curves(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """Reward and success curves (training rollouts and evaluation) to ``curves.png``."""
    recs = read_metrics(run_dir)
    if not recs:
        return None
    try:
        import matplotlib  # optional: matplotlib (extra train)
    except ImportError:
        print("matplotlib is not installed; no curves.png (pip install matplotlib)", file=sys.stderr)
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib (extra train), after matplotlib.use("Agg")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, keys, title in (
        (axes[0], ["rollout/reward_mean"], "reward"),
        (axes[1], ["rollout/success_rate", "eval/success_rate"], "success rate"),
    ):
        for k in keys:
            pts = [(r["iteration"], r[k]) for r in recs if k in r]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if k.startswith("eval") else None, ms=3, label=k)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(out) if out else Path(run_dir) / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m trainers.logger RUN_DIR")
    p = plot_curves(sys.argv[1])
    print(p if p else f"no metrics in {sys.argv[1]}")
