"""What ``import agent_gym`` costs, and what it loads (since 2026-11-25 it no longer imports ``envs``).

    python benchmarks/perf/import_time.py                      # this tree only
    python benchmarks/perf/import_time.py --old-ref 0533258    # and the tree of a commit, interleaved A, B, A, B

Each sample is a fresh interpreter running ``import agent_gym`` under ``-X importtime``; the
figure is the cumulative microseconds Python reports for ``agent_gym`` (the interpreter's own
start-up excluded). The tree under test is put first on ``PYTHONPATH`` of that child process (the
editable install would otherwise resolve ``agent_gym`` to this checkout). Also reported per tree:
whether torch, ``envs`` or ``trainers`` modules were loaded. Prints median, range and the load
average, and saves them to ``benchmarks/results/import_time.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from agent_gym.provenance import git_tree, write_raw

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import sys, agent_gym; "
    "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('torch', 'envs', 'trainers')}))"
)


def sample(tree: Path) -> tuple[float, list[str]]:
    """(milliseconds to import agent_gym, which of torch/envs/trainers it loaded) in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", PROBE],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    line = [ln for ln in res.stderr.splitlines() if ln.rstrip().endswith("| agent_gym")][-1]
    return int(line.split("|")[1]) / 1000.0, json.loads(res.stdout.strip().replace("'", '"'))


def checkout(ref: str, into: Path) -> Path:
    """The tree of ``ref`` (agent_gym, envs, trainers) under ``into``."""
    return git_tree(ref, into, ["agent_gym", "envs", "trainers"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-ref", help="a commit to compare with (its agent_gym, envs and trainers)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "import_time.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="import_time_") as tmp:
        trees = {"now": ROOT}
        if args.old_ref:
            trees[args.old_ref] = checkout(args.old_ref, Path(tmp) / "old")
        times: dict[str, list[float]] = {k: [] for k in trees}
        loaded: dict[str, list[str]] = {}
        loads = [os.getloadavg()[0]]
        for _ in range(args.rounds):  # interleaved: A, B, A, B, ...
            for name, tree in trees.items():
                ms, mods = sample(tree)
                times[name].append(ms)
                loaded[name] = mods
            loads.append(os.getloadavg()[0])
    res = {
        "rounds": args.rounds,
        "load_average_1min": [min(loads), max(loads)],
        "cpus": os.cpu_count(),
        "trees": {
            name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t), "loaded": loaded[name]}
            for name, t in times.items()
        },
    }
    for name, r in res["trees"].items():
        print(
            f"{name:>10}: import agent_gym {r['median_ms']:.0f} ms median (range {r['min_ms']:.0f}-{r['max_ms']:.0f}); "
            f"loaded {r['loaded'] or 'none of torch/envs/trainers'}"
        )
    print(f"load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    write_raw(__file__, res, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
