"""token_logprobs' masked fast path: scoring only the positions under the loss mask must give the
same log-probs, entropies and gradients there as the full-vocabulary pass over every position."""

from __future__ import annotations

import pytest
import torch

from agent_gym.tokenizer import default_tokenizer
from trainers.models import token_logprobs
from trainers.tiny_model import build_tiny_qwen2


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen2(default_tokenizer(), seed=3)


def _batch(seed: int = 0, b: int = 5, t: int = 40):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 2000, (b, t), generator=g)
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
    attn = (torch.arange(t)[None, :] < lengths[:, None]).long()
    mask = (torch.rand(b, t, generator=g) < 0.4).float() * attn
    mask[:, 0] = 0  # the first token has no prefix to be predicted from
    return ids, attn, mask


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_masked_equals_full_under_the_mask(model, temperature):
    ids, attn, mask = _batch()
    full, full_ent = token_logprobs(model, ids, attn, with_entropy=True, temperature=temperature)
    fast, fast_ent = token_logprobs(model, ids, attn, with_entropy=True, temperature=temperature, loss_mask=mask)
    m = mask > 0
    assert m.sum() > 20
    torch.testing.assert_close(fast[m], full[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast_ent[m], full_ent[m], atol=1e-5, rtol=1e-5)
    assert (fast[~m] == 0).all() and (fast_ent[~m] == 0).all()
    assert (full[~m & (attn > 0)] != 0).any()  # the full pass does score the other positions


def test_masked_gradients_equal_full(model):
    ids, attn, mask = _batch(seed=1)
    grads = []
    for lm in (None, mask):
        model.zero_grad(set_to_none=True)
        lp, _ = token_logprobs(model, ids, attn, loss_mask=lm)
        (-(lp * mask).sum() / mask.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.zero_grad(set_to_none=True)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == len(list(model.parameters()))
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-6, rtol=1e-4, msg=n)


@pytest.mark.parametrize("masked", [False, True])
def test_scoring_builds_no_kv_cache(model, masked, monkeypatch):
    """Scoring and training forwards run without a KV cache (the model's config has use_cache on):
    a cache would keep every layer's keys and values to the end of a no-grad forward."""
    import transformers.cache_utils as cache_utils

    assert model.config.use_cache
    built = []
    init = cache_utils.DynamicCache.__init__
    monkeypatch.setattr(
        cache_utils.DynamicCache, "__init__", lambda self, *a, **k: built.append(1) or init(self, *a, **k)
    )
    ids, attn, mask = _batch(seed=2)
    with torch.no_grad():
        token_logprobs(model, ids, attn, loss_mask=mask if masked else None)
    assert built == []
