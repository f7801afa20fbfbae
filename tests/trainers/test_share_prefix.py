"""``scale.share_prefix``: rows that begin with the same tokens (a GRPO group's prompt) are scored and
trained with one forward of the common prefix (trainers/models.py ``decoder_hidden``). The log-probs,
entropies, values and gradients must equal the plain batched forward's up to float rounding; the
micro-batches hold one group each; the update equals the plain one when the minibatch is the batch."""

from __future__ import annotations

import copy
import json
import warnings
from types import SimpleNamespace

import pytest
import torch

from agent_gym.tokenizer import default_tokenizer
from trainers import models, scale
from trainers.config import ScaleConfig
from trainers.models import MIN_SHARED_PREFIX, Critic, shared_prefix_len, token_logprobs
from trainers.tiny_model import build_tiny_qwen2


def _group(seed: int = 0, b: int = 4, prefix: int = 48, rest: int = 30):
    """``b`` right-padded rows that share their first ``prefix`` tokens, of different lengths,
    with agent tokens (the loss mask) after the prefix only."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(3, 2000, (1, prefix), generator=g).expand(b, -1)
    ids = torch.cat([head, torch.randint(3, 2000, (b, rest), generator=g)], 1)
    lengths = torch.tensor([prefix + rest - 7 * i for i in range(b)])
    attn = (torch.arange(prefix + rest)[None, :] < lengths[:, None]).long()
    ids = ids * attn
    mask = (torch.rand(ids.shape, generator=g) < 0.5).float() * attn
    mask[:, :prefix] = 0
    return ids, attn, mask


def test_shared_prefix_len():
    ids, attn, _ = _group(prefix=48)
    assert shared_prefix_len(ids, attn) == 48
    assert shared_prefix_len(ids[:1], attn[:1]) == 0  # one row: nothing to share
    same = ids[:1].expand(3, -1)  # identical rows: each keeps one token of its own
    assert shared_prefix_len(same, torch.ones_like(same)) == same.shape[1] - 1
    short = attn.clone()
    short[2, 20:] = 0  # a row that ends inside the common prefix caps it
    assert shared_prefix_len(ids, short) == 19
    other = ids.clone()
    other[1, 10] += 1  # the rows part at position 10
    assert shared_prefix_len(other, attn) == 10


@pytest.fixture(scope="module")
def lora_model():
    torch.manual_seed(0)
    m = scale.add_lora(build_tiny_qwen2(default_tokenizer(), seed=3), ScaleConfig(lora_r=4, lora_alpha=8))
    for n, p in m.named_parameters():  # adapters that act (peft starts B at 0)
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    return m.train()


def _grads(model, lp, mask):
    model.zero_grad(set_to_none=True)
    ((lp * mask).sum() / mask.sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_shared_logprobs_entropies_and_gradients_equal_the_plain_forward(lora_model, monkeypatch):
    ids, attn, mask = _group(prefix=MIN_SHARED_PREFIX + 16)
    seen = []
    real = models.shared_prefix_len
    monkeypatch.setattr(models, "shared_prefix_len", lambda *a: seen.append(real(*a)) or seen[-1])
    plain, plain_ent = token_logprobs(lora_model, ids, attn, with_entropy=True, temperature=0.7, loss_mask=mask)
    g_plain = _grads(lora_model, plain, mask)
    assert seen == []  # off by default
    shared, shared_ent = token_logprobs(
        lora_model, ids, attn, with_entropy=True, temperature=0.7, loss_mask=mask, share_prefix=True
    )
    g_shared = _grads(lora_model, shared, mask)
    assert seen == [MIN_SHARED_PREFIX + 16]  # the shared path ran
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared_ent, plain_ent, atol=1e-5, rtol=1e-5)
    assert set(g_shared) == set(g_plain) and any("lora_A" in n for n in g_plain)
    for n in g_plain:
        torch.testing.assert_close(g_shared[n], g_plain[n], atol=1e-6, rtol=1e-4)


def test_the_plain_forward_below_the_minimum(lora_model, monkeypatch):
    calls = []
    real = lora_model.get_decoder().forward

    def counted(*a, **kw):
        calls.append(kw.get("past_key_values") is not None)
        return real(*a, **kw)

    dec = lora_model.get_decoder()
    monkeypatch.setattr(dec, "forward", counted)
    ids, attn, mask = _group(prefix=MIN_SHARED_PREFIX - 1)
    token_logprobs(lora_model, ids, attn, loss_mask=mask, share_prefix=True)
    assert calls == [False]  # one plain forward: too short a prefix to be worth two
    ids, attn, mask = _group(prefix=MIN_SHARED_PREFIX + 16)
    lora_model.eval()
    calls.clear()
    with torch.no_grad():
        token_logprobs(lora_model, ids, attn, loss_mask=mask, share_prefix=True)
    lora_model.train()
    assert calls == [True, True]  # scoring (no backward) shares: the prefix, then the rest on its cache
    # under checkpointing, a decoder whose layers are not transformers' checkpointing layers (so its
    # cache would be dropped or written twice) runs the plain forward
    monkeypatch.setattr(dec, "gradient_checkpointing", True, raising=False)
    monkeypatch.setattr(models, "_checkpoints_with_cache", lambda d: False)
    calls.clear()
    token_logprobs(lora_model, ids, attn, loss_mask=mask, share_prefix=True)
    assert calls == [False]


def _saved_bytes(fn):
    """What autograd keeps for the backward while ``fn`` runs (outside checkpointed regions), bytes."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total[0]


