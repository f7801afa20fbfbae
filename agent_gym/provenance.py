"""Where a benchmark's raw output goes, and what produced it (so a figure cited in docs/results.md can be checked).

Every script in ``benchmarks/`` ends with ``write_raw(__file__, result)``: the figures it measured
(``result``, any JSON-able data) go to ``results/<script stem>/<UTC date>_<label>.json`` as

    {"provenance": {command, git commit and dirty state, start and end dates, load averages, CPUs,
                    host, Python and the loaded packages' versions, ...},
     "result": <the script's data>}

so that a figure cited in docs/results.md can be checked against the run that produced it
(results/README.md: the layout and the rule for committing these files). Standard library only,
and no heavy import: ``torch`` is looked at only when the script already imported it.

Importing this module marks the script's start (its date and load average): scripts import it
with their other imports. The folder is ``results/`` at the repository's root, or
``$AGENT_GYM_RESULTS_DIR``; under pytest without that variable, a temporary folder, so that no
test run writes into the committed one. ``$AGENT_GYM_RESULTS_LABEL`` names a run whose script
passes no label (the default label is the commit's short hash, ``-dirty`` when the tree has
uncommitted changes). An existing file is never overwritten: the name gets ``_2``, ``_3``, ...
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
ENV_DIR = "AGENT_GYM_RESULTS_DIR"
ENV_LABEL = "AGENT_GYM_RESULTS_LABEL"
GIT_TIMEOUT_S = 10.0
MAX_CHANGED_LISTED = 20
BIG_BYTES = 1 << 20
"""A raw file over this size is too big to commit: write_raw says so (results/README.md)."""

PACKAGES = (
    "numpy",
    "scipy",
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "datasets",
    "trl",
    "vllm",
    "ray",
    "gymnasium",
    "pettingzoo",
    "bm25s",
    "pyserini",
    "math_verify",
    "yaml",
    "psutil",
    "matplotlib",
)
"""Reported with their versions when the script has imported them (nothing is imported here)."""
ENV_VARS = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "AGENT_GYM_SHARED_DATA",
    "PYTHONHASHSEED",
)
"""Environment variables that change what a benchmark measures, recorded when set."""

FIELDS = (
    "script",
    "command",
    "argv",
    "cwd",
    "python_executable",
    "git",
    "started_utc",
    "finished_utc",
    "wall_s",
    "load_average",
    "cpu_count",
    "cpus_usable",
    "hostname",
    "platform",
    "python",
    "packages",
    "env",
    "label",
    "outputs",
)
"""The keys of every provenance record (tests/test_results_provenance.py checks them)."""

_START = {"utc": _dt.datetime.now(_dt.UTC), "monotonic": time.monotonic()}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not available on this platform
        return None


_START["load"] = _loadavg()


def _iso(t: _dt.datetime) -> str:
    return t.isoformat(timespec="seconds")


def _rel(path: str | os.PathLike) -> str:
    """``path`` relative to the repository when it lies inside it, else as given (a link such as
    the venv's ``python`` is named as written, not as resolved)."""
    s = os.fspath(path)
    a = Path(os.path.abspath(s))
    for p in (a, a.resolve()):
        try:
            return str(p.relative_to(REPO))
        except (ValueError, OSError):
            continue
    return s


def _git(*args: str) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why not)."""
    try:
        r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        return None, "git is not installed"
    except subprocess.TimeoutExpired:
        return None, f"git {args[0]} took over {GIT_TIMEOUT_S:g} s"
    except OSError as e:
        return None, f"git: {e}"
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or [f"git {args[0]} exited {r.returncode}"])[-1]
    return r.stdout, None


def git_state(script: str | None = None) -> dict[str, Any]:
    """The commit checked out (``"unknown"`` with the reason when git cannot tell), whether tracked
    files differ from it (``dirty``; untracked files do not count) and which, and whether ``script``
    itself is tracked."""
    out, err = _git("rev-parse", "HEAD")
    if out is None:
        return {
            "commit": "unknown",
            "short": "unknown",
            "dirty": None,
            "changed": [],
            "changed_count": None,
            "script_tracked": None,
            "error": err,
        }
    commit = out.strip()
    state: dict[str, Any] = {"commit": commit, "short": commit[:7]}
    status, err = _git("status", "--porcelain=v1", "--untracked-files=no")
    if status is None:
        state.update(dirty=None, changed=[], changed_count=None, error=err)
    else:
        lines = [ln for ln in status.splitlines() if ln.strip()]
        state.update(dirty=bool(lines), changed=lines[:MAX_CHANGED_LISTED], changed_count=len(lines))
    state["script_tracked"] = None
    if script:
        listed, _ = _git("ls-files", "--", _rel(script))
        state["script_tracked"] = None if listed is None else bool(listed.strip())
    return state


def _packages() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = str(getattr(mod, "__version__", "?"))
    try:
        out["agent_gym"] = version("agent_gym")
    except Exception:  # noqa: BLE001  not installed (a run by path in another venv)
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            out["torch_threads"] = str(torch.get_num_threads())
            if getattr(torch.version, "cuda", None):
                out["torch_cuda"] = str(torch.version.cuda)
            if torch.cuda.is_initialized():  # never initialises CUDA itself
                out["cuda_device"] = torch.cuda.get_device_name()
        except Exception:  # noqa: BLE001  a partial torch: versions only
            pass
    return out


def _command(script: str | None, argv: Sequence[str] | None) -> tuple[str, list[str]]:
    """The command as a shell line, paths inside the repository made relative to it. ``argv``: the
    arguments a caller passed to the script's ``main(argv)`` in-process, when not ``sys.argv[1:]``
    (then the line is the equivalent run by path)."""
    if argv is not None and list(map(str, argv)) != sys.argv[1:]:
        words = ["python", _rel(script or sys.argv[0]), *map(str, argv)]
        return shlex.join(words), list(map(str, argv))
    orig = list(getattr(sys, "orig_argv", []) or [sys.executable, *sys.argv])
    words = [_rel(orig[0])] + [_rel(w) if os.path.isabs(w) else w for w in orig[1:]]
    return shlex.join(words), list(sys.argv)


def provenance_record(
    script: str | os.PathLike | None = None,
    *,
    argv: Sequence[str] | None = None,
    label: str | None = None,
    outputs: Sequence[str | os.PathLike] = (),
) -> dict[str, Any]:
    """What produced a result: the command, the commit, the dates and load averages at the start
    (this module's import) and now, the machine, and the versions of what ran. Every key of
    ``FIELDS`` is present; a value that cannot be known is ``None`` (the commit: ``"unknown"``)."""
    script_s = str(script) if script is not None else (sys.argv[0] or None)
    now = _dt.datetime.now(_dt.UTC)
    command, args = _command(script_s, argv)
    git = git_state(script_s)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "script": _rel(script_s) if script_s else None,
        "command": command,
        "argv": args,
        "cwd": _rel(os.getcwd()),
        "python_executable": _rel(sys.executable),
        "git": git,
        "started_utc": _iso(_START["utc"]),
        "finished_utc": _iso(now),
        "wall_s": round(time.monotonic() - _START["monotonic"], 3),
        "load_average": {"start": _START["load"], "end": _loadavg()},
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": _packages(),
        "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
        "label": _label(label, git),
        "outputs": [_rel(p) for p in outputs],
    }


def results_dir() -> Path:
    """``$AGENT_GYM_RESULTS_DIR``, else under pytest a temporary folder, else ``results/``."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    if "PYTEST_CURRENT_TEST" in os.environ:  # a test that runs a benchmark: never the committed folder
        return Path(tempfile.gettempdir()) / "agent_gym_results_pytest"
    return RESULTS


def _label(label: str | None, git: dict[str, Any]) -> str:
    label = label or os.environ.get(ENV_LABEL) or (git["short"] + ("-dirty" if git.get("dirty") else ""))
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-.")[:48]
    return clean or "run"


def _jsonable(o: Any) -> Any:
    """What json cannot write itself: paths, sets, numpy and torch values."""
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    if hasattr(o, "tolist"):  # numpy arrays and scalars, torch tensors
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def write_raw(
    script: str | os.PathLike,
    result: Any,
    *,
    label: str | None = None,
    argv: Sequence[str] | None = None,
    outputs: Sequence[str | os.PathLike] = (),
) -> Path:
    """Write ``{"provenance": ..., "result": result}`` to
    ``<results dir>/<script stem>/<UTC date>_<label>.json`` (never over an existing file: ``_2``,
    ``_3``, ... are added) and say where on stderr. ``script``: the calling script's ``__file__``;
    ``argv``: what its ``main(argv)`` was given, when not ``sys.argv``; ``outputs``: the other files
    the run wrote (its ``--out``), recorded by name."""
    record = provenance_record(script, argv=argv, label=label, outputs=outputs)
    text = json.dumps({"provenance": record, "result": result}, indent=1, default=_jsonable) + "\n"
    folder = results_dir() / Path(script).stem
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{record['finished_utc'][:10]}_{record['label']}"
    for k in range(1, 10_000):
        path = folder / (f"{stem}.json" if k == 1 else f"{stem}_{k}.json")
        try:
            with open(path, "x", encoding="utf-8") as f:  # exclusive: an existing file is never replaced
                f.write(text)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{folder}: no free name for {stem}.json")
    shown = _rel(path)
    print(f"raw output with provenance: {shown}", file=sys.stderr)
    if len(text.encode()) > BIG_BYTES:
        print(
            f"note: {shown} is {len(text.encode()) / 2**20:.1f} MiB, too big to commit under results/ "
            "(results/README.md): keep the figures, drop the bulk, before citing it",
            file=sys.stderr,
        )
    return path


def git_tree(ref: str, into: Path, paths: Sequence[str]) -> Path:
    """The files under ``paths`` at commit ``ref``, extracted under ``into`` (a benchmark's "before"
    side: the same script measuring an older tree, interleaved with this one)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, *paths], cwd=REPO, capture_output=True, check=True, timeout=120
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    path = into / "archive.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tf:
        tf.extractall(into)
    return into
