"""Checkpoints under faults: a full disk (a real tmpfs, a real ENOSPC), a truncated, corrupt,
partial or empty newest checkpoint, a manifest that does not match, and debris of dead writers.

The full-disk tests mount a small tmpfs in the test's directory (root or CAP_SYS_ADMIN needed;
they skip saying so otherwise). The run tests drive the training scripts' ``main`` in this process
(``trainers.cli.main``: the same path as ``train_grpo.py``) with the tiny model (random init:
nothing here depends on what it learned). An exception that escapes ``main`` (the raw traceback of
before) fails the test."""

import errno
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from trainers.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)

RUN = dict(
    env_id="AgentR1/FactChain-v0",
    algo="grpo",
    model="tiny",
    tasks_per_iter=2,
    group_size=2,
    minibatch_size=4,
    max_turn_tokens=16,
    eval_every=100,
    eval_tasks=2,
    tensorboard=False,
    progress_bar=False,
    torch_threads=1,
    checkpoint_every=1,
    env_kwargs={"tools_in_prompt": False, "system_prompt": "Follow the chain of facts with lookup."},
)


@pytest.fixture
def small_fs(tmp_path):
    """A function that mounts a tmpfs of the given size under tmp_path and returns its path."""
    mounts = []

    def mount(size: str) -> Path:
        d = tmp_path / f"fs{len(mounts)}"
        d.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True
        )
        if r.returncode != 0:
            pytest.skip(
                f"cannot mount a {size} tmpfs for a real full disk (needs root or CAP_SYS_ADMIN): "
                f"{(r.stderr or r.stdout).strip()}"
            )
        mounts.append(d)
        return d

    yield mount
    for d in mounts:
        if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _train(capsys, *args):
    """``train_grpo.py ARGS`` in this process (the scripts' own ``main``): (exit status, stdout, stderr)."""
    from trainers.cli import main

    capsys.readouterr()
    rc = main("grpo", list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _config(tmp_path, run_dir, **kw):
    path = tmp_path / f"{Path(run_dir).name}.yaml"
    path.write_text(yaml.safe_dump({**RUN, "run_dir": str(run_dir), **kw}))
    return str(path)


def _metrics(run_dir):
    recs = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "memory/"))} for r in recs]


def _small_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"policy": {"w": torch.randn(300, generator=g)}, "note": "x"}


# -- full disk -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_disk_full_mid_write_is_reported_and_leaves_no_debris(small_fs):
    root = small_fs("1m") / "run"
    first = save_checkpoint(root, 0, _small_state())
    # The tensors fit (so the check before writing passes); the pickled 2 MB of bytes do not: the
    # file system's own ENOSPC hits in the middle of torch.save.
    big = {**_small_state(1), "blob": os.urandom(2_000_000)}
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(root, 1, big)
    msg = str(err.value)
    assert isinstance(err.value.__cause__, OSError) and err.value.__cause__.errno == errno.ENOSPC
    assert "iter_00001: no space left on device" in msg, msg
    need = re.search(r"It needs (\d+\.\d) MiB", msg)  # measured, not estimated: at least the 2 MB of bytes
    assert need and float(need.group(1)) >= 2_000_000 / 2**20, msg
    assert "is free there" in msg and "iter_00000" in msg and "--resume" in msg
    assert sorted(os.listdir(root / "checkpoints")) == ["iter_00000", "latest"]  # no .tmp_iter_* left
    assert verify_checkpoint(first) is None
    assert torch.equal(load_checkpoint(first)["policy"]["w"], _small_state()["policy"]["w"])
    # the space came back: the next (smaller) checkpoint is written normally
    assert save_checkpoint(root, 1, _small_state(2)).name == "iter_00001"


@pytest.mark.timeout(120)
def test_a_checkpoint_that_cannot_fit_is_refused_before_writing(small_fs):
    root = small_fs("1m") / "run"
    save_checkpoint(root, 0, _small_state())
    with pytest.raises(
        CheckpointError,
        match=r"no space left on device\. It needs at least 4\.0 MiB \(its tensors\); "
        r"\d+\.\d KiB is free there",
    ):
        save_checkpoint(root, 1, {"policy": {"w": torch.zeros(2**20)}})  # 4 MiB of float32
    assert sorted(os.listdir(root / "checkpoints")) == ["iter_00000", "latest"]


