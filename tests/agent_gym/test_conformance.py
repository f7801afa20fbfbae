"""Conformance over every registered id: Gymnasium's checker, lockstep determinism, and the
token invariants of the env contract under fuzzed actions."""

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agent_gym
from tests.agent_gym.fuzz import fuzz_action

ENV_IDS = sorted(agent_gym.ENV_IDS)
FUZZ_STEPS = 10_000

_QA = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
# Ids whose defaults need data that CI does not have (the QA envs download the official files):
# point them at the project's own small fixtures. A bm25 index over them is built in memory.
_QA_DIRS = {"HotpotQA": "hotpotqa", "2WikiMultiHopQA": "2wikimultihopqa", "MuSiQue": "musique"}
CONFORMANCE_KWARGS: dict[str, dict] = {
    f"AgentR1/{name}{variant}-v0": {"data_path": str(_QA / d), "retriever_kwargs": {"cache": False}}
    for name, d in _QA_DIRS.items()
    for variant in ("", "-NaiveRAG")
}


# Ids whose env runs agent code in the sandbox (a class attribute ``uses_sandbox``): every python
# call or scored answer is a sandbox start (~0.1 s idle, ~0.5 s at load 15), so they get a reduced
# fuzz budget, and skip where the sandbox cannot run (no bubblewrap).
SANDBOX_FUZZ_STEPS = 100
SANDBOX_LOCKSTEP_STEPS = 20


def uses_sandbox(env_id: str) -> bool:
    from gymnasium.envs.registration import load_env_creator

    return bool(getattr(load_env_creator(agent_gym.ENV_IDS[env_id][0]), "uses_sandbox", False))


def budget(env_id: str, full: int, sandboxed: int) -> int:
    return sandboxed if uses_sandbox(env_id) else full


def make(env_id, **kw):
    if uses_sandbox(env_id):
        from agent_gym.sandbox import sandbox_available

        if not sandbox_available():
            pytest.skip("the sandbox does not run here: apt-get install -y bubblewrap (make setup does)")
    return gym.make(env_id, **{**CONFORMANCE_KWARGS.get(env_id, {}), **kw})


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env(env_id):
    env = make(env_id)
    check_env(env.unwrapped, skip_render_check=False)
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_two_envs_seeded_alike_stay_equal(env_id):
    a, b = make(env_id), make(env_id)
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    oa, ia = a.reset(seed=11)
    ob, ib = b.reset(seed=11)
    for _ in range(budget(env_id, 300, SANDBOX_LOCKSTEP_STEPS)):
        assert np.array_equal(oa["input_ids"], ob["input_ids"]) and ia == ib
        act_a, act_b = fuzz_action(a, rng_a, a.unwrapped.task), fuzz_action(b, rng_b, b.unwrapped.task)
        assert np.array_equal(act_a, act_b)
        oa, ra, ta, ua, ia = a.step(act_a)
        ob, rb, tb, ub, ib = b.step(act_b)
        assert (ra, ta, ua) == (rb, tb, ub)
        if ta or ua:
            assert ia["trajectory"] == ib["trajectory"]
            oa, ia = a.reset()
            ob, ib = b.reset()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_token_invariants_under_fuzzed_actions(env_id):
    env = make(env_id)
    u = env.unwrapped
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    prev = obs["input_ids"]
    assert len(prev) == info["prompt_len"]
    statuses = set()
    episodes = 0
    steps = budget(env_id, FUZZ_STEPS, SANDBOX_FUZZ_STEPS)
    for _ in range(steps):
        action = fuzz_action(env, rng, u.task)
        obs, reward, term, trunc, info = env.step(action)
        ids = obs["input_ids"]
        n, k = len(prev), len(action)
        # The new observation starts with the previous one followed by the action, verbatim.
        assert np.array_equal(ids[:n], prev) and np.array_equal(ids[n : n + k], action)
        assert info["action_span"] == [n, n + k]
        assert info["obs_span"][0] == n + k and info["obs_span"][1] == len(ids)
        # The agent's decoded text is exactly what was parsed.
        body = action[:-1] if k and action[-1] in u.stop_token_ids else action
        assert u.tokenizer.decode(body.tolist(), skip_special_tokens=False) == info["action_text"]
        assert info["closed_by_env"] == (k == 0 or action[-1] != u.eot_id)
        assert abs(sum(info["reward_components"].values()) - reward) < 1e-9
        statuses.update(c["status"] for c in info["tool_calls"])
        if term or trunc:
            traj = info["trajectory"]
            mask = np.asarray(traj.loss_mask)
            expect = np.zeros(len(ids), dtype=int)
            for s, e in traj.step_spans:
                expect[s:e] = 1
            # The loss mask is exactly the agent's tokens.
            assert np.array_equal(traj.token_ids, ids) and np.array_equal(mask, expect)
            assert len(traj.step_rewards) == info["turn"] == len(traj.step_spans)
            episodes += 1
            obs, info = env.reset()
        prev = obs["input_ids"]
    assert episodes > steps // 100
    # The fuzzer reached both successful and failed calls (an env without tools has no "ok").
    assert ({"ok", "parse_error"} if u.tools else {"parse_error"}) <= statuses, statuses


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_pickle_and_deepcopy_mid_episode(env_id):
    """Every registered id pickles and deep-copies (async vector envs and
    checkpointing need it), before reset and mid-episode; a copy then steps exactly like the
    original."""
    import copy
    import pickle

    env = make(env_id)
    pickle.loads(pickle.dumps(env))
    copy.deepcopy(env)
    env.reset(seed=3)
    rng = np.random.default_rng(3)
    env.step(fuzz_action(env, rng))  # may end the episode; the copies must agree either way
    copies = [pickle.loads(pickle.dumps(env)), copy.deepcopy(env)]
    u = env.unwrapped
    if u._done:
        for c in copies:
            c.reset(seed=4)
        env.reset(seed=4)
    action = u.encode_turn("<answer>x</answer>")
    ref = env.step(action)
    for c in copies:
        got = c.step(action)
        assert np.array_equal(got[0]["input_ids"], ref[0]["input_ids"]) and got[1:4] == ref[1:4]
        assert got[4]["trajectory"] == ref[4]["trajectory"]
    env.close()
