"""Peak memory and env-time share of the demo's RL run.

Runs the demo's RL config (``configs/factchain_ppo_stream.yaml`` by default) for a few iterations in a
child process and reports:
- peak resident memory of that process (``ru_maxrss`` of the child), target <= 4 GB;
- env time as a share of iteration time (``time/env_s / time/iteration_s``, median over the
  iterations), target <= 5%.

    python benchmarks/perf/demo_resources.py [--config configs/factchain_ppo_stream.yaml] [--iterations 8]

It needs the SFT model the config starts from (``make demo`` writes it); without it the run
starts from the untrained tiny model, which has the same shapes and so the same memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from agent_gym.provenance import write_raw

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/factchain_ppo_stream.yaml")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/results/demo_resources.json")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    import yaml

    cfg = yaml.safe_load((REPO / args.config).read_text())
    script = "train_ppo.py" if (cfg.get("algorithm") or {}).get("algo", "ppo") == "ppo" else "train_grpo.py"
    run_dir = tempfile.mkdtemp(prefix="demo_resources_")
    overrides = [
        f"run.run_dir={run_dir}",
        f"run.iterations={args.iterations}",
        "run.progress_bar=false",
        "run.max_minutes=null",
    ]
    init = (cfg.get("model") or {}).get("init_from")
    if init and not (REPO / init).is_dir() and not any(o.startswith("model.init_from=") for o in args.overrides):
        print(f"note: {init} not found; starting from the untrained tiny model (same shapes)")
        overrides.append("model.init_from=null")
    cmd = [
        sys.executable,
        str(REPO / "trainers" / script),
        "--config",
        str(REPO / args.config),
        *overrides,
        *args.overrides,
    ]
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    recs = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    frac = [r["time/env_fraction"] for r in recs]
    out = {
        "config": args.config,
        "iterations": len(recs),
        "peak_rss_gb": peak_kb / 1024**2,
        "env_fraction_median": statistics.median(frac),
        "env_fraction_max": max(frac),
        "iteration_s_median": statistics.median(r["time/iteration_s"] for r in recs),
        "env_s_median": statistics.median(r["time/env_s"] for r in recs),
    }
    for k, v in out.items():
        print(f"{k:22s} {v:.4f}" if isinstance(v, float) else f"{k:22s} {v}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    write_raw(__file__, out, outputs=[args.out])


if __name__ == "__main__":
    main()
