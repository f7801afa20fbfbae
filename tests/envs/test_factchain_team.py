"""AgentR1/FactChainTeam-v0: PettingZoo's own API, seed and max-cycles tests on the AEC and the
Parallel views, the scripted team's score against the silent and random baselines, exact
per-agent loss masks, and the message protocol."""

import functools
import types
import warnings

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
from pettingzoo.test import api_test, max_cycles_test, parallel_api_test, parallel_seed_test, seed_test  # noqa: E402

import agent_gym  # noqa: E402
from envs import factchain_team  # noqa: E402
from envs.factchain_team import TeamOracle, play_parallel  # noqa: E402

ID = "AgentR1/FactChainTeam-v0"
N_TASKS = 120


@pytest.fixture(scope="module")
def penv():
    return agent_gym.make_multiagent(ID, parallel=True, split="test")


def test_registered_and_made_as_aec_and_parallel():
    from pettingzoo import AECEnv, ParallelEnv

    assert ID in agent_gym.MULTIAGENT_IDS
    aec = agent_gym.make_multiagent(ID)
    par = agent_gym.make_multiagent(ID, parallel=True)
    assert isinstance(aec, AECEnv) and isinstance(par, ParallelEnv)
    assert isinstance(aec.unwrapped, factchain_team.FactChainTeamEnv)
    assert par.possible_agents == ["agent_0", "agent_1"]
    with pytest.raises(ValueError, match="unknown multi-agent id"):
        agent_gym.make_multiagent("AgentR1/NoSuchTeam-v0")


def test_pettingzoo_api_test_aec():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(agent_gym.make_multiagent(ID), num_cycles=40)


def test_pettingzoo_parallel_api_test():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(agent_gym.make_multiagent(ID, parallel=True), num_cycles=40)


def test_pettingzoo_seed_tests():
    seed_test(functools.partial(agent_gym.make_multiagent, ID), num_cycles=20)
    parallel_seed_test(functools.partial(agent_gym.make_multiagent, ID, parallel=True), num_cycles=20)


def test_pettingzoo_max_cycles_test():
    # Random token actions are invalid calls: a seat drops out after max_invalid_calls of them, so
    # the test (4 cycles) runs with a limit above it; max_cycles is what ends the episode.
    mod = types.SimpleNamespace(env=functools.partial(factchain_team.env, max_invalid_calls=10),
                                parallel_env=functools.partial(factchain_team.parallel_env, max_invalid_calls=10))
    max_cycles_test(mod)


def _rate(env, policy_for, n=N_TASKS):
    wins, cycles = 0, []
    for k in range(n):
        policy = policy_for(k)
        r = play_parallel(env, policy, k)
        wins += r["success"]
        cycles.append(r["cycles"])
    return wins / n, float(np.mean(cycles))


def test_oracle_solves_every_task_and_baselines_do_not(penv):
    oracle = TeamOracle(penv)
    rate, cycles = _rate(penv, lambda k: (oracle.reset(), lambda a, obs: oracle.act(a))[1])
    assert rate == 1.0 and cycles == 5.0  # 2 hops: lookup, send, receive, lookup, answer
    silent = TeamOracle(penv, silent=True, seed=0)
    s_rate, _ = _rate(penv, lambda k: (silent.reset(), lambda a, obs: silent.act(a))[1])
    assert s_rate < 0.1  # a guess among 32 entities
    space = penv.action_space("agent_0")
    space.seed(0)
    r_rate, _ = _rate(penv, lambda k: lambda a, obs: space.sample())
    assert r_rate == 0.0
    print(f"FactChainTeam test split: oracle {rate} ({cycles} cycles), silent {s_rate}, random {r_rate}")


def test_without_messages_the_second_hop_is_unknowable(penv):
    """The split is real: agent_1 cannot look up the first hop, agent_0 cannot look up the second."""
    penv.reset(options={"task_index": 3})
    task = penv.task
    a0, a1 = penv.seats["agent_0"], penv.seats["agent_1"]
    from envs.factchain import lookup_turn

    _, _, _, _, infos = penv.step({"agent_0": a0.encode_turn(lookup_turn(task["path"][1], task["chain"][1])),
                                   "agent_1": a1.encode_turn(lookup_turn(task["path"][0], task["chain"][0]))})
    for a in ("agent_0", "agent_1"):
        assert [c["status"] for c in infos[a]["tool_calls"]] == ["tool_error"]
        assert "not in your part" in penv.seats[a].transcript[-1][1]


