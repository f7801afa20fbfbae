"""Run outputs: ``metrics.jsonl``, TensorBoard events, an optional wandb run, a live progress
bar, ``curves.png``, and sampled ``trajectories/iter_XXXXX.jsonl``. Every metric name is listed
with its meaning in ``docs/metrics.md``.

``python -m trainers.logger RUN_DIR`` redraws ``curves.png`` of a run, live or finished.
"""

from __future__ import annotations

import json
import math
import os
import time
import sys
from pathlib import Path
from typing import Any, Sequence


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


RUN_FILES = ("metrics.jsonl", "checkpoints", "trajectories", "tb", "curves.png", "model", "final.json", "config.yaml")
"""What a run (RL or SFT) writes in its run_dir; ``claim_run_dir`` removes these for ``overwrite``."""
RUN_MARKERS = ("metrics.jsonl", "checkpoints", "model", "final.json")
"""Their presence means the folder holds a run (a lone config.yaml is a run that failed at set-up)."""


def claim_run_dir(run_dir: str | Path, *, overwrite: bool, key: str, resumable: bool) -> None:
    """Make ``run_dir`` a new run's: refused (``ConfigError``) when it already holds a run
    (``RUN_MARKERS``) unless ``overwrite``, which removes that run's files (``RUN_FILES``) first. A
    fresh run would otherwise append its metrics to the old run's ``metrics.jsonl`` (two records per
    iteration) and keep its checkpoints beside the new ones."""
    import shutil

    from trainers.errors import ConfigError

    root = Path(run_dir)
    held = [name for name in RUN_MARKERS if (root / name).exists() and not _empty_dir(root / name)]
    if not held:
        return
    if not overwrite:
        how = f"continue it with --resume {root}, " if resumable else ""
        raise ConfigError(f"run_dir {str(root)!r} already holds a run ({', '.join(held)}); {how}choose another "
                          f"run_dir, or set {key}=true to replace it")
    for name in RUN_FILES:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


class RunLogger:
    def __init__(self, run_dir: str | Path, total_iterations: int, tensorboard: bool = True, wandb: bool = False,
                 progress_bar: bool = True, config: dict[str, Any] | None = None, fsync_every_s: float = 30.0):
        """``fsync_every_s``: metrics.jsonl is flushed to the OS on every line (a killed process
        loses nothing) and fsynced at most this often and at ``close`` (an OS crash loses at most
        that many seconds of lines; 0: fsync every line, about 4 ms each here)."""
        self.run_dir = Path(run_dir)
        self.fsync_every_s = fsync_every_s
        self._last_fsync = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "trajectories").mkdir(exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tb"))
            except ImportError:
                print("tensorboard is not installed; skipping TensorBoard events (pip install tensorboard)", file=sys.stderr)
        self._wandb = None
        if wandb:
            try:
                import wandb as _wandb

                self._wandb = _wandb.init(project="agent_gym", dir=str(self.run_dir), config=config or {})
            except ImportError:
                print("wandb is not installed; skipping (pip install wandb)", file=sys.stderr)
        self._bar = None
        if progress_bar:
            try:
                from tqdm import tqdm

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
            for k, v in rec.items():
                if k != "iteration" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, iteration)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(rec, step=iteration)
        if self._bar is not None:
            post = {"reward": metrics.get("rollout/reward_mean"), "success": metrics.get("rollout/success_rate"),
                    "tok/s": metrics.get("perf/generated_tokens_per_s")}
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
        import matplotlib
    except ImportError:
        print("matplotlib is not installed; no curves.png (pip install matplotlib)", file=sys.stderr)
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, keys, title in ((axes[0], ["rollout/reward_mean"], "reward"),
                            (axes[1], ["rollout/success_rate", "eval/success_rate"], "success rate")):
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