@pytest.mark.timeout(300)
def test_full_disk_ends_the_run_with_a_clear_message(small_fs, tmp_path, capsys):
    """The reported case: the run directory on a 6 MB file system, which fills at the second
    checkpoint (one is about 4.6 MB with the tiny model and its optimizer state). The untrained
    model earns no reward, so an entropy bonus makes sure the update is not void (a void one is
    skipped and leaves no optimizer state to save)."""
    run_dir = small_fs("6m") / "run"
    rc, _, stderr = _train(capsys, "--config", _config(tmp_path, run_dir, iterations=3, entropy_coef=0.01))
    assert rc == 4, stderr[-3000:]
    err = stderr.strip().splitlines()[-1]
    assert err.startswith(
        f"error: could not write checkpoint {run_dir}/checkpoints/iter_00001: no space left on device"
    ), err
    assert "It needs at least 4." in err and "MiB is free there" in err and f"--resume {run_dir}" in err, err
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["iter_00000", "latest"]
    assert (run_dir / "checkpoints" / "latest").read_text() == "iter_00000"
    assert verify_checkpoint(run_dir / "checkpoints" / "iter_00000") is None
    assert load_checkpoint(run_dir / "checkpoints" / "iter_00000")["iteration"] == 0
    assert [m["iteration"] for m in _metrics(run_dir)] == [0, 1]


# -- corrupt, partial, empty checkpoints ---------------------------------------------------------


@pytest.mark.timeout(300)
def test_resume_passes_over_a_truncated_newest_checkpoint(tmp_path, capsys):
    """The newest state.pt cut in half: --resume names it, resumes from the newest good one and
    repeats the lost iteration exactly; with every checkpoint broken it fails naming each."""
    run_dir = tmp_path / "run"
    rc, _, stderr = _train(capsys, "--config", _config(tmp_path, run_dir, iterations=3, keep_checkpoints=3))
    assert rc == 0, stderr[-3000:]
    before = _metrics(run_dir)
    ck = run_dir / "checkpoints"
    state = ck / "iter_00002" / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    rc, stdout, stderr = _train(capsys, "--resume", str(run_dir), "iterations=4")
    assert rc == 0, stderr[-3000:]
    assert "warning: skipping iter_00002 (checkpoint" in stderr and "truncated: a partial write" in stderr, stderr
    assert f"resumed from {ck / 'iter_00001'} at iteration 2" in stdout
    after = _metrics(run_dir)
    assert [m["iteration"] for m in after] == [0, 1, 2, 3]
    # iteration 2 repeated exactly from iter_00001 (its first run, the last of 3 iterations, also evaluated)
    assert after[:3] == [
        {k: v for k, v in m.items() if not k.startswith("eval/") or m["iteration"] != 2} for m in before
    ]
    assert sorted(p.name for p in ck.iterdir()) == ["iter_00001", "iter_00002", "iter_00003", "latest"]
    assert all(verify_checkpoint(ck / f"iter_0000{i}") is None for i in (1, 2, 3))

    for i in (1, 2, 3):  # now none is usable
        (ck / f"iter_0000{i}" / "state.pt").write_bytes(b"")
    rc, _, stderr = _train(capsys, "--resume", str(run_dir), "iterations=5")
    assert rc == 4, stderr[-3000:]
    err = stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: --resume: no checkpoint under {ck} can be loaded"), err
    assert all(f"iter_0000{i}: state.pt is 0 bytes" in err for i in (1, 2, 3)), err


def _flip_byte(path: Path, at: int = 100) -> None:
    b = bytearray(path.read_bytes())
    b[at] ^= 0xFF
    path.write_bytes(bytes(b))


def test_each_kind_of_bad_checkpoint_is_named_and_passed_over(tmp_path):
    root = tmp_path / "run"
    for i in range(7):
        save_checkpoint(root, i, _small_state(i), keep=10)
    ck = root / "checkpoints"
    _flip_byte(ck / "iter_00006" / "state.pt")  # same size, other bytes
    (ck / "iter_00005" / "state.pt").unlink()  # a missing file
    for p in (ck / "iter_00004").iterdir():  # an empty directory
        p.unlink()
    m = json.loads((ck / "iter_00003" / "manifest.json").read_text())  # a manifest of another checkpoint
    m["iteration"] = 2
    (ck / "iter_00003" / "manifest.json").write_text(json.dumps(m))
    (ck / "iter_00002" / "manifest.json").write_text("{not json")  # an unreadable manifest
    path, state, skipped = load_latest_checkpoint(root)
    assert path == ck / "iter_00001" and state["iteration"] == 1
    assert torch.equal(state["policy"]["w"], _small_state(1)["policy"]["w"])
    why = {p.name: w for p, w in skipped}
    assert list(why) == ["iter_00006", "iter_00005", "iter_00004", "iter_00003", "iter_00002"]
    assert "state.pt's SHA-256" in why["iter_00006"] and "does not match manifest.json's" in why["iter_00006"]
    assert "state.pt is missing (manifest.json lists it)" in why["iter_00005"]
    assert "an empty directory" in why["iter_00004"]
    assert "manifest.json is for iteration 2" in why["iter_00003"]
    assert "unreadable manifest.json" in why["iter_00002"]
    assert all(w.startswith(f"checkpoint {ck / n}: ") for n, w in why.items())
    with pytest.warns(UserWarning) as rec:
        assert latest_checkpoint(root) == ck / "iter_00001"
    assert [str(w.message) for w in rec] == [f"skipping {w}" for w in why.values()]
    with pytest.raises(CheckpointError, match="iter_00006: state.pt's SHA-256"):
        load_checkpoint(ck / "iter_00006")


