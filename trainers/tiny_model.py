"""A tiny Qwen2 causal LM built from a config, for CPU tests and benchmarks.

The shape defaults are the ones measured to run in both transformers and vLLM's CPU backend
(docs/design.md, "Facts measured on the project's machine"): vLLM's CPU attention needs a head
dimension of 32 or more, and its in-place weight reload matches transformers only with untied
input/output embeddings, hence ``tie_word_embeddings=False`` by default.
"""

from __future__ import annotations

from typing import Any

import torch

from agent_gym.tokenizer import pad_token_id


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def build_tiny_qwen2(
    tokenizer: Any,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    head_dim: int = 32,
    tie_word_embeddings: bool = False,
):
    """A randomly initialised ``Qwen2ForCausalLM`` (float32, eval mode) sized for ``tokenizer``.

    The vocabulary is ``len(tokenizer)`` rounded up to a multiple of 64, so every token id the
    tokenizer can emit has a row. eos/pad/bos ids come from the tokenizer (bos falls back to eos
    when the tokenizer has none, as Qwen2 does). The same ``seed`` gives the same weights.
    """
    from transformers import (  # deferred: transformers (seconds) stays out of `import trainers.models`
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    eos_id = tokenizer.eos_token_id
    pad_id = pad_token_id(tokenizer)
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos_id
    config = Qwen2Config(
        vocab_size=_round_up(len(tokenizer), 64),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.to(torch.float32)
    model.eval()
    return model
