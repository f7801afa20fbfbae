"""The tests' SFT warm start, trained once and cached in ``.cache/test_sft_model/<key>``.

A tiny model after the CPU demo's SFT warm start (configs/factchain_sft.yaml: an imperfect
demonstrator, 40% oracle and 60% relations in reverse order): it emits the tool-call format,
copies and chains, and gets a minority of the 2-hop questions right (about 35% greedy).

Training it is the slowest set-up of the test suites (about 3 minutes of CPU), and `make test`
needs it in two venvs (the core tests and the vLLM tests). So it is trained once, before the
suites, while the side venvs are still being set up (`make sft-fixture`, run as
``python -m tests.trainers.sft_fixture``: outside any test's deadline), and kept under a key of
its settings, the torch version and every source file of the packages that build, train and save
it (any edit there trains it anew). The ``sft_model`` fixture (tests/trainers/conftest.py) loads
it, or trains it first where it is missing (a plain `pytest` run). A file lock makes concurrent
builders (pytest-xdist workers, the two venvs) wait for one of them and load what it saved.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

COMPACT_ENV = {
    "tools_in_prompt": False,
    "system_prompt": "Follow the chain of facts with lookup, innermost relation first.",
}

SFT_STEPS = dict(
    env_id="AgentR1/FactChain-v0",
    eval_env_kwargs={"split": "test"},
    steps=600,
    batch_size=32,
    num_demos=2000,
    eval_tasks=16,
    env_kwargs=dict(COMPACT_ENV),
    max_turn_tokens=40,
    lr_schedule="cosine",
    warmup_steps=20,
    demo_policy={"oracle": 0.4, "reversed": 0.6},
)
SFT_CACHE = REPO / ".cache" / "test_sft_model"


def sft_key() -> str:
    """What the model depends on: its settings, the torch version and every source file of the
    packages that build, train and save it."""
    import torch

    h = hashlib.sha256(json.dumps(SFT_STEPS, sort_keys=True).encode() + torch.__version__.encode())
    for pkg in ("agent_gym", "envs", "trainers"):
        for f in sorted((REPO / pkg).rglob("*.py")):
            h.update(str(f.relative_to(REPO)).encode() + f.read_bytes())
    return h.hexdigest()[:16]


def cached_sft_model() -> str:
    """The model directory, trained here first if no finished copy is cached."""
    from trainers.sft import SFTConfig, run_sft

    cached = SFT_CACHE / sft_key()
    SFT_CACHE.mkdir(parents=True, exist_ok=True)
    with open(SFT_CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cached / "DONE").is_file():
            with tempfile.TemporaryDirectory(prefix="sft_fixture_") as run_dir:
                final = run_sft(SFTConfig(run_dir=run_dir, **SFT_STEPS))
                if not final["sft/loss"] < 0.5:
                    raise RuntimeError(f"the tests' SFT warm start did not train: final loss {final['sft/loss']:.3f}")
                tmp = cached.with_name(cached.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(Path(run_dir) / "model", tmp / "model")
                (tmp / "DONE").write_text(json.dumps(final))
                tmp.rename(cached)
    return str(cached / "model")


if __name__ == "__main__":
    print(cached_sft_model())
