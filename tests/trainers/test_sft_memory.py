"""SFT's memory keys (``scale.max_tokens_per_microbatch``, ``scale.gradient_checkpointing``): the
same gradient as the plain step, and the keys SFT cannot use are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent_gym.tokenizer import pad_token_id
from trainers.config import ConfigError, ModelConfig, ScaleConfig
from trainers.models import load_policy, load_tokenizer_for
from trainers.scale import enable_checkpointing
from trainers.sft import SFTConfig, demonstrations, episodes_backward, episodes_loss

ENV = "AgentR1/FactChain-v0"


def _demos(tok, n=6):
    from agent_gym.factory import EnvFactory

    env = EnvFactory(ENV, {"num_tasks": 50}, tok).make().unwrapped
    demos = demonstrations(env, list(range(n)), "oracle", np.random.default_rng(0))
    assert len({len(d.token_ids) for d in demos}) > 1  # rows of several lengths: padding differs per micro-batch
    return demos


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("max_tokens", [None, 1, 300])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_micro_batches_and_checkpointing_give_the_plain_gradient(max_tokens, checkpointing):
    mcfg = ModelConfig(name="tiny", torch_threads=1)
    tok = load_tokenizer_for(mcfg)
    demos = _demos(tok)
    pad = pad_token_id(tok)
    plain = load_policy(mcfg, tok, seed=0)
    loss = episodes_loss(plain, demos, pad)
    loss.backward()
    model = load_policy(mcfg, tok, seed=0)
    if checkpointing:
        enable_checkpointing(model)
    got = episodes_backward(model, demos, pad, ScaleConfig(max_tokens_per_microbatch=max_tokens))
    assert got == pytest.approx(float(loss.detach()), rel=1e-5)
    torch.testing.assert_close(_grads(model), _grads(plain), rtol=1e-4, atol=1e-6)


def test_sft_refuses_the_rl_only_scale_keys():
    for bad in ({"lora_r": 8}, {"fsdp": True}):
        with pytest.raises(ConfigError, match="scale.lora_r and scale.fsdp are RL keys"):
            SFTConfig(env_id=ENV, scale=bad)
    assert SFTConfig(env_id=ENV, scale={"gradient_checkpointing": True}).scale.gradient_checkpointing


def test_the_final_evaluation_runs_without_the_optimizer_and_gradients(tmp_path, monkeypatch):
    """After the last step SFT frees what only training needs (the AdamW moments, the gradients)
    before its final evaluation, so the evaluation's KV cache does not sit on top of them; an
    evaluation during training runs without gradients too. The run's record says its whole peak."""
    import gc
    import json
    import weakref

    from trainers import sources
    from trainers.train_sft import main

    made = []  # weak references to the optimizers this run constructs (not other tests' in this process)
    real_init = torch.optim.AdamW.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    seen = []
    real = sources.evaluate_greedy

    def spy(*args, **kwargs):
        gc.collect()
        model = args[2].model
        seen.append((sum(r() is not None for r in made), sum(p.grad is not None for p in model.parameters())))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "__init__", recording_init)
    monkeypatch.setattr(sources, "evaluate_greedy", spy)
    run_dir = tmp_path / "sft"
    args = [f"env_id={ENV}", "model.name=tiny", f"run_dir={run_dir}", "steps=2", "batch_size=2", "num_demos=4"]
    assert main([*args, "eval.tasks=1", "eval.every=1", "warmup_steps=0", "model.torch_threads=1"]) == 0
    assert seen == [(1, 0), (1, 0), (0, 0)]  # steps 0 and 1 keep the optimizer; the final evaluation does not
    final = json.loads((run_dir / "final.json").read_text())
    assert final["memory/peak_rss_gib"] >= max(final["memory/train_peak_rss_gib"], final["memory/eval_peak_rss_gib"])
    assert final["memory/train_peak_rss_gib"] > 0 and final["memory/estimate_gib"] > 0
