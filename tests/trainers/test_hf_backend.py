"""HFBackend on the tiny Qwen2: batching, stops, log-probs and seeds.

Each check compares the batched sampling loop with something simpler that must agree with it:
one prompt at a time, a full forward pass over prompt + completion, or a second call.
"""

from __future__ import annotations

import pytest
import torch

from agent_gym.tokenizer import default_tokenizer
from trainers.backends import GenerationBackend, HFBackend, SamplingConfig
from trainers.backends.hf_backend import processed_logprobs
from trainers.tiny_model import build_tiny_qwen2


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_qwen2(tok, seed=0)


@pytest.fixture(scope="module")
def backend(model, tok):
    return HFBackend(model, pad_token_id=tok.pad_token_id)


def _prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 60) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(3, 2000, (k,), generator=g).tolist() for k in lengths]


def _full_forward_logprobs(model, prompt, completion, sampling) -> torch.Tensor:
    """Recompute each completion id's processed log-prob from one unpadded, uncached pass."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
    lp = processed_logprobs(logits, sampling.temperature, sampling.top_p, sampling.top_k)
    return lp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_implements_protocol(backend):
    from tests.helpers import assert_implements

    assert_implements(backend, GenerationBackend)  # every method, with the protocol's parameters


def test_tiny_model_shape(tok, model):
    assert model.config.vocab_size % 64 == 0 and model.config.vocab_size >= len(tok)
    assert model.config.eos_token_id == tok.eos_token_id == 2
    assert model.config.pad_token_id == tok.pad_token_id == 0
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    again = build_tiny_qwen2(tok, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_batched_greedy_equals_unbatched(backend):
    prompts = _prompts(12, seed=1)
    s = SamplingConfig(max_new_tokens=24, temperature=0)
    batched = backend.generate(prompts, s)
    for p, b in zip(prompts, batched):
        alone = backend.generate([p], s)[0]
        assert alone.token_ids == b.token_ids
        assert alone.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert len(b.token_ids) == 24 and b.finish_reason == "length"


def test_stop_ids_end_each_row_and_are_kept(backend):
    prompts = _prompts(6, seed=2)
    free = backend.generate(prompts, SamplingConfig(max_new_tokens=16, temperature=0))
    # Row i stops at a different step: its own greedy token at step i + 1 becomes a stop id.
    stop_ids = sorted({g.token_ids[i + 1] for i, g in enumerate(free)})
    stopped = backend.generate(prompts, SamplingConfig(max_new_tokens=16, temperature=0, stop_token_ids=stop_ids))
    for g_free, g in zip(free, stopped):
        first = next(k for k, t in enumerate(g_free.token_ids) if t in stop_ids)
        assert g.token_ids == g_free.token_ids[: first + 1]  # the stop id is included
        assert g.finish_reason == "stop"
        assert g.logprobs == pytest.approx(g_free.logprobs[: first + 1], abs=1e-5)
    lengths = {len(g.token_ids) for g in stopped}
    assert len(lengths) > 1, "rows should stop at different steps"


def test_max_new_tokens_one(backend):
    out = backend.generate(_prompts(3, seed=3), SamplingConfig(max_new_tokens=1, temperature=0))
    assert [len(g.token_ids) for g in out] == [1, 1, 1]
    assert all(g.finish_reason == "length" for g in out)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(max_new_tokens=20, temperature=0),
        SamplingConfig(max_new_tokens=20, temperature=1.0),
        SamplingConfig(max_new_tokens=20, temperature=0.7, top_p=0.9, top_k=40),
    ],
    ids=["greedy", "t1", "t0.7-p0.9-k40"],
)
def test_logprobs_match_full_forward(backend, model, sampling):
    prompts = _prompts(5, seed=4)
    out = backend.generate(prompts, sampling, seeds=[10, 11, 12, 13, 14])
    for p, g in zip(prompts, out):
        expected = _full_forward_logprobs(model, p, g.token_ids, sampling)
        assert torch.isfinite(expected).all(), "a sampled id must have positive mass"
        torch.testing.assert_close(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0)


def test_top_k_one_is_greedy(backend):
    prompts = _prompts(4, seed=5)
    greedy = backend.generate(prompts, SamplingConfig(max_new_tokens=12, temperature=0))
    k1 = backend.generate(prompts, SamplingConfig(max_new_tokens=12, temperature=1.0, top_k=1), seeds=[1, 2, 3, 4])
    assert [g.token_ids for g in greedy] == [g.token_ids for g in k1]
    assert all(lp == pytest.approx(0.0, abs=1e-6) for g in k1 for lp in g.logprobs)


def test_seeds_reproducible_and_independent_of_batch(backend):
    prompts = _prompts(6, seed=6)
    s = SamplingConfig(max_new_tokens=16, temperature=1.0)
    seeds = [101, 102, 103, 104, 105, 106]
    a = backend.generate(prompts, s, seeds=seeds)
    b = backend.generate(prompts, s, seeds=seeds)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    # Row 2 alone, and inside a different batch, draws the same sample.
    alone = backend.generate([prompts[2]], s, seeds=[seeds[2]])[0]
    other = backend.generate([prompts[5], prompts[2]], s, seeds=[999, seeds[2]])[1]
    assert alone.token_ids == a[2].token_ids == other.token_ids
    c = backend.generate(prompts, s, seeds=[s_ + 1000 for s_ in seeds])
    assert [g.token_ids for g in c] != [g.token_ids for g in a]


def test_unseeded_rows_follow_global_rng(backend):
    prompts = _prompts(3, seed=7)
    s = SamplingConfig(max_new_tokens=8, temperature=1.0)
    torch.manual_seed(5)
    a = backend.generate(prompts, s)
    torch.manual_seed(5)
    b = backend.generate(prompts, s)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_load_weights_changes_generation(tok):
    model = build_tiny_qwen2(tok, seed=0)
    be = HFBackend(model, pad_token_id=tok.pad_token_id)
    prompts = _prompts(4, seed=8)
    s = SamplingConfig(max_new_tokens=12, temperature=0)
    before = be.generate(prompts, s)
    other = build_tiny_qwen2(tok, seed=1)
    be.load_weights(other.state_dict())
    after = be.generate(prompts, s)
    reference = HFBackend(other, pad_token_id=tok.pad_token_id).generate(prompts, s)
    assert [g.token_ids for g in after] == [g.token_ids for g in reference]
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    with pytest.raises(KeyError, match="unexpected"):
        be.load_weights({**other.state_dict(), "bogus.weight": torch.zeros(1)})


def test_bad_arguments(backend):
    with pytest.raises(ValueError, match="seeds"):
        backend.generate([[5, 6]], SamplingConfig(), seeds=[1, 2])
    with pytest.raises(ValueError, match="at least one token"):
        backend.generate([[]], SamplingConfig())
    with pytest.raises(ValueError, match="top_p"):
        backend.generate([[5]], SamplingConfig(top_p=0))
    assert backend.generate([], SamplingConfig()) == []


def test_batch_64_x_64_is_one_batched_pass_per_token(model, tok):
    """64 prompts x 64 new tokens in one call run the model once per new token over the whole batch
    (a prefill, then one decode step per token with the KV cache), not once per row: what makes the
    call fast, checked by counting forwards (a wall-clock bound here failed under load; speed is
    measured by the benchmarks, never by a timed test)."""
    backend = HFBackend(model, pad_token_id=tok.pad_token_id, num_threads=1)
    prompts = _prompts(64, seed=9, lo=20, hi=200)
    s = SamplingConfig(max_new_tokens=64, temperature=1.0)
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_hook(
        lambda mod, args, kwargs, out: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        out = backend.generate(prompts, s, seeds=list(range(64)))
    finally:
        hook.remove()
    assert sum(len(g.token_ids) for g in out) == 64 * 64
    assert len(shapes) == 64  # one prefill and 63 decode steps
    assert shapes[0][0] == 64 and all(sh == (64, 1) for sh in shapes[1:])


def test_one_draw_per_row_is_the_per_token_stream():
    """HFBackend draws each row's uniforms for a whole call at once (one torch.rand per row, not
    per token); tokens stay those of one draw per token only because torch's generator fills a
    tensor in order. Checked on the sizes a call uses."""
    for n in (1, 7, 16, 64, 513):
        g = torch.Generator().manual_seed(123)
        one_by_one = torch.cat([torch.rand(1, generator=g) for _ in range(n)])
        g = torch.Generator().manual_seed(123)
        assert torch.equal(torch.rand(n, generator=g), one_by_one), n
