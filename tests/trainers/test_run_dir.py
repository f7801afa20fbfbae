"""A new run into a run_dir that already holds one is refused unless ``run.overwrite: true`` (or
``--resume``): otherwise the two runs' metrics would interleave in one metrics.jsonl and the old
checkpoints would sit beside the new ones."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.trainers.test_checkpoint_faults import RUN, _train
from trainers.config import ConfigError

pytestmark = pytest.mark.timeout(600)


def _records(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_a_second_fresh_run_is_refused_overwrite_replaces_and_resume_continues(tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({**RUN, "run_dir": str(run_dir), "iterations": 2, "keep_checkpoints": 5}))
    rc, _, err = _train(capsys, "--config", str(cfg))
    assert rc == 0, err
    before = (run_dir / "metrics.jsonl").read_text()
    assert [r["iteration"] for r in _records(run_dir)] == [0, 1]

    rc, _, err = _train(capsys, "--config", str(cfg))
    assert rc == 2
    assert err.strip() == (
        f"error: run_dir {str(run_dir)!r} already holds a run (metrics.jsonl, checkpoints); continue "
        f"it with --resume {run_dir}, choose another run_dir, or set run.overwrite=true to replace it"
    )
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing touched

    (run_dir / "notes.txt").write_text("mine")  # not a run file: left alone by overwrite
    rc, _, err = _train(capsys, "--config", str(cfg), "run.iterations=1", "run.overwrite=true")
    assert rc == 0, err
    assert [r["iteration"] for r in _records(run_dir)] == [0]  # one record per iteration, none of the old run's
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_00000", "latest"]
    assert sorted(p.name for p in (run_dir / "trajectories").iterdir()) == ["iter_00000.jsonl"]
    assert (run_dir / "notes.txt").read_text() == "mine"

    rc, _, err = _train(capsys, "--resume", str(run_dir), "run.iterations=2")  # --resume is not a new run
    assert rc == 0, err
    assert [r["iteration"] for r in _records(run_dir)] == [0, 1]


def test_a_folder_without_a_run_is_used_as_it_is(tmp_path, capsys):
    # A run that failed at set-up leaves only config.yaml; an empty checkpoints/ holds nothing either.
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("old: 1\n")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({**RUN, "run_dir": str(run_dir), "iterations": 1}))
    rc, _, err = _train(capsys, "--config", str(cfg))
    assert rc == 0, err
    assert [r["iteration"] for r in _records(run_dir)] == [0]


def test_sft_refuses_a_run_dir_that_holds_a_run(tmp_path, capsys):
    from trainers.train_sft import main

    run_dir = tmp_path / "sft"
    run_dir.mkdir()
    (run_dir / "final.json").write_text("{}")
    args = [
        "env_id=AgentR1/FactChain-v0",
        "model.name=tiny",
        f"run_dir={run_dir}",
        "steps=1",
        "batch_size=2",
        "num_demos=4",
        "eval.tasks=1",
        "model.torch_threads=1",
    ]
    with pytest.raises(ConfigError) as e:  # in-process (argv given) it raises; the command prints it as one line
        main(args)
    assert str(e.value) == (
        f"run_dir {str(run_dir)!r} already holds a run (final.json); choose another run_dir, or "
        "set overwrite=true to replace it"
    )
    assert main([*args, "overwrite=true"]) == 0
    assert json.loads((run_dir / "final.json").read_text()) != {}


def test_a_copied_run_resumes_in_the_copy(tmp_path, capsys):
    # The copy's config.yaml still names the original run_dir: --resume continues where it is named.
    first, copy = tmp_path / "first", tmp_path / "copy"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({**RUN, "run_dir": str(first), "iterations": 1}))
    rc, _, err = _train(capsys, "--config", str(cfg))
    assert rc == 0, err
    shutil.copytree(first, copy)
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}

    rc, _, err = _train(capsys, "--resume", str(copy), "run.iterations=2", f"run.run_dir={tmp_path / 'other'}")
    assert rc == 2
    assert f"--resume {copy} continues the run in {copy}; the override run.run_dir= names another directory" in err

    rc, _, err = _train(capsys, "--resume", str(copy), "run.iterations=2")
    assert rc == 0, err
    assert [r["iteration"] for r in _records(copy)] == [0, 1]
    assert yaml.safe_load((copy / "config.yaml").read_text())["run"]["run_dir"] == str(copy)
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before  # the original untouched
    assert not (tmp_path / "other").exists()
