"""The trainer is one class composed of a rollout source and a parallelism strategy:
``trainers.compose.choose_parts`` is the one place that picks them from the config, refuses
combinations no parts run, and nothing subclasses the trainer."""

import ast
from pathlib import Path

import pytest

from trainers.compose import choose_parts
from trainers.config import ConfigError, TrainConfig
from trainers.distributed import FSDP
from trainers.multiagent import TeamRollout
from trainers.parallel import SingleProcess
from trainers.ray_rollout import RayRollout
from trainers.sources import LocalRollout

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "kw,rollout,parallel",
    [
        (dict(env_id="AgentR1/FactChain-v0"), LocalRollout, SingleProcess),
        (dict(env_id="AgentR1/FactChain-v0", rollout_workers=2), RayRollout, SingleProcess),
        (dict(env_id="AgentR1/FactChain-v0", fsdp=True), LocalRollout, FSDP),
        (dict(env_id="AgentR1/FactChainTeam-v0"), TeamRollout, SingleProcess),
    ],
)
def test_the_config_picks_the_parts(kw, rollout, parallel):
    parts = choose_parts(TrainConfig(**kw))
    assert (parts.rollout, parts.parallel) == (rollout, parallel)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(fsdp=True), "scale.fsdp: true with the multi-agent env_id"),
        (dict(rollout_workers=2), "rollout.workers: 2 is not supported with the multi-agent env"),
    ],
)
def test_combinations_no_parts_run_are_refused_naming_the_key(kw, match):
    pytest.importorskip("pettingzoo")
    with pytest.raises(ConfigError, match=match):
        choose_parts(TrainConfig(env_id="AgentR1/FactChainTeam-v0", **kw))


def test_no_class_subclasses_the_trainer():
    """Variation goes into parts, not subclasses: no class under trainers/ derives from ``Trainer``."""
    subclasses = []
    for path in sorted((ROOT / "trainers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if "Trainer" in bases:
                    subclasses.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert (ROOT / "trainers" / "trainer.py").is_file()
    assert subclasses == []


def test_a_lone_lockstep_engine_takes_every_core(monkeypatch):
    # make_backend's placement of vLLM's OpenMP threads on the CPU: every core for a lockstep
    # trainer's or an evaluator's engine; vLLM's own for an async engine (it generates while the
    # learner trains), a Ray worker's, and wherever the kwargs or the environment already say.
    from trainers.config import RolloutConfig
    from trainers.sources import vllm_engine_kwargs

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    lockstep = RolloutConfig(env_id="AgentR1/FactChain-v0", backend="vllm", vllm_kwargs={"max_restarts": 2})
    assert vllm_engine_kwargs(lockstep, lone=True) == {"max_restarts": 2, "omp_threads_bind": "all"}
    assert vllm_engine_kwargs(lockstep, lone=False) == {"max_restarts": 2}
    assert lockstep.vllm_kwargs == {"max_restarts": 2}  # the config is not changed
    asynch = RolloutConfig(env_id="AgentR1/FactChain-v0", backend="vllm", mode="async")
    assert vllm_engine_kwargs(asynch, lone=True) == {}
    mine = RolloutConfig(env_id="AgentR1/FactChain-v0", backend="vllm", vllm_kwargs={"omp_threads_bind": "1"})
    assert vllm_engine_kwargs(mine, lone=True) == {"omp_threads_bind": "1"}
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert vllm_engine_kwargs(lockstep, lone=True) == {"max_restarts": 2}
