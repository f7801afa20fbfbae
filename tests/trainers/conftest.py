import pytest

COMPACT_ENV = {"tools_in_prompt": False, "system_prompt": "Follow the chain of facts with lookup, innermost relation first."}


@pytest.fixture(scope="session")
def sft_model(tmp_path_factory):
    """A tiny model after the CPU demo's SFT warm start (configs/factchain_sft.yaml: an imperfect
    demonstrator, 40% oracle and 60% relations in reverse order): it emits the tool-call format,
    copies and chains, and gets a minority of the 2-hop questions right (about 35% greedy)."""
    from trainers.sft import SFTConfig, run_sft

    run_dir = tmp_path_factory.mktemp("sft")
    final = run_sft(SFTConfig(run_dir=str(run_dir), steps=600, batch_size=32, num_demos=2000, eval_tasks=16,
                              env_kwargs=dict(COMPACT_ENV), max_turn_tokens=40, lr_schedule="cosine",
                              warmup_steps=20, demo_policy={"oracle": 0.4, "reversed": 0.6}))
    assert final["sft/loss"] < 0.5
    return str(run_dir / "model")


def tiny_rl_config(run_dir, algo, init_from, **kw):
    from trainers.config import TrainConfig

    base = dict(run_dir=str(run_dir), algo=algo, iterations=3, init_from=init_from, tasks_per_iter=4, group_size=2,
                minibatch_size=4, max_turn_tokens=40, eval_every=100, eval_tasks=4, tensorboard=False,
                progress_bar=False, torch_threads=1, lr=1e-3, checkpoint_every=1,
                env_kwargs={**COMPACT_ENV, "rewards": {"call_invalid": -0.1, "no_action": -0.1, "extra": {"hop": 0.2}}})
    base.update(kw)
    return TrainConfig(**base)