def test_shared_prefix_under_gradient_checkpointing_equals_the_plain_forward():
    """Under ``scale.gradient_checkpointing`` the shared path runs too, each layer of both passes
    checkpointed: the log-probs and gradients equal the plain forward's (itself checkpointed), each
    layer runs twice per pass (the forward and the backward's recompute), and the backward keeps a
    fraction of what the shared path keeps without checkpointing."""
    torch.manual_seed(0)
    model = build_tiny_qwen2(default_tokenizer(), seed=3)
    scale.enable_checkpointing(model)
    model = scale.add_lora(model, ScaleConfig(lora_r=4, lora_alpha=8)).train()
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    free = copy.deepcopy(model)  # the same weights, without checkpointing
    free.get_base_model().gradient_checkpointing_disable()
    assert not free.get_decoder().gradient_checkpointing and model.get_decoder().gradient_checkpointing
    ids, attn, mask = _group(b=4, prefix=MIN_SHARED_PREFIX + 40, rest=30)
    mask[:, MIN_SHARED_PREFIX + 40] = 1  # every row's first token of its own: scored on the prefix's last state
    plain = token_logprobs(model, ids, attn, temperature=0.7, loss_mask=mask)[0]
    g_plain = _grads(model, plain, mask)

    layer = model.get_decoder().layers[0]
    runs = []
    real = layer.forward
    layer.forward = lambda *a, **kw: runs.append(a[0].shape[0]) or real(*a, **kw)
    try:
        shared, kept = _saved_bytes(
            lambda: token_logprobs(model, ids, attn, temperature=0.7, loss_mask=mask, share_prefix=True)[0]
        )
        g_shared = _grads(model, shared, mask)
    finally:
        del layer.forward
    assert sorted(runs) == [1, 1, 4, 4]  # the prefix (one row) and the rows, each again in the backward
    assert all("_can_checkpoint_with_cache" not in x.__dict__ for x in model.get_decoder().layers)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    assert set(g_shared) == set(g_plain) and any("lora_A" in n for n in g_plain)
    for n in g_plain:
        torch.testing.assert_close(g_shared[n], g_plain[n], atol=1e-6, rtol=1e-4)

    unchecked, kept_free = _saved_bytes(
        lambda: token_logprobs(free, ids, attn, temperature=0.7, loss_mask=mask, share_prefix=True)[0]
    )
    torch.testing.assert_close(unchecked, plain, atol=1e-5, rtol=1e-5)
    assert kept < kept_free / 3, (kept, kept_free)


def test_the_critic_shares_the_prefix_too():
    policy = build_tiny_qwen2(default_tokenizer(), seed=5)
    critic = Critic(policy)
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    ids, attn, _ = _group(prefix=MIN_SHARED_PREFIX + 8)
    plain = critic(ids, attn)
    critic.share_prefix = True
    shared = critic(ids, attn)
    m = attn > 0
    torch.testing.assert_close(shared[m], plain[m], atol=1e-5, rtol=1e-5)


def test_forward_positions_count_a_shared_prefix_once():
    ids, attn, _ = _group(b=4, prefix=48, rest=30)  # 78 positions a row
    assert scale.forward_positions(SimpleNamespace(input_ids=ids, attention_mask=attn), False) == 4 * 78
    assert scale.forward_positions(SimpleNamespace(input_ids=ids, attention_mask=attn), True) == 48 + 4 * 30
    ids, attn, _ = _group(b=4, prefix=MIN_SHARED_PREFIX - 1, rest=30)  # too short to share: the plain forward
    assert scale.forward_positions(SimpleNamespace(input_ids=ids, attention_mask=attn), True) == 4 * ids.shape[1]


