"""A short learning run that must clearly improve on its starting success rate.

GRPO on a pool of 16 FactChain questions (2 hops), from the session's SFT warm start; success is
greedy, on that pool, before and after training. The full runs (3 seeds x PPO/GRPO, 15 minutes
each, and the action-mask ablation) are benchmarks/experiments/learning_runs.py; see docs/results.md.
"""

import torch

from tests.trainers.conftest import COMPACT_ENV
from trainers.compose import build_trainer
from trainers.config import TrainConfig


def test_grpo_clearly_improves_success(tmp_path, sft_model):
    env = {**COMPACT_ENV, "num_tasks": 16, "rewards": {"extra": {"hop": 0.2}}}
    cfg = TrainConfig(
        run_dir=str(tmp_path / "learn"),
        env_id="AgentR1/FactChain-v0",
        algo="grpo",
        init_from=sft_model,
        env_kwargs=env,
        eval_env_kwargs={"split": "train"},
        eval_tasks=16,
        tasks_per_iter=8,
        group_size=8,
        minibatch_size=32,
        lr=3e-4,
        warmup_steps=4,
        temperature=1.0,
        max_turn_tokens=40,
        iterations=40,
        eval_every=10,
        torch_threads=1,
        tensorboard=False,
        progress_bar=False,
        checkpoint_every=1000,
        recompute_logprobs=False,
    )
    tr = build_trainer(cfg)
    tr.setup()
    try:
        start = tr.evaluate()["eval/success_rate"]
        tr.train()
        end = tr.evaluate()["eval/success_rate"]
    finally:
        tr.cleanup()
    print(f"greedy success on the pool: {start:.3f} -> {end:.3f}")
    assert start <= 0.6
    assert end >= start + 0.25, (start, end)
    assert torch.isfinite(torch.tensor(end))