def test_a_checkpoint_from_before_manifests_still_loads_and_a_broken_one_is_named(tmp_path):
    root = tmp_path / "run"
    for i in range(3):
        save_checkpoint(root, i, _small_state(i), keep=10)
    ck = root / "checkpoints"
    for i in range(3):
        (ck / f"iter_0000{i}" / "manifest.json").unlink()
    (ck / "iter_00002" / "state.pt").write_bytes(b"PK\x03\x04 not a zip")
    path, state, skipped = load_latest_checkpoint(root)
    assert path == ck / "iter_00001" and state["iteration"] == 1
    assert len(skipped) == 1 and "torch.load could not read state.pt" in skipped[0][1]


def test_the_manifest_is_exact(tmp_path):
    path = save_checkpoint(tmp_path / "run", 4, _small_state())
    m = json.loads((path / "manifest.json").read_text())
    data = (path / "state.pt").read_bytes()
    assert m == {
        "format": 1,
        "iteration": 4,
        "files": {"state.pt": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
    }
    assert sorted(os.listdir(path)) == ["manifest.json", "state.pt"]


def test_saving_after_resuming_from_an_older_checkpoint_drops_the_abandoned_ones_and_debris(tmp_path):
    root = tmp_path / "run"
    for i in range(4):
        save_checkpoint(root, i, _small_state(i), keep=2)
    ck = root / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["iter_00002", "iter_00003", "latest"]
    (ck / "iter_00003" / "state.pt").write_bytes(b"")  # broken: a resume goes back to iter_00002
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text()) if Path("/proc/sys/kernel/pid_max").exists() else 2**22
    dead = ck / f".tmp_iter_00007_{pid_max + 1}"  # a writer that was killed mid-write (no such pid can exist)
    dead.mkdir()
    (dead / "state.pt").write_bytes(b"partial")
    mine_alive = ck / f".tmp_iter_00008_{os.getppid()}"  # a live process's: not ours to remove
    mine_alive.mkdir()
    save_checkpoint(root, 3, _small_state(33), keep=2)  # the resumed run writes iteration 3 again
    assert sorted(p.name for p in ck.iterdir()) == [mine_alive.name, "iter_00002", "iter_00003", "latest"]
    assert load_latest_checkpoint(root)[1]["policy"]["w"].equal(_small_state(33)["policy"]["w"])
    save_checkpoint(root, 5, _small_state(5), keep=2)
    (ck / "iter_00009").mkdir()  # a later iteration of an abandoned timeline
    save_checkpoint(root, 6, _small_state(6), keep=2)
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("iter_")) == ["iter_00005", "iter_00006"]


@pytest.mark.timeout(60)
def test_any_full_disk_error_of_a_run_is_one_clear_line(small_fs):
    """Besides checkpoints, a run writes metrics, trajectories and curves: a real ENOSPC from any
    of them is reported with the file and the free space (exit 4), and a failed checkpoint
    followed by a failure while closing the run reports the checkpoint first."""
    from trainers.cli import _failure

    fs = small_fs("64k")
    with pytest.raises(OSError) as full:
        with open(fs / "metrics.jsonl", "wb") as f:
            for _ in range(1000):
                f.write(b"x" * 4096)
                f.flush()
    assert full.value.errno == errno.ENOSPC
    code, msg = _failure(full.value, str(fs))
    # file.write's error carries no file name: the message says where in the code it failed
    assert code == 4 and msg.startswith(
        "the disk is full: could not write a file (No space left on device) in "
        "tests/trainers/test_checkpoint_faults.py:"
    ), msg
    assert "KiB is free under" in msg and f"--resume {fs}" in msg
    try:
        try:
            save_checkpoint(fs / "run", 0, {"policy": {"w": torch.zeros(2**16)}})  # 256 KiB: cannot fit
        except CheckpointError:
            with open(fs / "curves.png", "wb") as f:  # closing the run on the same full disk
                f.write(b"x" * 2**17)
    except OSError as e:
        code, msg = _failure(e, str(fs))
    assert code == 4 and msg.startswith(
        f"could not write checkpoint {fs / 'run' / 'checkpoints' / 'iter_00000'}: no space"
    )
    assert msg.endswith("(Then, while closing the run: OSError: [Errno 28] No space left on device.)"), msg
    assert _failure(ValueError("a bug"), str(fs)) is None  # anything else keeps its traceback
