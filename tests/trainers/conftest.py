import fcntl
import hashlib
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

COMPACT_ENV = {"tools_in_prompt": False, "system_prompt": "Follow the chain of facts with lookup, innermost relation first."}


SFT_STEPS = dict(steps=600, batch_size=32, num_demos=2000, eval_tasks=16, env_kwargs=dict(COMPACT_ENV),
                 max_turn_tokens=40, lr_schedule="cosine", warmup_steps=20,
                 demo_policy={"oracle": 0.4, "reversed": 0.6})
SFT_CACHE = REPO / ".cache" / "test_sft_model"


def _sft_key() -> str:
    """What the fixture's model depends on: its settings, the torch version and every source file
    of the packages that build, train and save it. Any edit there trains it anew."""
    import torch

    h = hashlib.sha256(json.dumps(SFT_STEPS, sort_keys=True).encode() + torch.__version__.encode())
    for pkg in ("agent_gym", "envs", "trainers"):
        for f in sorted((REPO / pkg).rglob("*.py")):
            h.update(str(f.relative_to(REPO)).encode() + f.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def sft_model(tmp_path_factory):
    """A tiny model after the CPU demo's SFT warm start (configs/factchain_sft.yaml: an imperfect
    demonstrator, 40% oracle and 60% relations in reverse order): it emits the tool-call format,
    copies and chains, and gets a minority of the 2-hop questions right (about 35% greedy).

    Training it is the slowest set-up in the suite, and `make test` needs it in two venvs (the core
    tests and the vLLM tests), so the trained model is kept in ``.cache/test_sft_model/<key>``
    (git-ignored), keyed by ``_sft_key()``: the second venv, and a re-run on unchanged code, load it.
    """
    from trainers.sft import SFTConfig, run_sft

    cached = SFT_CACHE / _sft_key()
    SFT_CACHE.mkdir(parents=True, exist_ok=True)
    # One trainer at a time (pytest-xdist workers, or the core and vLLM runs side by side): the
    # others wait on the lock, then load what it saved.
    with open(SFT_CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cached / "DONE").is_file():
            run_dir = tmp_path_factory.mktemp("sft")
            final = run_sft(SFTConfig(run_dir=str(run_dir), **SFT_STEPS))
            assert final["sft/loss"] < 0.5
            tmp = cached.with_name(cached.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(run_dir / "model", tmp / "model")
            (tmp / "DONE").write_text(json.dumps(final))
            tmp.rename(cached)
    return str(cached / "model")


def tiny_rl_config(run_dir, algo, init_from, **kw):
    from trainers.config import TrainConfig

    base = dict(run_dir=str(run_dir), algo=algo, iterations=3, init_from=init_from, tasks_per_iter=4, group_size=2,
                minibatch_size=4, max_turn_tokens=40, eval_every=100, eval_tasks=4, tensorboard=False,
                progress_bar=False, torch_threads=1, lr=1e-3, checkpoint_every=1,
                env_kwargs={**COMPACT_ENV, "rewards": {"call_invalid": -0.1, "no_action": -0.1, "extra": {"hop": 0.2}}})
    base.update(kw)
    return TrainConfig(**base)
