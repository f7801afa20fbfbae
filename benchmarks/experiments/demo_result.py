"""What does `make demo` reach now? Runs the demo's two commands exactly as the Makefile's ``demo``
target writes them (read from the Makefile, so the two cannot drift apart), samples the load
average while they run, and keeps the result: the SFT warm start's final loss and greedy success,
the PPO run's iterations and its last greedy evaluation on the four sets (first 64 train questions,
64 held-out questions, 64 questions over a KB never trained on, one question over each of 64 KBs
never trained on), and each stage's minutes. README.md and docs/results.md cite the file this
writes (``results/demo_result/<UTC date>_<label>.json``); tests/test_demo_figures.py checks that
the README's figures are that file's and that the demo has not changed since.

    python benchmarks/experiments/demo_result.py               # run the demo, then keep its figures
    python benchmarks/experiments/demo_result.py --from-runs   # keep the figures of the runs already there

``--from-runs`` reads ``runs/factchain_sft_stream`` and ``runs/factchain_ppo_stream`` as they are
(the load average while they ran is then unknown: only the runs' own minutes are kept). The set-up
step of ``make demo`` (``make setup``) is not run: run it first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent_gym.provenance import write_raw

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = REPO / "Makefile"
SFT_DIR = Path("runs/factchain_sft_stream")
PPO_DIR = Path("runs/factchain_ppo_stream")
SETS = {
    "pool": "eval/success_rate",
    "heldout": "eval/heldout/success_rate",
    "fresh_kb": "eval/fresh_kb/success_rate",
    "fresh_kbs": "eval/fresh_kbs/success_rate",
}
"""The PPO run's four greedy success rates the README states, in its order, and their metric keys."""
SFT_SETS = {
    "heldout": "eval/success_rate",
    "fresh_kb": "eval/fresh_kb/success_rate",
    "fresh_kbs": "eval/fresh_kbs/success_rate",
}
"""The SFT run's own end-of-run evaluation: its eval env is 64 test questions over KBs 0..63
(held-out questions), then the same fresh-KB sets as PPO's."""
LOAD_EVERY_S = 10.0


def demo_commands(makefile: Path = MAKEFILE) -> list[str]:
    """The recipe lines of the Makefile's ``demo`` target, with ``$(BIN)`` (and the variables it is
    made of) resolved from the Makefile's own variable lines."""
    text = makefile.read_text()
    variables = dict(re.findall(r"^([A-Z_]+)\s*[:?]?=\s*(.*?)\s*$", text, flags=re.M))
    m = re.search(r"^demo:[^\n]*\n((?:\t[^\n]*\n)+)", text, flags=re.M)
    if m is None:
        raise SystemExit(f"{makefile}: no demo target")

    def resolve(s: str) -> str:
        for _ in range(5):  # nested variables: BIN := $(VENV)/bin
            s = re.sub(r"\$\(([A-Z_]+)\)", lambda v: variables.get(v.group(1), v.group(0)), s)
        return s

    return [resolve(line.strip()) for line in m.group(1).splitlines() if line.strip()]


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def config_digest(path: str | Path) -> str:
    """sha256 of a config's parsed YAML as canonical JSON: its settings, not its comments or layout
    (tests/test_demo_figures.py compares it with the config as it is now)."""
    data = _yaml(REPO / path)
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def demo_configs(commands: list[str]) -> dict[str, str]:
    """Each command's ``--config`` file and its :func:`config_digest`."""
    out = {}
    for cmd in commands:
        words = shlex.split(cmd)
        if "--config" in words:
            path = words[words.index("--config") + 1]
            out[path] = config_digest(path)
    return out


class LoadSampler:
    """The 1-minute load average every ``LOAD_EVERY_S`` seconds while a command runs."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(round(os.getloadavg()[0], 2))
            if self._stop.wait(LOAD_EVERY_S):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float | int]:
        s = self.samples
        return {"mean": round(sum(s) / len(s), 2), "min": min(s), "max": max(s), "samples": len(s)}


def run_commands(commands: list[str]) -> list[dict]:
    """Run each command from the repository root (stop at the first failure); its wall minutes
    and the load average while it ran."""
    out = []
    for cmd in commands:
        print(f"$ {cmd}", flush=True)
        t0 = time.monotonic()
        with LoadSampler() as load:
            rc = subprocess.run(shlex.split(cmd), cwd=REPO).returncode
        out.append(
            {
                "command": cmd,
                "returncode": rc,
                "wall_min": round((time.monotonic() - t0) / 60, 2),
                "load_average_1min": load.summary(),
            }
        )
        if rc:
            raise SystemExit(f"{cmd!r} exited {rc}: no result kept")
    return out


def _round(x: float) -> float:
    return round(float(x), 4)


def sft_figures(run_dir: Path) -> dict:
    cfg = _yaml(run_dir / "config.yaml")
    final = json.loads((run_dir / "final.json").read_text())
    return {
        "run_dir": str(run_dir),
        "steps": cfg["steps"],
        "num_demos": cfg["num_demos"],
        "lr": cfg["lr"],
        "seed": cfg["seed"],
        "final_loss": _round(final["sft/loss"]),
        "success": {name: _round(final[key]) for name, key in SFT_SETS.items()},
        "minutes": round(final["time/elapsed_min"], 2),
    }


def ppo_figures(run_dir: Path) -> dict:
    cfg = _yaml(run_dir / "config.yaml")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in recs if SETS["pool"] in r]
    if not evals:
        raise SystemExit(f"{run_dir}: no evaluation in metrics.jsonl")
    last = evals[-1]
    return {
        "run_dir": str(run_dir),
        "iterations_configured": cfg["run"]["iterations"],
        "iterations_run": recs[-1]["iteration"] + 1,
        "seed": cfg["run"]["seed"],
        "max_minutes": cfg["run"]["max_minutes"],
        "lr": cfg["algorithm"]["lr"],
        "final_eval_iteration": last["iteration"],
        "success": {name: _round(last[key]) for name, key in SETS.items()},
        "evals": [{"iteration": r["iteration"], **{name: _round(r[key]) for name, key in SETS.items()}} for r in evals],
        "minutes": round(recs[-1]["time/elapsed_min"], 2),
        "seconds_per_iteration_median": round(sorted(r["time/iteration_s"] for r in recs)[len(recs) // 2], 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from-runs", action="store_true", help="do not run the demo: keep the figures of the runs there")
    args = ap.parse_args(argv)
    os.chdir(REPO)
    commands = demo_commands()
    configs = demo_configs(commands)  # before the runs: what they were started with
    stages = None if args.from_runs else run_commands(commands)
    if demo_configs(commands) != configs or demo_commands() != commands:
        raise SystemExit("the demo's configs or the Makefile's demo target changed while it ran: no result kept")
    result = {
        "commands": commands,
        "configs": configs,
        "stages": stages,
        "niceness": os.nice(0),
        "sft": sft_figures(SFT_DIR),
        "ppo": ppo_figures(PPO_DIR),
    }
    summary = {
        "sft_final_loss": result["sft"]["final_loss"],
        "sft_success": result["sft"]["success"],
        "ppo_iterations": result["ppo"]["iterations_run"],
        "ppo_success": result["ppo"]["success"],
    }
    print(json.dumps(summary))
    write_raw(__file__, result, argv=argv, outputs=[SFT_DIR, PPO_DIR])
    return 0


if __name__ == "__main__":
    sys.exit(main())
