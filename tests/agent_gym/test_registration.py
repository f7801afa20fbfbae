"""Env ids are registered by their own modules; a taken id cannot be re-registered differently."""

from __future__ import annotations

import importlib

import gymnasium as gym
import pytest

import agent_gym
from agent_gym.registration import ENV_IDS, MULTIAGENT_IDS, register_env, register_multiagent


def test_each_env_module_registers_its_own_ids():
    assert len(ENV_IDS) == 10  # FactChain, 3 QA, 3 NaiveRAG, Math, HumanEval, MBPP
    for env_id, (entry_point, _) in ENV_IDS.items():
        module, cls = entry_point.split(":")
        mod = importlib.import_module(module)
        assert module.startswith("envs.") and hasattr(mod, cls)
        assert gym.spec(env_id).entry_point == entry_point
    importlib.reload(importlib.import_module("envs.factchain"))  # importing a module again is a no-op
    assert ENV_IDS["AgentR1/FactChain-v0"][0] == "envs.factchain:FactChainEnv"


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