def test_pack_by_prefix():
    # rows 0-3 group 7 (prefix 100), rows 4-5 group 9 (prefix 50); lengths as given
    lengths, gids = [300, 250, 280, 200, 120, 90], [7, 7, 7, 7, 9, 9]
    assert scale.pack_by_prefix(lengths, gids, {7: 100, 9: 50}, None) == [[0, 2, 1, 3], [4, 5]]
    # a budget of 600: group 7 costs 100 + n x (longest - 100); 100 + 2 x 200 = 500 fits, a third row not
    assert scale.pack_by_prefix(lengths, gids, {7: 100, 9: 50}, 600) == [[0, 2], [1, 3], [4, 5]]
    # without a shared prefix the budget counts every row whole
    assert scale.pack_by_prefix(lengths, gids, {7: 0, 9: 0}, 600) == [[0, 2], [1, 3], [4, 5]]
    assert scale.pack_by_prefix(lengths, gids, {7: 0, 9: 0}, 550) == [[0], [2], [1, 3], [4, 5]]


def test_rows_without_a_shared_prompt_are_packed_together():
    """Groups that share a prompt get a micro-batch each; rows of groups that share less than
    MIN_SHARED_PREFIX tokens (groups of one row here) are packed by tokens, as without sharing,
    instead of one micro-batch a row."""
    from types import SimpleNamespace

    ids, attn, _ = _group(seed=1, b=2, prefix=MIN_SHARED_PREFIX + 10, rest=8)  # rows 0-1: 50, 43 tokens, one prompt
    lone, lone_attn, _ = _group(seed=2, b=3, prefix=0)  # rows 2-4: 30, 23, 16 tokens, a group each
    t = max(ids.shape[1], lone.shape[1])
    pad = lambda x: torch.nn.functional.pad(x, (0, t - x.shape[1]))  # noqa: E731
    mb = SimpleNamespace(
        input_ids=torch.cat([pad(ids), pad(lone)]),
        attention_mask=torch.cat([pad(attn), pad(lone_attn)]),
        group_ids=torch.tensor([0, 0, 1, 2, 3]),
    )
    assert scale.prefix_parts(mb, None) == [[0, 1], [2, 3, 4]]
    # a budget of 70: the group costs 42 + 2 x 8 = 58; the loose rows pack as pack_by_tokens packs them
    assert scale.prefix_parts(mb, 70) == [[0, 1], [2, 3], [4]]


@pytest.mark.timeout(300)
def test_grpo_update_with_a_shared_prefix_equals_the_plain_update(tmp_path, sft_model, monkeypatch):
    """One GRPO iteration from the same seed, the minibatch the whole batch: the rollout is the same,
    the update's micro-batches hold one group each and share its prompt, and the loss and the
    weights after the update equal the plain run's up to float rounding."""
    from tests.trainers.conftest import tiny_rl_config
    from trainers.compose import build_trainer

    seen = []
    real = models.shared_prefix_len
    monkeypatch.setattr(models, "shared_prefix_len", lambda *a: seen.append(real(*a)) or seen[-1])
    out, scored = {}, {}
    for share in (False, True):
        cfg = tiny_rl_config(
            tmp_path / str(share), "grpo", sft_model, iterations=1, temperature=1.5, minibatch_size=8, kl_coef=0.05
        )
        cfg.scale.share_prefix = share
        cfg.rollout.recompute_logprobs = True
        tr = build_trainer(cfg)
        tr.setup()
        micro = []
        orig, score = tr.microbatches, tr.score
        tr.microbatches = lambda batch, idx, orig=orig: micro.append(orig(batch, idx)) or micro[-1]
        tr.score = lambda trajs, score=score, share=share: scored.setdefault(share, score(trajs))
        try:
            tr.train()
            weights = {n: p.detach().clone() for n, p in tr.policy.named_parameters() if p.requires_grad}
        finally:
            tr.cleanup()
        row = json.loads((tmp_path / str(share) / "metrics.jsonl").read_text().splitlines()[0])
        out[share] = (row, weights, micro)
    (row0, w0, micro0), (row1, w1, micro1) = out[False], out[True]
    assert row0["rollout/reward_mean"] == row1["rollout/reward_mean"]
    assert row0["policy/loss"] != 0.0 and row0["update/skipped"] == 0.0
    assert row1["policy/loss"] == pytest.approx(row0["policy/loss"], abs=1e-5)
    b0, b1 = scored[False], scored[True]  # old and reference log-probs, each scored with sharing too
    m = b0.loss_mask > 0
    assert (b0.ref_logprobs[m] != 0).all() and (b0.old_logprobs[m] != 0).all()
    torch.testing.assert_close(b1.old_logprobs, b0.old_logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b1.ref_logprobs, b0.ref_logprobs, atol=1e-5, rtol=1e-5)
    # Adam's first step is about lr x sign(g) except where |g| is near its eps: there a float rounding
    # of the gradient (the two paths' matmuls have different shapes) moves the step by a share of lr.
    # Every weight within 5% of one step, and all but 0.1% within rounding; a wrong gradient (a
    # prefix's lost, say) moves many by a whole step.
    lr = cfg.algorithm.lr
    for n in w0:
        torch.testing.assert_close(w1[n], w0[n], atol=0.05 * lr, rtol=0)
        off = ((w1[n] - w0[n]).abs() > 1e-5 + 1e-4 * w0[n].abs()).sum().item()
        assert off <= 1e-3 * w0[n].numel(), (n, off)
    assert len(micro0) == len(micro1) == 1 and len(micro0[0]) == 1  # no budget: one micro-batch
    groups = [set(mb.group_ids.tolist()) for mb, _ in micro1[0]]
    assert len(groups) == 4 and all(len(g) == 1 for g in groups)  # one group each
    assert sum(w for _, w in micro1[0]) == pytest.approx(1.0)
    assert seen and max(seen) >= MIN_SHARED_PREFIX, seen  # the groups' prompts were shared
    # the largest forward, by hand: rows x length plain; the prompt once, then each row's rest, shared
    widest_plain = max(mb.input_ids.numel() for mb, _ in micro0[0])
    widest_shared = max(
        (n := real(mb.input_ids, mb.attention_mask)) + mb.input_ids.shape[0] * (mb.input_ids.shape[1] - n)
        for mb, _ in micro1[0]
    )
    assert row0["perf/max_microbatch_positions"] == widest_plain
    assert row1["perf/max_microbatch_positions"] == widest_shared < widest_plain


