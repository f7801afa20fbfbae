"""Env ids are registered from one table of entry-point strings; a taken id cannot be re-registered differently."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import gymnasium as gym
import pytest

import agent_gym
from agent_gym.builtin_envs import BUILTIN_ENVS, register_builtin_envs
from agent_gym.registration import ENV_IDS, MULTIAGENT_IDS, register_env, register_multiagent


def test_the_builtin_table_registers_every_id_as_an_entry_point_string():
    assert len(BUILTIN_ENVS) == 10  # FactChain, 3 QA, 3 NaiveRAG, Math, HumanEval, MBPP
    for env_id, (entry_point, kwargs) in BUILTIN_ENVS.items():
        assert ENV_IDS[env_id] == (entry_point, kwargs)
        spec = gym.spec(env_id)
        assert spec.entry_point == entry_point and isinstance(spec.entry_point, str)
        assert spec.vector_entry_point is not None
        module, cls = entry_point.split(":")
        assert module.startswith("envs.") and hasattr(importlib.import_module(module), cls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overriding environment" warning from Gymnasium
        register_builtin_envs()  # registering the table again is a no-op
        importlib.reload(importlib.import_module("envs.factchain"))  # so is importing a module again
    assert ENV_IDS["AgentR1/FactChain-v0"][0] == "envs.factchain:FactChainEnv"


@pytest.mark.timeout(120)
def test_import_agent_gym_imports_no_env_module_and_gym_make_works():
    """``import agent_gym`` alone registers the ids without importing ``envs`` (the framework does
    not import its users), and ``gym.make`` imports the env's module when it is asked for."""
    code = (
        "import sys, gymnasium as gym, agent_gym\n"
        "before = sorted(m for m in sys.modules if m == 'envs' or m.startswith(('envs.', 'trainers', 'torch')))\n"
        "env = gym.make('AgentR1/FactChain-v0')\n"
        "vec = gym.make_vec('AgentR1/FactChain-v0', 2, vectorization_mode='vector_entry_point')\n"
        "print(before, type(env.unwrapped).__module__, type(vec).__name__, 'envs.hotpotqa' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "envs.factchain", "ToolVectorEnv", "False"], out.stdout


@pytest.fixture
def scratch_id():
    env_id = "AgentR1Test/Scratch-v0"
    yield env_id
    ENV_IDS.pop(env_id, None)
    gym.registry.pop(env_id, None)


def test_taken_id_with_a_different_entry_raises(scratch_id):
    register_env(scratch_id, "envs.factchain:FactChainEnv", {"num_hops": 3})
    register_env(scratch_id, "envs.factchain:FactChainEnv", {"num_hops": 3})  # the same entry: a no-op
    assert gym.make(scratch_id).unwrapped.num_hops == 3
    with pytest.raises(ValueError, match="already registered to 'envs.factchain:FactChainEnv'"):
        register_env(scratch_id, "envs.hotpotqa:HotpotQAEnv")
    with pytest.raises(ValueError, match="with kwargs"):
        register_env(scratch_id, "envs.factchain:FactChainEnv", {"num_hops": 2})
    with pytest.raises(ValueError, match="already registered"):
        register_env("AgentR1/FactChain-v0", "envs.musique:MuSiQueEnv")
    assert agent_gym.ENV_IDS is ENV_IDS


@pytest.fixture
def scratch_multiagent_id():
    env_id = "AgentR1Test/ScratchTeam-v0"
    yield env_id
    MULTIAGENT_IDS.pop(env_id, None)


def test_taken_multiagent_id_with_a_different_entry_raises(scratch_multiagent_id):
    team = "envs.factchain_team:FactChainTeamEnv"
    register_multiagent(scratch_multiagent_id, team, {"num_hops": 2})
    register_multiagent(scratch_multiagent_id, team, {"num_hops": 2})  # the same entry: a no-op
    assert MULTIAGENT_IDS[scratch_multiagent_id] == (team, {"num_hops": 2})
    with pytest.raises(ValueError, match=f"multi-agent id '{scratch_multiagent_id}' is already registered to '{team}'"):
        register_multiagent(scratch_multiagent_id, "envs.factchain:FactChainEnv")
    with pytest.raises(ValueError, match="with kwargs"):
        register_multiagent(scratch_multiagent_id, team, {"num_hops": 3})
    assert MULTIAGENT_IDS[scratch_multiagent_id] == (team, {"num_hops": 2})
    # The two registries share one id space: neither takes the other's ids.
    with pytest.raises(ValueError, match="is a single-agent"):
        register_multiagent("AgentR1/FactChain-v0", team)
    with pytest.raises(ValueError, match="is a multi-agent"):
        register_env(scratch_multiagent_id, "envs.factchain:FactChainEnv")
    assert scratch_multiagent_id not in ENV_IDS and scratch_multiagent_id not in gym.registry
