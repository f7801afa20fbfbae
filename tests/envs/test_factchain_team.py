"""AgentR1/FactChainTeam-v0: PettingZoo's own API, seed and max-cycles tests on the AEC and the
Parallel views, the scripted team's score against the silent and random baselines, exact
per-agent loss masks, and the message protocol."""

import functools
import types
import warnings

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
from pettingzoo.test import (  # noqa: E402
    api_test,
    max_cycles_test,
    parallel_api_test,
    parallel_seed_test,
    performance_benchmark,
    render_test,
    seed_test,
)

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


def test_pettingzoo_max_cycles_test_with_the_defaults():
    # Random token actions are failed calls; with the defaults a seat stays in the team until
    # max_cycles (its max_invalid_calls is max_cycles + 1), which is what the test checks.
    max_cycles_test(factchain_team)
    env = factchain_team.parallel_env(max_cycles=4)
    assert {s.max_invalid_calls for s in env.seats.values()} == {5}
    # the single-agent limit is still there when asked for: then a seat leaves after 3 failed turns
    with pytest.raises(AssertionError):
        max_cycles_test(
            types.SimpleNamespace(
                env=functools.partial(factchain_team.env, max_invalid_calls=3),
                parallel_env=functools.partial(factchain_team.parallel_env, max_invalid_calls=3),
            )
        )


@pytest.mark.timeout(120)
def test_pettingzoo_render_test_and_performance_benchmark():
    """The rest of PettingZoo's test set that applies. Not applicable: state_test (needs a global
    state(); the seats observe only their own conversations), save_obs_test (image observations),
    manual_control_test (keyboard games); bombardment_test fails on PettingZoo 1.27's own
    example env too (it checks the return value of AEC step, which is None). performance_benchmark
    steps random actions for 5 s through many resets; its figures are printed, not asserted."""
    render_test(factchain_team.env)
    render_test(factchain_team.env, custom_tests={"ansi": lambda text: "===== agent_1 =====" in text})
    performance_benchmark(factchain_team.env())


CONFIG = "configs/factchain_team_grpo.yaml"


def test_the_training_config_gives_each_seat_its_identity():
    """The config's shared system_prompt used to replace the per-seat prompt: both seats started
    with the same ids, so the shared policy could not know its seat."""
    import yaml

    from trainers.config import load_config

    cfg = load_config(CONFIG, [])
    kw = {**cfg.rollout.env_kwargs, **cfg.eval.env_kwargs}
    assert isinstance(yaml.safe_load(open(CONFIG))["rollout"]["env_kwargs"]["system_prompt"], str)
    env = agent_gym.make_multiagent(cfg.rollout.env_id, parallel=True, **kw)
    obs, _ = env.reset(seed=0, options={"task_index": 5})
    first = {a: o["input_ids"] for a, o in obs.items()}
    assert not np.array_equal(first["agent_0"], first["agent_1"])
    for a, other in (("agent_0", "agent_1"), ("agent_1", "agent_0")):
        text = env.tokenizer.decode(first[a].tolist())
        assert kw["system_prompt"] in text  # the config's instructions, and then who this seat is
        assert f"You are {a}, one of a team of 2 agents; your teammate is {other}." in text


def test_every_way_to_make_the_seats_indistinguishable_is_refused():
    compact = {"tools_in_prompt": False, "split": "test"}
    # a shared string (even an empty one) is followed by the seat's identity: the seats differ
    for prompt in ("Answer the question.", ""):
        env = factchain_team.parallel_env(system_prompt=prompt, **compact)
        obs, _ = env.reset(seed=1)
        assert not np.array_equal(obs["agent_0"]["input_ids"], obs["agent_1"]["input_ids"])
    # a dict of prompts is used as given: identical ones are refused when the episode would start
    env = factchain_team.parallel_env(system_prompt={"agent_0": "Same.", "agent_1": "Same."}, **compact)
    with pytest.raises(
        ValueError,
        match=r"agents 'agent_0' and 'agent_1' start with the same observation "
        r"\(\d+ identical token ids\).*Give each seat its own system prompt",
    ):
        env.reset(seed=0)
    assert env.agents == []
    with pytest.raises(RuntimeError, match="call reset"):
        env.step({})
    # three seats, two of them alike: the pair is named
    env = factchain_team.parallel_env(
        num_agents=3, system_prompt={"agent_0": "A.", "agent_1": "B.", "agent_2": "B."}, **compact
    )
    with pytest.raises(ValueError, match="agents 'agent_1' and 'agent_2'"):
        env.reset(seed=0)

    # a subclass whose opening messages leave the seat out: refused the same way
    class Anonymous(factchain_team.FactChainTeamEnv):
        def seat_messages(self, agent, system_prompt, task):
            return [{"role": "system", "content": "Solve it as a team."}, {"role": "user", "content": task["question"]}]

    with pytest.raises(ValueError, match="start with the same observation"):
        Anonymous(**compact).reset(seed=0)
    # with the tool schemas in the prompt the seats already differ (send's recipients): accepted
    env = factchain_team.parallel_env(system_prompt={"agent_0": "Same.", "agent_1": "Same."}, split="test")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="system_prompts must be a string"):
        factchain_team.parallel_env(system_prompt=["Same."])


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

    _, _, _, _, infos = penv.step(
        {
            "agent_0": a0.encode_turn(lookup_turn(task["path"][1], task["chain"][1])),
            "agent_1": a1.encode_turn(lookup_turn(task["path"][0], task["chain"][0])),
        }
    )
    for a in ("agent_0", "agent_1"):
        assert [c["status"] for c in infos[a]["tool_calls"]] == ["tool_error"]
        assert "not in your part" in penv.seats[a].transcript[-1][1]


