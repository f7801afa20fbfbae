"""Checkpoints: atomic, verified, periodic, and enough to continue a run exactly.

A checkpoint directory ``checkpoints/iter_XXXXX/`` holds

- ``state.pt``: the policy, the critic, both optimizers, the RNG states (python, numpy, torch),
  the data cursor and the iteration;
- ``manifest.json``, written last: ``{"format": 1, "iteration": N, "files": {"state.pt":
  {"bytes": ..., "sha256": ...}}}``, the size and SHA-256 of every file, hashed as it was written.

Writing: everything goes to ``.tmp_iter_XXXXX_<pid>/`` first, which is renamed into place, and
``latest`` is replaced atomically after that, so a ``kill -9`` at any moment leaves the previous
checkpoint intact. A write that fails (a full disk, an I/O error) removes the temporary directory
and raises :class:`CheckpointError` saying what, where, how much space the checkpoint needs and how
much is free; the previous checkpoints are untouched. Before writing, a checkpoint whose tensors
alone do not fit in the free space is refused without writing anything. After a successful write
the checkpoints of later iterations (left by an abandoned timeline: a run resumed from an older
one) are removed, then all but the newest ``keep``.

Reading: :func:`load_latest_checkpoint` takes the newest checkpoint that verifies (every file the
manifest lists is there with its size and hash, the manifest names the directory's iteration) and
that ``torch.load`` reads, and reports every newer one it skipped, by name and why (truncated,
missing file, empty directory, manifest mismatch...). Checkpoints written before manifests existed
(no ``manifest.json``, a ``state.pt``) are loaded without verification; ``torch.load`` failing on
one skips it the same way.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

MANIFEST = "manifest.json"
FORMAT = 1
_ITER_DIR = re.compile(r"iter_(\d+)")
_DEBRIS = re.compile(r"\.(?:tmp_iter_\d+|latest)_(\d+)")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or none could be read; the message names the path, the
    cause and what to do."""


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


# -- writing ---------------------------------------------------------------------------------------


