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
