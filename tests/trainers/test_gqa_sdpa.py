"""Grouped-query attention with a mask on the CPU without repeated keys and values
(trainers/models.py ``use_gqa_sdpa``): a policy the trainers load attends through ``GQA_SDPA``; its
log-probs and gradients equal transformers' own SDPA's on padded and prefix-shared batches, and a
training forward keeps less for the backward."""

from __future__ import annotations

import copy

import torch

from agent_gym.tokenizer import default_tokenizer
from trainers import models
from trainers.config import ModelConfig
from trainers.models import GQA_SDPA, token_logprobs


def _policy():
    m = models.load_policy(ModelConfig(name="tiny"), default_tokenizer(), seed=3)
    return m


def _batch(b: int = 3, t: int = 40, prefix: int = 0):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 2000, (b, t), generator=g)
    if prefix:
        ids[:, :prefix] = ids[0, :prefix]
    lengths = torch.tensor([t - 6 * i for i in range(b)])
    attn = (torch.arange(t)[None, :] < lengths[:, None]).long()
    mask = attn.clone().float()
    mask[:, : max(prefix, 5)] = 0
    return ids * attn, attn, mask


def _logprobs_and_grads(model, ids, attn, mask, share: bool):
    model.zero_grad(set_to_none=True)
    lp, _ = token_logprobs(model, ids, attn, loss_mask=mask, share_prefix=share)
    ((lp * mask).sum() / mask.sum()).backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_loaded_policy_attends_through_gqa_sdpa_and_matches_hf_sdpa():
    ours = _policy()
    assert ours.config._attn_implementation == GQA_SDPA
    assert ours.config.num_attention_heads > ours.config.num_key_value_heads  # grouped: the case that changes
    hf = copy.deepcopy(ours)
    hf.set_attn_implementation("sdpa")
    assert hf.config._attn_implementation == "sdpa"
    for prefix, share in ((0, False), (24, True)):  # padded rows; a shared prefix run once over a KV cache
        ids, attn, mask = _batch(prefix=prefix)
        lp_a, g_a = _logprobs_and_grads(ours, ids, attn, mask, share)
        lp_b, g_b = _logprobs_and_grads(hf, ids, attn, mask, share)
        torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=1e-5)
        assert g_a.keys() == g_b.keys() and g_a
        for n in g_a:
            torch.testing.assert_close(g_a[n], g_b[n], atol=1e-5, rtol=1e-4, msg=n)


def _saved(model, ids, attn, mask) -> list[torch.Tensor]:
    """The tensors a training forward keeps for the backward, the model's own weights left out."""
    kept: list[torch.Tensor] = []

    def pack(t):
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(model, ids, attn, loss_mask=mask)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return [t for t in kept if t.untyped_storage().data_ptr() not in weights]


def _storages(tensors, shape=None) -> dict[int, int]:
    return {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in tensors
        if shape is None or tuple(t.shape) == shape
    }


def test_gqa_sdpa_keeps_less_for_the_backward():
    ours = _policy()
    hf = copy.deepcopy(ours)
    hf.set_attn_implementation("sdpa")
    b, t = 4, 64
    ids, attn, mask = _batch(b=b, t=t)  # padded: transformers passes a mask, so it repeats K and V
    c = ours.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kept_ours, kept_hf = _saved(ours, ids, attn, mask), _saved(hf, ids, attn, mask)
    # the attention mask: one copy for every layer, not one per layer
    mask_shape = (b, 1, t, t)
    assert len(_storages(kept_hf, mask_shape)) == c.num_hidden_layers > 1
    assert len(_storages(kept_ours, mask_shape)) == 1
    # keys and values: at their own heads, never repeated to every query head
    kv_shape, every_head = (b, c.num_key_value_heads, t, head_dim), (b, c.num_attention_heads, t, head_dim)
    assert len(_storages(kept_ours, kv_shape)) == 2 * c.num_hidden_layers
    assert len(_storages(kept_hf, kv_shape)) == 0
    assert len(_storages(kept_hf, every_head)) > len(_storages(kept_ours, every_head))
    assert sum(_storages(kept_ours).values()) < sum(_storages(kept_hf).values())


def test_other_implementations_are_left_alone():
    m = _policy()
    m.set_attn_implementation("eager")
    models.use_gqa_sdpa(m)
    assert m.config._attn_implementation == "eager"
