"""Cost of one sandboxed call (the namespace sandbox against the one before it): the sandbox before (bubblewrap + prlimit, no
seccomp, no cgroups), the sandbox now (seccomp filter, per-call cgroups, private tmpfs with an
inode bound, pid-namespace teardown), and a bare ``python3 -I -S`` start with no sandbox (the floor).

    python -m benchmarks.perf.sandbox_cost                     # 5 rounds x 20 calls per side
    python -m benchmarks.perf.sandbox_cost --rounds 3 --calls 10
    python -m benchmarks.perf.sandbox_cost --soak 1000         # also: 1,000 hostile calls in a row
    python -m benchmarks.perf.sandbox_cost --old-ref 722e39f^  # the "before" sandbox from another commit
    python -m benchmarks.perf.sandbox_cost --attacks           # the hostile tests' attacks, before and now

The sides are interleaved (bare, old, new, bare, old, new, ...) over ``--rounds`` rounds; each round
times ``--calls`` calls of each, running an empty program. The old sandbox is
``git show OLD_REF:agent_gym/sandbox.py`` imported as a separate module. Overhead = a side's
per-call time minus bare's in the same round. Prints the medians and ranges, the ratio new/old and
the load average; results go to ``benchmarks/results/sandbox_cost.json``. ``--soak N`` runs the
hostile soak of ``tests/agent_gym/test_sandbox_hostile.py`` (the reaper hijack every 50th call)
and records the host's state before and after. ``--attacks`` runs the attacks of that test file
through the old and the new sandbox and prints what each achieved (what the tests' assertions
would have found before the fix).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from agent_gym import sandbox as new  # noqa: E402

# The last commit whose sandbox predates the namespace sandbox.
DEFAULT_OLD_REF = "e5dff7d"


def load_old(ref: str):
    src = subprocess.run(
        ["git", "show", f"{ref}:agent_gym/sandbox.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    if "seccomp" in src:
        raise SystemExit(
            f"{ref}:agent_gym/sandbox.py already has the seccomp filter: pass --old-ref "
            "a commit from before the namespace sandbox"
        )
    path = Path(tempfile.mkdtemp()) / "old_sandbox.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_sandbox", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = mod
    spec.loader.exec_module(mod)
    mod.__ref__ = ref
    return mod


def attacks(old) -> list[str]:
    """Each class of the hostile-code attacks, through the old sandbox and the new one: the lines printed."""
    from tests.agent_gym import test_sandbox_hostile as hostile

    lines: list[str] = []

    def say(line: str) -> None:
        print(line)
        lines.append(line)

    def survivors(mod) -> list[int]:
        time.sleep(1)
        mine = mod.issued_uids()
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _uid(p) in mine and _state(p) not in "ZX"]
        for pid in pids:  # clean up after the old sandbox
            os.kill(pid, 9)
        return pids

    big = {"wall_s": 20, "cpu_s": 10, "memory_mb": 128, "max_procs": 8}
    for label, mod in (("before", old), ("now", new)):
        r = mod.run_python(hostile.REAPER_HIJACK, {"wall_s": 2})
        say(f"{label:>6} reaper hijack: {r.status}; live processes 1 s after the call: {len(survivors(mod))}")
        say(f"{label:>6} ptrace/process_vm on the reaper: {mod.run_python(hostile.PTRACE_REAPER, big).stdout.strip()}")
        for name in ("SYSV_SHM", "MEMFD"):
            r = mod.run_python(getattr(hostile, name), big)
            say(f"{label:>6} {name}: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.status}")
        flood = (
            "import os\nn = 0\ntry:\n    while n < 30000:\n        os.mkdir(f'/tmp/d{n}')\n        n += 1\n"
            "except OSError as e:\n    print(e.strerror)\nprint('directories', n)"
        )
        say(f"{label:>6} inode flood: {mod.run_python(flood, big).stdout.strip().splitlines()[-1]}")
        r = mod.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", big)
        say(f"{label:>6} self-SIGKILL: {r.status}, {r.detail}")
        helper = hostile.KEYRING_HELPER
        if mod is old:
            helper = helper.replace(
                "from agent_gym.sandbox import run_python",
                f"import sys; sys.argv = ['x', '--old-ref', {old.__ref__!r}]; "
                "from benchmarks.perf import sandbox_cost; "
                "run_python = sandbox_cost.load_old(sys.argv[2]).run_python",
            )
        p = subprocess.run(
            [sys.executable, "-c", helper],
            input=hostile.KEYRING_ATTACK,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        say(f"{label:>6} keyring: {p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-300:]}")
    return lines


def _uid(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _state(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "X"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--old-ref", default=DEFAULT_OLD_REF)
    ap.add_argument("--soak", type=int, default=0, help="also run this many hostile calls in a row")
    ap.add_argument("--attacks", action="store_true", help="run the hostile tests' attacks on old and new")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sandbox_cost.json"))
    args = ap.parse_args()
    if args.rounds < 3 or args.calls < 1:
        raise SystemExit("--rounds must be at least 3 and --calls at least 1")
    old = load_old(args.old_ref)
    python = new.default_python()
    new.check_available(python)
    old.check_available(python)
    if args.attacks:
        write_raw(__file__, {"old_ref": args.old_ref, "attacks": attacks(old)}, label="attacks")
        return
    limits = {"wall_s": 30}

    def bare() -> None:
        subprocess.run([python, "-I", "-S", "-u", "-"], input=b"", env={}, cwd="/", check=True, capture_output=True)

    def run_old() -> None:
        assert old.run_python("", limits).status == "ok"

    def run_new() -> None:
        r = new.run_python("", limits)
        assert r.status == "ok", r

    sides = {"bare": bare, "old": run_old, "new": run_new}
    per_call: dict[str, list[float]] = {k: [] for k in sides}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            per_call[name].append((time.perf_counter() - t0) / args.calls * 1000)
        loads.append(os.getloadavg()[0])
    overhead = {k: [per_call[k][i] - per_call["bare"][i] for i in range(args.rounds)] for k in ("old", "new")}
    ratio = [per_call["new"][i] / per_call["old"][i] for i in range(args.rounds)]
    res = {
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "old_ref": args.old_ref,
        "isolation": new.cgroup_plan().mode,
        "cgroup_plan": str(new.cgroup_plan()),
        "per_call_ms": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in per_call.items()},
        "overhead_ms": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in overhead.items()},
        "ratio_new_over_old": {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio)},
        "load_avg": {"min": min(loads), "max": max(loads)},
        "cpus": os.cpu_count(),
    }
    for k, v in res["per_call_ms"].items():
        print(f"{k:>4}: {v['median']:7.1f} ms a call (range {v['min']:.1f}-{v['max']:.1f})")
    for k, v in res["overhead_ms"].items():
        print(
            f"overhead {k}: {v['median']:6.1f} ms a call over a bare python start (range {v['min']:.1f}-{v['max']:.1f})"
        )
    r = res["ratio_new_over_old"]
    print(
        f"new / old: {r['median']:.2f} (range {r['min']:.2f}-{r['max']:.2f}); load average "
        f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs; isolation {res['isolation']}"
    )
    if args.soak:
        from tests.agent_gym import test_sandbox_hostile as hostile  # the hostile programs and host checks of the tests

        t0 = time.monotonic()
        before, after, reasons = hostile.soak(args.soak)
        took = time.monotonic() - t0
        leaks = {k: after[k] for k in ("processes", "files", "cgroups", "mount_point") if after[k]}
        res["soak"] = {
            "calls": args.soak,
            "seconds": took,
            "reasons": reasons,
            "before": before,
            "after": after,
            "shmem_growth_mb": after["shmem_mb"] - before["shmem_mb"],
            "slab_unreclaimable_growth_mb": after["slab_unreclaimable_mb"] - before["slab_unreclaimable_mb"],
            "fd_growth": after["fds"] - before["fds"],
            "leaks": leaks,
            "load_avg_after": os.getloadavg()[0],
        }
        print(
            f"soak: {args.soak} hostile calls in {took:.0f} s, ends {reasons}; host Shmem "
            f"{before['shmem_mb']} -> {after['shmem_mb']} MiB, unreclaimable slab {before['slab_unreclaimable_mb']} -> "
            f"{after['slab_unreclaimable_mb']} MiB, available {before['mem_available_mb']} -> "
            f"{after['mem_available_mb']} MiB, descriptors {before['fds']} -> {after['fds']}, leaks {leaks or 'none'}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    write_raw(__file__, res, outputs=[args.out])


if __name__ == "__main__":
    main()