def test_messages_arrive_next_cycle_and_only_to_the_recipient(penv):
    import json

    def call(name, **args):
        return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"

    penv.reset(options={"task_index": 0})
    a0, a1 = penv.seats["agent_0"], penv.seats["agent_1"]
    penv.step(
        {
            "agent_0": a0.encode_turn(call("send", to="agent_1", text="hello")),
            "agent_1": a1.encode_turn(call("receive")),
        }
    )
    assert a1.transcript[-1] == ("tool", "No new messages.")
    penv.step({"agent_0": a0.encode_turn(call("receive")), "agent_1": a1.encode_turn(call("receive"))})
    assert a1.transcript[-1] == ("tool", "agent_0: hello")
    assert a0.transcript[-1] == ("tool", "No new messages.")
    # a message to oneself is not a valid recipient
    _, _, _, _, infos = penv.step(
        {"agent_0": a0.encode_turn(call("send", to="agent_0", text="x")), "agent_1": a1.encode_turn(call("receive"))}
    )
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
    assert (
        eps["agent_0"].token_ids[: eps["agent_0"].prompt_len] != eps["agent_1"].token_ids[: eps["agent_1"].prompt_len]
    )


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
    for key, value in (("format_gate", "em"), ("process_needs_answer", True), ("call_in_answer", 0.0)):
        with pytest.raises(ValueError, match=f"rewards.{key} is for single-agent envs"):
            factchain_team.FactChainTeamEnv(rewards={key: value})
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


def test_an_agent_that_leaves_on_its_own_leaves_the_others_playing():
    """With the single-agent limit asked for (max_invalid_calls=2), agent_1's failed turns end its
    episode alone: agent_0 keeps acting, and the team's answer pays agent_0 only."""
    env = agent_gym.make_multiagent(ID, parallel=True, split="test", max_invalid_calls=2)
    env.reset(options={"task_index": 2})
    task, a0, a1 = env.task, env.seats["agent_0"], env.seats["agent_1"]
    from envs.factchain import lookup_turn

    _, _, term, trunc, infos = env.step(
        {
            "agent_0": a0.encode_turn(lookup_turn(task["path"][0], task["chain"][0])),
            "agent_1": a1.encode_turn("no idea"),
        }
    )
    assert env.agents == ["agent_0", "agent_1"] and infos["agent_0"]["tool_calls"][0]["status"] == "ok"
    _, _, term, trunc, infos = env.step(
        {
            "agent_0": a0.encode_turn(lookup_turn(task["path"][0], task["chain"][0])),
            "agent_1": a1.encode_turn("still nothing"),
        }
    )
    assert trunc["agent_1"] and infos["agent_1"]["truncation_reason"] == "invalid_calls"
    assert infos["agent_1"]["trajectory"].truncation_reason == "invalid_calls" and not term["agent_0"]
    assert env.agents == ["agent_0"]
    _, rew, term, trunc, infos = env.step({"agent_0": a0.encode_turn(f"<answer>{task['answer']}</answer>")})
    assert term == {"agent_0": True} and rew == {"agent_0": 1.0} and env.agents == []
    assert env.team_scores == {"em": 1.0} and infos["agent_0"]["trajectory"].success


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["second_seat", "on_reset", "bad_task_index"])
def test_a_failed_team_reset_changes_nothing_and_step_refuses(where):
    # A team reset is transactional like a single env's: a failure anywhere (here the second
    # seat's own reset, after the first seat had reset; on_reset; a bad option) leaves every seat,
    # the mailbox, the team's attributes and its RNG as they were, and step refuses until a reset
    # succeeds. Before, the first seat was left in the new episode.
    env = agent_gym.make_multiagent(ID, parallel=True, split="test")
    obs, _ = env.reset(seed=3, options={"task_index": 0})
    first, second = env.possible_agents
    env.step({a: env.seats[a].encode_turn("thinking") for a in env.agents})
    before = {a: list(env.seats[a]._ids) for a in env.possible_agents}
    state = (
        env.task_index,
        env.cycle,
        list(env.agents),
        list(env.mailbox.log),
        env.mailbox.cycle,
        env.np_random.bit_generator.state,
    )
    if where == "second_seat":

        def boom(task):
            raise RuntimeError("seat broke")

        env.seats[second].task_messages = boom
        options, err = {"task_index": 1}, RuntimeError
    elif where == "on_reset":
        env.on_reset = lambda task: (_ for _ in ()).throw(ValueError("on_reset broke"))
        options, err = {"task_index": 1}, ValueError
    else:
        options, err = {"task_index": 10**9}, ValueError
    with pytest.raises(err):
        env.reset(options=options)
    assert {a: list(env.seats[a]._ids) for a in env.possible_agents} == before
    assert (
        env.task_index,
        env.cycle,
        list(env.agents),
        list(env.mailbox.log),
        env.mailbox.cycle,
        env.np_random.bit_generator.state,
    ) == state
    with pytest.raises(RuntimeError, match="reset"):
        env.step({a: env.seats[a].encode_turn("x") for a in env.agents})
    for a in env.possible_agents:  # the seats refuse too
        with pytest.raises(RuntimeError, match="reset"):
            env.seats[a].check_action([1])
    if where == "second_seat":
        del env.seats[second].task_messages
    else:
        env.__dict__.pop("on_reset", None)
    obs, _ = env.reset(options={"task_index": 1})  # a good reset: the team plays again
    out = env.step({a: env.seats[a].encode_turn("thinking") for a in env.agents})
    assert set(out[0]) == set(env.possible_agents)