def save_checkpoint(run_dir: str | Path, iteration: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` as ``checkpoints/iter_XXXXX`` (see the module docstring); return its path.
    Raises :class:`CheckpointError` (nothing left behind, earlier checkpoints intact) when it
    cannot be written."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"iter_{iteration:05d}"
    tmp = root / f".tmp_iter_{iteration:05d}_{os.getpid()}"
    payload = {**state, "iteration": iteration, "rng": rng_state()}
    needed = tensor_bytes(payload)
    precheck = True
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_debris(root)
        free = shutil.disk_usage(root).free
        if needed > free:  # cannot fit: refuse before filling the disk
            raise OSError(errno.ENOSPC, "not enough free space to start writing", str(final))
        precheck = False
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = {"state.pt": _write_hashed(tmp / "state.pt", lambda f: torch.save(payload, f))}
        manifest = {"format": FORMAT, "iteration": int(iteration), "files": files}
        _write_hashed(tmp / (MANIFEST + ".part"), lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        os.replace(tmp / (MANIFEST + ".part"), tmp / MANIFEST)
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        exact = isinstance(e, OSError) and e.errno in _NO_SPACE and not precheck
        if exact:  # the disk filled mid-write: measure what the checkpoint needs (written nowhere)
            try:
                needed = serialized_bytes(payload)
            except Exception:
                exact = False
        raise _write_error(e, root, final, needed, exact) from e
    except BaseException:  # KeyboardInterrupt, SystemExit: no debris, and let it through
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    pointer = root / f".latest_{os.getpid()}"
    try:
        _write_hashed(pointer, lambda f: f.write(final.name.encode()))
        os.replace(pointer, root / "latest")
        _fsync_dir(root)
    except Exception as e:
        pointer.unlink(missing_ok=True)
        raise _write_error(
            e, root, root / "latest", 0, done=f"{final} itself is complete; --resume will use it. "
        ) from e
    for old in _iter_dirs(root):
        if _iteration_of(old) > iteration:  # a later iteration of a timeline this run left
            shutil.rmtree(old, ignore_errors=True)
    for old in [p for p in _iter_dirs(root) if _iteration_of(p) <= iteration][:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


class _HashingWriter:
    """A binary file that hashes and counts what is written through it, and keeps the first
    ``OSError`` of the real file (``torch.save`` turns it into a bare ``RuntimeError``)."""

    def __init__(self, f: Any):
        self.f, self.sha, self.bytes, self.error = f, hashlib.sha256(), 0, None

    def write(self, data: Any) -> int:
        try:
            n = self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise
        self.sha.update(data)
        self.bytes += len(memoryview(data).cast("B"))
        return n

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            self.error = self.error or e
            raise


def _write_hashed(path: Path, write: Callable[[Any], Any]) -> dict[str, Any]:
    """Write ``path`` through ``write(file)``, flush and fsync it; its ``{"bytes", "sha256"}``."""
    w = None
    try:
        with open(path, "wb") as f:
            w = _HashingWriter(f)
            write(w)
            w.flush()
            os.fsync(f.fileno())
    except Exception as e:
        if w is not None and w.error is not None and w.error is not e:
            raise w.error from e  # the file system's own error, not torch's rewording of it
        raise
    return {"bytes": w.bytes, "sha256": w.sha.hexdigest()}


class _Counter:
    bytes = 0

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        self.bytes += n
        return n

    def flush(self) -> None:
        pass


def serialized_bytes(obj: Any) -> int:
    """The size of ``torch.save(obj)``, measured by serializing to a counter (nothing is stored)."""
    c = _Counter()
    torch.save(obj, c)
    return c.bytes


def tensor_bytes(obj: Any) -> int:
    """The bytes of the tensor storages in ``obj`` (nested dicts, lists, tuples), each storage
    counted once: what ``torch.save`` must write at least."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            try:
                s = x.untyped_storage()
                key, n = (s.data_ptr(), s.nbytes()), s.nbytes()
            except (RuntimeError, NotImplementedError):  # a layout without one storage (sparse...)
                key, n = (id(x), 0), x.element_size() * x.numel()
            if key not in seen:
                seen.add(key)
                total += n
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


def _write_error(
    e: Exception, root: Path, target: Path, needed: int, exact: bool = False, done: str = ""
) -> CheckpointError:
    if isinstance(e, CheckpointError):
        return e
    free = _free(root)
    no_space = isinstance(e, OSError) and e.errno in _NO_SPACE
    cause = (
        "no space left on device"
        if no_space
        else f"{e.strerror or e}"
        if isinstance(e, OSError)
        else f"{type(e).__name__}: {e}"
    )
    space = (
        f" It needs {format_bytes(needed)}; {format_bytes(free)} is free there."
        if needed and exact
        else f" It needs at least {format_bytes(needed)} (its tensors); {format_bytes(free)} is free there."
        if needed
        else f" {format_bytes(free)} is free there."
    )
    kept = [p.name for p in _iter_dirs(root)]
    previous = f"The earlier checkpoints ({', '.join(kept)}) are intact" if kept else "No earlier checkpoint exists"
    hint = (
        "Free space on that file system (or lower keep_checkpoints, or move run_dir), then continue with "
        f"--resume {root.parent}."
        if no_space
        else f"Fix the cause, then continue with --resume {root.parent}."
    )
    return CheckpointError(
        f"could not write checkpoint {target}: {cause}.{space} {done}{previous} and no partial files were left. {hint}"
    )


def _free(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def format_bytes(n: int) -> str:
    """``n`` bytes as MiB (KiB below one MiB), one decimal."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _remove_debris(root: Path) -> None:
    """Temporary files of writers that died mid-write (``kill -9``): their process is gone."""
    for p in root.iterdir():
        m = _DEBRIS.fullmatch(p.name)
        if m and not _alive(int(m.group(1))):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, not ours
    return True


# -- reading ---------------------------------------------------------------------------------------


def _iteration_of(path: Path) -> int:
    m = _ITER_DIR.fullmatch(path.name)
    return int(m.group(1)) if m else -1


def _iter_dirs(root: Path) -> list[Path]:
    """``iter_*`` directories, oldest first (by iteration)."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _ITER_DIR.fullmatch(p.name) and p.is_dir()), key=_iteration_of)


def verify_checkpoint(path: str | Path) -> str | None:
    """What is wrong with checkpoint directory ``path``, or ``None`` if its manifest verifies (or
    it predates manifests: no ``manifest.json`` and a ``state.pt``; see :func:`load_checkpoint`)."""
    path = Path(path)
    if not path.is_dir():
        return "not a directory"
    names = sorted(p.name for p in path.iterdir())
    if not names:
        return "an empty directory (no manifest.json, no state.pt)"
    if MANIFEST not in names:
        return None if "state.pt" in names else f"no manifest.json and no state.pt (only {names})"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            raise TypeError("'files' is not a mapping of file -> {bytes, sha256}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest.json ({type(e).__name__}: {e})"
    if manifest.get("iteration") != _iteration_of(path):
        return f"manifest.json is for iteration {manifest.get('iteration')!r}, not this directory's"
    if "state.pt" not in files:
        return "manifest.json does not list state.pt"
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing (manifest.json lists it)"
        size = f.stat().st_size
        if size != meta.get("bytes"):
            return (
                f"{name} is {size} bytes but manifest.json says {meta.get('bytes')} "
                f"({'truncated: a partial write' if size < (meta.get('bytes') or 0) else 'it changed'})"
            )
        digest = _sha256(f)
        if digest != meta.get("sha256"):
            return f"{name}'s SHA-256 {digest[:12]}... does not match manifest.json's {str(meta.get('sha256'))[:12]}... (corrupt)"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state of checkpoint directory ``path``, verified first; :class:`CheckpointError`
    naming the file and the problem if it is corrupt, partial or unreadable."""
    path = Path(path)
    problem = verify_checkpoint(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path}: {problem}")
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path}: torch.load could not read state.pt ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    if not isinstance(state, dict) or "iteration" not in state:
        raise CheckpointError(f"checkpoint {path}: state.pt is not a trainer checkpoint (no 'iteration')")
    return state


def load_latest_checkpoint(run_dir: str | Path) -> tuple[Path | None, dict[str, Any] | None, list[tuple[Path, str]]]:
    """The newest checkpoint of ``run_dir`` that verifies and loads: ``(path, state, skipped)``,
    ``skipped`` the newer ones passed over, each with the reason. ``(None, None, skipped)`` if none
    does."""
    skipped: list[tuple[Path, str]] = []
    for path in reversed(_iter_dirs(Path(run_dir) / "checkpoints")):
        try:
            return path, load_checkpoint(path), skipped
        except CheckpointError as e:
            skipped.append((path, str(e)))
    return None, None, skipped


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint directory of ``run_dir`` whose manifest verifies (a warning names each
    newer one skipped); ``None`` if there is none."""
    for path in reversed(_iter_dirs(Path(run_dir) / "checkpoints")):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        warnings.warn(f"skipping checkpoint {path}: {problem}", stacklevel=2)
    return None


def _fsync_dir(path: Path) -> None:
    for p in [*path.iterdir(), path] if path.is_dir() else [path]:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


__all__ = [
    "CheckpointError",
    "format_bytes",
    "latest_checkpoint",
    "load_checkpoint",
    "load_latest_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "tensor_bytes",
    "verify_checkpoint",
]
