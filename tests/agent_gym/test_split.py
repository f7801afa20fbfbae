"""The held-out split by a hash of the id (agent_gym/datasets/split.py, scripts/split_qa.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_gym.datasets.split import heldout_score, is_heldout

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "qa"
pytestmark = pytest.mark.timeout(300)


def test_hash_split_is_stable_and_has_the_share():
    ids = [f"q{i}" for i in range(4000)]
    held = {i for i in ids if is_heldout("hotpotqa", i, 0.2)}
    assert 0.18 < len(held) / len(ids) < 0.22
    # A row's side depends on its id alone: removing or reordering other rows moves nothing.
    sub = ids[::-7]
    assert {i for i in sub if is_heldout("hotpotqa", i, 0.2)} == held & set(sub)
    # Growing the fraction only adds rows; another salt or dataset draws another split.
    assert held <= {i for i in ids if is_heldout("hotpotqa", i, 0.3)}
    assert held != {i for i in ids if is_heldout("hotpotqa", i, 0.2, salt="1")}
    assert held != {i for i in ids if is_heldout("musique", i, 0.2)}
    # Known values pin the hash across Python versions and machines (no hash() randomization).
    assert heldout_score("hotpotqa", "q0") == pytest.approx(heldout_score("hotpotqa", "q0"))
    import hashlib

    d = hashlib.sha256(b"hotpotqa:q0").digest()
    assert heldout_score("hotpotqa", "q0") == int.from_bytes(d[:8], "big") / 2.0**64
    with pytest.raises(ValueError, match="fraction must be in"):
        is_heldout("hotpotqa", "q0", 1.5)


def _rows(n, prefix):
    base = json.loads((FIX / "normalized_dev.jsonl").read_text().splitlines()[0])
    return [{**base, "id": f"{prefix}-{i}", "question": f"{base['question']} ({i})"} for i in range(n)]


def test_split_script_writes_parts_mixture_and_corpus(tmp_path):
    a, b, o = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "o.jsonl"
    for path, rows in ((a, _rows(120, "h")), (b, _rows(60, "w")), (o, _rows(10, "m"))):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "split"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "split_qa.py"),
        "--out-dir",
        str(out),
        "--heldout",
        "0.25",
        "--data",
        f"hotpotqa={a}",
        "--data",
        f"2wikimultihopqa={b}",
        "--ood",
        f"musique={o}",
        "--corpus",
        f"hotpotqa={FIX / 'corpus.jsonl'}",
        "--corpus",
        f"2wikimultihopqa={FIX / 'corpus.jsonl'}",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    read = lambda p: [json.loads(x) for x in (out / p).read_text().splitlines()]  # noqa: E731
    for name, n in (("hotpotqa", 120), ("2wikimultihopqa", 60)):
        train, held = read(f"{name}_train.jsonl"), read(f"{name}_heldout.jsonl")
        assert len(train) + len(held) == n and held and train
        assert all(is_heldout(name, r["id"], 0.25) for r in held)
        assert not any(is_heldout(name, r["id"], 0.25) for r in train)
    assert len(read("musique_heldout.jsonl")) == 10
    mix = read("train.jsonl")
    assert len(mix) == len(read("hotpotqa_train.jsonl")) + len(read("2wikimultihopqa_train.jsonl"))
    assert {r["dataset"] for r in mix} == {"hotpotqa", "2wikimultihopqa"} and all(":" in r["id"] for r in mix)
    # The same corpus twice: duplicates dropped.
    assert len(read("corpus.jsonl")) == len((FIX / "corpus.jsonl").read_text().splitlines())
    summary = json.loads((out / "split.json").read_text())
    assert summary["counts"]["musique"] == {"train": 0, "heldout": 10}
    # The parts load in the env, as trainers/evaluate.py --env-kwargs '{data_path: ...}' reads them.
    import gymnasium as gym

    import agent_gym  # noqa: F401

    env = gym.make(
        "AgentR1/HotpotQA-v0", data_path=str(out / "hotpotqa_heldout.jsonl"), corpus_path=str(out / "corpus.jsonl")
    )
    assert env.unwrapped.num_tasks() == len(read("hotpotqa_heldout.jsonl"))
    env.close()
    bad = subprocess.run([*cmd[:4], "--data", "nosuch=x.jsonl"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "unknown dataset 'nosuch'" in bad.stderr
    bad = subprocess.run(
        [*cmd[:4], "--data", f"hotpotqa={tmp_path / 'missing.jsonl'}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "no such file" in bad.stderr
