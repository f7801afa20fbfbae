"""Conformance over every multi-agent id (``agent_gym.MULTIAGENT_IDS``), the sibling of
test_conformance.py: per-agent token invariants under fuzzed actions, and pickle/deepcopy of the
Parallel and AEC views before reset and mid-episode."""

import copy
import pickle

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
import agent_gym  # noqa: E402
from tests.agent_gym.fuzz import fuzz_action  # noqa: E402

IDS = sorted(agent_gym.MULTIAGENT_IDS)
CYCLES = 300


def test_there_are_multiagent_ids():
    assert "AgentR1/FactChainTeam-v0" in IDS


@pytest.mark.parametrize("env_id", IDS)
def test_per_agent_token_invariants_under_fuzzed_actions(env_id):
    env = agent_gym.make_multiagent(env_id, parallel=True)
    rng = np.random.default_rng(0)
    obs, infos = env.reset(seed=0)
    prev = {a: o["input_ids"] for a, o in obs.items()}
    episodes, statuses = 0, set()
    for _ in range(CYCLES):
        actions = {a: fuzz_action(env.seats[a], rng, env.task) for a in env.agents}
        obs, rew, term, trunc, infos = env.step(actions)
        assert set(obs) == set(actions)
        for a, act in actions.items():
            ids, n, k = obs[a]["input_ids"], len(prev[a]), len(act)
            # each agent's observation is its previous one followed by its own action, verbatim
            assert np.array_equal(ids[:n], prev[a]) and np.array_equal(ids[n : n + k], act)
            assert infos[a]["action_span"] == [n, n + k]
            assert abs(sum(infos[a]["reward_components"].values()) - rew[a]) < 1e-9
            statuses.update(c["status"] for c in infos[a]["tool_calls"])
            if term[a] or trunc[a]:
                ep = infos[a]["trajectory"]
                expect = np.zeros(len(ids), dtype=int)
                for s, e in ep.step_spans:
                    expect[s:e] = 1
                assert np.array_equal(ep.token_ids, ids) and np.array_equal(ep.loss_mask, expect)
                assert abs(ep.reward - sum(ep.step_rewards)) < 1e-9
            prev[a] = ids
        if not env.agents:
            episodes += 1
            obs, infos = env.reset()
            prev = {a: o["input_ids"] for a, o in obs.items()}
    assert episodes > 20
    assert {"ok", "parse_error"} <= statuses, statuses


@pytest.mark.parametrize("env_id", IDS)
def test_every_seat_starts_with_its_own_observation(env_id):
    """A policy shared by the seats must be able to tell them apart from the first token on: with
    the defaults, and with one system prompt string shared by the seats (the seat's identity is
    added to it), with and without the tool schemas in the prompt."""
    for kwargs in (
        {},
        {"system_prompt": "Work together.", "tools_in_prompt": False},
        {"system_prompt": "Work together."},
    ):
        env = agent_gym.make_multiagent(env_id, parallel=True, **kwargs)
        for seed in range(3):
            obs, _ = env.reset(seed=seed)
            firsts = [obs[a]["input_ids"].tobytes() for a in env.possible_agents]
            assert len(set(firsts)) == len(firsts), (kwargs, seed)


@pytest.mark.parametrize("env_id", IDS)
def test_pettingzoo_max_cycles_test_with_the_defaults(env_id):
    from functools import partial
    from types import SimpleNamespace

    from pettingzoo.test import max_cycles_test

    max_cycles_test(
        SimpleNamespace(
            env=partial(agent_gym.make_multiagent, env_id),
            parallel_env=partial(agent_gym.make_multiagent, env_id, parallel=True),
        )
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_id", IDS)
def test_pickle_and_deepcopy_mid_episode(env_id):
    from envs.factchain_team import TeamOracle

    env = agent_gym.make_multiagent(env_id, parallel=True)
    pickle.loads(pickle.dumps(env))
    copy.deepcopy(env)
    aec = agent_gym.make_multiagent(env_id)
    pickle.loads(pickle.dumps(aec))
    env.reset(seed=3)
    oracle = TeamOracle(env)
    env.step({a: oracle.act(a) for a in env.agents})
    env.step({a: oracle.act(a) for a in env.agents})  # a message is in flight to agent_1
    copies = [pickle.loads(pickle.dumps(env)), copy.deepcopy(env)]
    rest = []
    probe = copy.deepcopy(env)
    probe_oracle = copy.deepcopy(oracle)
    probe_oracle.env = probe
    while probe.agents:
        actions = {a: probe_oracle.act(a) for a in probe.agents}
        rest.append(actions)
        probe.step(actions)
    # each copy (and the original) finishes the episode the same way, the message included
    results = []
    for e in [env] + copies:
        for actions in rest:
            _, _, _, _, infos = e.step(actions)
        results.append((e.team_answer, e.team_scores, [s.transcript for s in e.seats.values()]))
    assert results[0] == results[1] == results[2]
    assert results[0][1] == {"em": 1.0}
    # the copies are independent: the original's mailbox is not theirs
    assert (
        copies[0].mailbox is not env.mailbox
        and copies[0].seats["agent_1"].tools["receive"].mailbox is copies[0].mailbox
    )

    # the AEC view mid-episode
    aec.reset(seed=5)
    aec.step(aec.action_space(aec.agent_selection).sample())
    c = pickle.loads(pickle.dumps(aec))
    assert c.agent_selection == aec.agent_selection
