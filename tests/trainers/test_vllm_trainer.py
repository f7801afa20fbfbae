"""PPO and GRPO with ``backend: vllm`` end to end on vLLM's CPU build (run under .venv-vllm).

One engine serves both runs (an engine start is ~20 s of the 2 cores): the trainer's
``make_backend`` is pointed at it, and it first syncs the trainer's initial policy into the
engine with ``load_weights``, the same call every iteration's sync makes, so each run starts
from its own weights exactly as with a fresh engine.
"""

import json

import pytest

from tests.trainers.conftest import tiny_rl_config

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here; `make test` runs this file under .venv-vllm")
pytestmark = pytest.mark.vllm

VLLM_KWARGS = {"max_model_len": 1024}


class _Shared:
    """The module's engine for one run: ``close()`` leaves it running for the next run."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, *args, **kwargs):
        return self.engine.generate(*args, **kwargs)

    def load_weights(self, state_dict):
        self.engine.load_weights(state_dict)

    def close(self):
        pass


@pytest.fixture(scope="module")
def engine(sft_model):
    from trainers.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(sft_model, seed=0, **VLLM_KWARGS)
    yield backend
    backend.close()


# The first test's set-up runs the session's SFT fixture (600 steps) and starts the engine:
# 10 minutes at a load average of ~25 on the 2 cores, hence a longer deadline than the default.
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_rl_with_vllm_backend_end_to_end(tmp_path, sft_model, engine, algo, monkeypatch):
    import torch

    import trainers.trainer as trainer_mod
    from trainers.trainer import Trainer

    def shared_backend(cfg, policy, tokenizer, run_dir):
        assert cfg.backend == "vllm" and cfg.vllm_kwargs == VLLM_KWARGS and cfg.seed == 0
        engine.load_weights(policy.state_dict())
        return _Shared(engine)

    monkeypatch.setattr(trainer_mod, "make_backend", shared_backend)
    cfg = tiny_rl_config(tmp_path / algo, algo, sft_model, backend="vllm", iterations=2, eval_every=1,
                         vllm_kwargs=VLLM_KWARGS)
    tr = Trainer(cfg)
    tr.setup()
    try:
        before = {k: v.detach().clone() for k, v in tr.policy.named_parameters()}
        last = tr.train()
        changed = [k for k, v in tr.policy.named_parameters() if not torch.equal(v, before[k])]
        assert changed, "no policy parameter changed"
        # After the last sync vLLM samples from the updated weights: its log-probs of its own
        # samples agree with the trainer's recomputation.
        assert last["train/logprob_mismatch_max"] < 1e-3
    finally:
        tr.cleanup()
    recs = [json.loads(x) for x in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1] and "eval/success_rate" in recs[-1]