@pytest.mark.timeout(300)
def test_an_update_that_cannot_share_under_checkpointing_is_packed_and_counted_plainly(
    tmp_path, sft_model, monkeypatch
):
    """share_prefix under gradient checkpointing with a decoder whose layers are not transformers'
    checkpointing layers: the update's forwards run every row whole (decoder_hidden's plain path), so
    its micro-batches are packed and its positions counted as without sharing, and the user is told;
    the result equals the plain checkpointed run's."""
    from tests.trainers.conftest import tiny_rl_config
    from trainers.compose import build_trainer

    monkeypatch.setattr(models, "_checkpoints_with_cache", lambda d: False)
    out = {}
    for share in (False, True):
        cfg = tiny_rl_config(tmp_path / str(share), "grpo", sft_model, iterations=1, temperature=1.5, minibatch_size=8)
        cfg.scale.share_prefix = share
        cfg.scale.gradient_checkpointing = True
        cfg.scale.max_tokens_per_microbatch = 4096
        tr = build_trainer(cfg)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tr.setup()
        micro = []
        orig = tr.microbatches
        tr.microbatches = lambda batch, idx, orig=orig: micro.append(orig(batch, idx)) or micro[-1]
        try:
            tr.train()
        finally:
            tr.cleanup()
        row = json.loads((tmp_path / str(share) / "metrics.jsonl").read_text().splitlines()[0])
        said = [str(w.message) for w in caught if "scale.share_prefix" in str(w.message)]
        out[share] = (row, micro, said, tr.memory_estimate)
    (row0, micro0, said0, est0), (row1, micro1, said1, est1) = out[False], out[True]
    # the same rows in the same minibatches and micro-batches (no grouping by prompt), the same estimate
    assert [[mb.input_ids.shape for mb, _ in m] for m in micro1] == [
        [mb.input_ids.shape for mb, _ in m] for m in micro0
    ]
    assert all(
        torch.equal(a.input_ids, b.input_ids) for m1, m0 in zip(micro1, micro0) for (a, _), (b, _) in zip(m1, m0)
    )
    assert est1 == est0 is not None
    assert (
        row1["perf/max_microbatch_positions"]
        == row0["perf/max_microbatch_positions"]
        == max(mb.input_ids.numel() for m in micro1 for mb, _ in m)
    )
    assert row1["policy/loss"] == pytest.approx(row0["policy/loss"], abs=1e-5)
    assert said0 == [] and len(said1) == 1 and "every row at full length" in said1[0]
    assert tr.update_share_prefix is False
