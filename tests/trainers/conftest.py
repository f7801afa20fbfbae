import pytest

from tests.trainers.sft_fixture import COMPACT_ENV, cached_sft_model

__all__ = ["COMPACT_ENV", "tiny_rl_config"]


@pytest.fixture(scope="session")
def sft_model():
    """The tiny model after the demo's SFT warm start (tests/trainers/sft_fixture.py): loaded from
    .cache/test_sft_model/, trained first where `make sft-fixture` has not built it."""
    return cached_sft_model()


def tiny_rl_config(run_dir, algo, init_from, **kw):
    from trainers.config import TrainConfig

    base = dict(
        run_dir=str(run_dir),
        env_id="AgentR1/FactChain-v0",
        eval_env_kwargs={"split": "test"},
        algo=algo,
        iterations=3,
        init_from=init_from,
        tasks_per_iter=4,
        group_size=2,
        minibatch_size=4,
        max_turn_tokens=40,
        eval_every=100,
        eval_tasks=4,
        tensorboard=False,
        progress_bar=False,
        torch_threads=1,
        lr=1e-3,
        checkpoint_every=1,
        env_kwargs={**COMPACT_ENV, "rewards": {"call_invalid": -0.1, "no_action": -0.1, "extra": {"hop": 0.2}}},
    )
    base.update(kw)
    return TrainConfig(**base)