def test_messages_arrive_next_cycle_and_only_to_the_recipient(penv):
    import json

    def call(name, **args):
        return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"

    penv.reset(options={"task_index": 0})
    a0, a1 = penv.seats["agent_0"], penv.seats["agent_1"]
    penv.step({"agent_0": a0.encode_turn(call("send", to="agent_1", text="hello")),
               "agent_1": a1.encode_turn(call("receive"))})
    assert a1.transcript[-1] == ("tool", "No new messages.")
    penv.step({"agent_0": a0.encode_turn(call("receive")), "agent_1": a1.encode_turn(call("receive"))})
    assert a1.transcript[-1] == ("tool", "agent_0: hello")
    assert a0.transcript[-1] == ("tool", "No new messages.")
    # a message to oneself is not a valid recipient
    _, _, _, _, infos = penv.step({"agent_0": a0.encode_turn(call("send", to="agent_0", text="x")),
                                   "agent_1": a1.encode_turn(call("receive"))})
    assert infos["agent_0"]["tool_calls"][0]["status"] == "bad_arguments"


def test_per_agent_loss_masks_are_exactly_each_agents_turns(penv):
    oracle = TeamOracle(penv)
    obs, _ = penv.reset(options={"task_index": 7})
    sent: dict[str, list[list[int]]] = {a: [] for a in penv.possible_agents}
    eps = {}
    while penv.agents:
        actions = {a: oracle.act(a) for a in penv.agents}
        for a, act in actions.items():
            sent[a].append(act.tolist())
        obs, rew, term, trunc, infos = penv.step(actions)
        for a in term:
            if term[a] or trunc[a]:
                eps[a] = infos[a]["trajectory"]
                assert np.array_equal(eps[a].token_ids, obs[a]["input_ids"])
    assert set(eps) == {"agent_0", "agent_1"}
    tok = penv.tokenizer
    for a, ep in eps.items():
        mask = np.asarray(ep.loss_mask)
        expect = np.zeros(len(ep.token_ids), dtype=int)
        for s, e in ep.step_spans:
            expect[s:e] = 1
        assert np.array_equal(mask, expect)
        # the masked ids are exactly this agent's actions, in order, and nobody else's
        ids = np.asarray(ep.token_ids)
        assert [ids[s:e].tolist() for s, e in ep.step_spans] == sent[a]
        assert ep.success and ep.answer == penv.task["answer"] and ep.reward == 1.0
        masked = tok.decode(ids[mask == 1].tolist())
        if a == "agent_0":
            assert '"send"' in masked and penv.task["path"][0] in masked
        else:
            assert penv.task["path"][1] in masked and "<answer>" in masked
    # The two contexts differ: each agent sees its own turns and tool results only.
    assert eps["agent_0"].token_ids[:eps["agent_0"].prompt_len] != eps["agent_1"].token_ids[:eps["agent_1"].prompt_len]


def test_aec_and_parallel_agree():
    par = agent_gym.make_multiagent(ID, parallel=True)
    aec = agent_gym.make_multiagent(ID)
    o_par, o_aec = TeamOracle(par), TeamOracle(aec)
    res_par = play_parallel(par, lambda a, obs: o_par.act(a), 11)
    aec.reset(options={"task_index": 11})
    eps = {}
    for agent in aec.agent_iter():
        obs, rew, term, trunc, info = aec.last()
        if term or trunc:
            eps[agent] = info["trajectory"]
            aec.step(None)
        else:
            aec.step(o_aec.act(agent))
    assert eps == res_par["episodes"]


def test_bad_input_names_the_problem(penv):
    penv.reset(options={"task_index": 0})
    ok = penv.seats["agent_0"].encode_turn("x")
    with pytest.raises(ValueError, match=r"no action for live agent\(s\) \['agent_1'\]"):
        penv.step({"agent_0": ok})
    with pytest.raises(ValueError, match="not live"):
        penv.step({"agent_0": ok, "agent_1": ok, "agent_9": ok})
    with pytest.raises(ValueError, match="agent 'agent_1'"):
        penv.step({"agent_0": ok, "agent_1": np.array([1.5])})
    assert penv.cycle == 0 and len(penv.seats["agent_0"].step_spans) == 0  # nothing was stepped
    with pytest.warns(UserWarning, match="ignoring unknown option"):
        penv.reset(options={"bogus": 1})
    with pytest.raises(ValueError, match="missing key"):
        penv.reset(options={"task": {"question": "q", "answer": "a"}})
    with pytest.raises(ValueError, match="num_agents"):
        factchain_team.FactChainTeamEnv(num_agents=1)
    with pytest.raises(RuntimeError, match="call reset"):
        factchain_team.parallel_env().step({})


def test_three_agents_pass_the_chain_around():
    env = agent_gym.make_multiagent(ID, parallel=True, num_agents=3, num_hops=3, split="test")
    oracle = TeamOracle(env)
    wins = 0
    for k in range(10):
        oracle.reset()
        wins += play_parallel(env, lambda a, obs: oracle.act(a), k)["success"]
    assert wins == 10
