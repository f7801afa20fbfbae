"""``scale.memory_check``: a run whose estimated peak cannot fit the machine is refused at start,
with the estimate and the keys to change; the estimate follows the memory keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainers.compose import build_trainer
from trainers.config import ModelConfig, load_config
from trainers.memory_budget import MemoryBudgetError, MemoryBudgetWarning, check_fits, context_bound, host_step_estimate
from trainers.models import load_policy, load_tokenizer_for

BASE = [
    "rollout.env_id=AgentR1/FactChain-v0",
    "model.name=tiny",
    "model.torch_threads=1",
    "rollout.tasks_per_iter=2",
    "algorithm.minibatch_size=2",
    "run.tensorboard=false",
    "run.progress_bar=false",
]


@pytest.mark.timeout(300)
def test_a_config_that_cannot_fit_is_refused_at_start_naming_the_keys(tmp_path):
    # a micro-batch budget bounds the update, yet one episode may grow to 50M tokens: terabytes
    huge = [
        *BASE,
        f"run.run_dir={tmp_path / 'a'}",
        "rollout.env_kwargs={max_context_tokens: 50000000}",
        "scale.max_tokens_per_microbatch=4096",
    ]
    tr = build_trainer(load_config(None, huge))
    with pytest.raises(MemoryBudgetError) as e:
        try:
            tr.setup()
        finally:
            tr.cleanup()
    msg = str(e.value)
    assert "needs about" in msg and "GiB available" in msg and "activations" in msg
    assert "scale.max_tokens_per_microbatch" in msg and "scale.memory_check=false" in msg
    # without a budget the worst case depends on how long episodes turn out: a warning, and it starts
    free = [x for x in huge if not x.startswith("scale.max_tokens")]
    tr = build_trainer(load_config(None, [*free, f"run.run_dir={tmp_path / 'w'}"]))
    with pytest.warns(MemoryBudgetWarning, match="not a refusal"):
        try:
            tr.setup()
        finally:
            tr.cleanup()
    # the check off, and a run that fits: both start, with the estimate logged
    for name, over in (
        ("off", ["scale.memory_check=false"]),
        ("fits", ["rollout.env_kwargs={max_context_tokens: 1024}"]),
    ):
        tr = build_trainer(load_config(None, [*huge, f"run.run_dir={tmp_path / name}", *over]))
        try:
            tr.setup()
            assert tr.memory_estimate is not None and tr.memory_estimate > 0
        finally:
            tr.cleanup()


def test_the_estimate_follows_the_memory_keys():
    mc = ModelConfig(name="tiny", torch_threads=1)
    model = load_policy(mc, load_tokenizer_for(mc))
    plain = host_step_estimate(model, 8192, 2048, checkpointing=False)
    ckpt = host_step_estimate(model, 8192, 2048, checkpointing=True)
    half = host_step_estimate(model, 4096, 1024, checkpointing=False)
    act = lambda e: next(v for k, v in e.items() if k.startswith("activations"))  # noqa: E731
    assert act(ckpt) < act(plain) and act(half) == pytest.approx(act(plain) / 2)
    assert plain["total"] == pytest.approx(sum(v for k, v in plain.items() if k != "total"))
    check_fits(plain, "x", "keys", available_gib=plain["total"] + 0.01)
    with pytest.raises(MemoryBudgetError, match="Lower it with keys"):
        check_fits(plain, "x", "keys", available_gib=plain["total"] - 0.01)


def test_the_context_bound_comes_from_kwargs_registration_or_the_class_default():
    assert context_bound("AgentR1/FactChain-v0", {"max_context_tokens": 777}) == 777
    assert context_bound("AgentR1/FactChain-v0", {}) == 1024  # FactChainEnv's default
    assert context_bound("NoSuch/Env-v0", {}) is None


@pytest.mark.timeout(300)
def test_a_shared_prompt_adds_the_keys_and_values_its_rows_keep():
    from trainers.memory_budget import kv_width, rl_step_estimate

    over = [
        *BASE,
        "rollout.env_kwargs={max_context_tokens: 4096}",
        "rollout.group_size=4",
        "algorithm.minibatch_size=8",
        "scale.max_tokens_per_microbatch=1024",
    ]
    mc = ModelConfig(name="tiny", torch_threads=1)
    model = load_policy(mc, load_tokenizer_for(mc))
    plain = rl_step_estimate(load_config(None, over), model, None, reference_copy=False)
    shared = rl_step_estimate(load_config(None, [*over, "scale.share_prefix=true"]), model, None, reference_copy=False)
    ckpt = rl_step_estimate(
        load_config(None, [*over, "scale.share_prefix=true", "scale.gradient_checkpointing=true"]),
        model,
        None,
        reference_copy=False,
    )
    plain_ckpt = rl_step_estimate(
        load_config(None, [*over, "scale.gradient_checkpointing=true"]), model, None, reference_copy=False
    )
    key, key_ckpt = "keys and values of a shared prompt, 4 rows", "keys and values of a shared prompt, 1 row"
    assert key not in plain and key not in ckpt and key_ckpt not in plain_ckpt
    # by hand: 4 rows sharing a prompt of 1024 - 4 tokens, each keeping it: 3 x 1020 extra positions
    c = model.config
    per_position = c.num_hidden_layers * 2 * kv_width(c) * 4 / 2**30
    assert shared[key] == pytest.approx(3 * 1020 * per_position)
    assert shared["total"] == pytest.approx(plain["total"] + shared[key])
    # under checkpointing a layer's keys and values are recomputed: the prompt's own stay, one row
    assert ckpt[key_ckpt] == pytest.approx(1020 * per_position)
    assert ckpt["total"] == pytest.approx(plain_ckpt["total"] + ckpt[key_ckpt])


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="/proc is Linux's")
def test_rss_gib_is_the_resident_memory_now_and_falls_back():
    """``perf/rss_gib``: what is resident now (psutil agrees), up by what a buffer touches and down
    when it is freed, unlike the peak."""
    import psutil

    from trainers.memory_budget import peak_rss_gib, rss_gib

    before = rss_gib()
    assert before == pytest.approx(psutil.Process().memory_info().rss / 2**30, abs=0.05)
    buf = np.ones(256 * 2**20 // 8)  # 256 MiB, every page written
    held = rss_gib()
    assert held - before == pytest.approx(0.25, abs=0.05)
    del buf
    assert rss_gib() < held - 0.2 and peak_rss_gib() >= held - 0.01
