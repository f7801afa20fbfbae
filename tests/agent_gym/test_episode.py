"""The env -> trainer seam: ``info["trajectory"]`` is one typed, picklable ``Episode``, and success
is the env's decision (``ToolEnv.is_success``), which the trainer's metrics follow."""

from __future__ import annotations

import copy
import json
import pickle
from dataclasses import asdict

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.episode import Episode
from tests.agent_gym.test_env import TinyEnv, act, call, echo


def test_episode_is_typed_and_its_totals_match_the_steps():
    env = TinyEnv(tools=[echo], rewards={"call_ok": 0.2, "call_invalid": -0.3, "no_action": -0.05, "format": 0.1})
    env.reset(options={"task_index": 1})
    infos = [env.step(act(env, call("echo", text="x") + call("nope")))[-1], env.step(act(env, "hmm"))[-1]]
    assert all("trajectory" not in i for i in infos)  # only the last step carries it
    *_, term, trunc, info = env.step(act(env, "<answer>yo</answer>"))
    ep = info["trajectory"]
    assert isinstance(ep, Episode) and term and not trunc
    assert ep.step_call_statuses == [["ok", "unknown_tool"], [], []]
    assert ep.call_statuses == {"ok": 1, "unknown_tool": 1}
    assert ep.step_reward_components == [
        infos[0]["reward_components"],
        infos[1]["reward_components"],
        info["reward_components"],
    ]
    assert (
        ep.reward == pytest.approx(sum(ep.step_rewards)) == pytest.approx(-0.1 - 0.05 + 1.1)
    )  # the F1 score has weight 0 by default
    assert (ep.answer, ep.answer_scores, ep.success, ep.truncation_reason, ep.turns, ep.answered) == (
        "yo",
        {"em": 1.0, "f1": 0.5},
        True,
        None,
        3,
        True,
    )
    assert (ep.task_id, ep.task_index, ep.prompt_len) == ("t1", 1, env.prompt_len)
    # Plain values only: it pickles (async vector envs), deep-copies and serializes to JSON.
    assert pickle.loads(pickle.dumps(ep)) == ep and copy.deepcopy(ep) == ep
    assert json.loads(json.dumps(asdict(ep)))["token_ids"] == ep.token_ids


def test_truncated_episode_is_not_a_success_and_says_why():
    env = TinyEnv(tools=[echo], max_turns=2)
    env.reset(options={"task_index": 0})
    env.step(act(env, "thinking"))
    *_, term, trunc, info = env.step(act(env, "still thinking"))
    ep = info["trajectory"]
    assert trunc and not term
    assert (ep.answer, ep.answer_scores, ep.success, ep.truncation_reason) == (None, {}, False, "max_turns")


class LenientEnv(TinyEnv):
    """Judges answers by F1, not exact match."""

    def is_success(self, answer_scores, task):
        return answer_scores["f1"] >= 0.5


def test_the_env_decides_success_and_the_trainer_follows():
    from trainers.rollout import summarize

    episodes = []
    for cls in (TinyEnv, LenientEnv):
        env = cls(tools=[echo])
        env.reset(options={"task_index": 0})
        episodes.append(env.step(act(env, "<answer>not hi</answer>"))[-1]["trajectory"])
    strict, lenient = episodes
    assert strict.answer_scores == lenient.answer_scores == {"em": 0.0, "f1": 0.5}
    assert not strict.success and lenient.success
    assert summarize([strict])["rollout/success_rate"] == 0.0
    assert summarize([lenient])["rollout/success_rate"] == 1.0
    m = summarize(episodes)
    assert m["rollout/em"] == 0.0 and m["rollout/f1"] == 0.5  # every score the env reports, by its own name


@pytest.mark.timeout(60)
def test_factchain_episodes_cross_processes():
    """An async vector env sends each Episode back through a pipe (pickle)."""
    envs = gym.make_vec(
        "AgentR1/FactChain-v0", num_envs=2, vectorization_mode="async", vector_kwargs={"shared_memory": False}
    )
    try:
        envs.reset(seed=0)
        u = gym.make("AgentR1/FactChain-v0").unwrapped
        answer = u.encode_turn("<answer>x</answer>")
        *_, term, _, infos = envs.step([answer, answer])
        assert term.all()
        eps = infos["trajectory"]
        assert all(isinstance(e, Episode) and e.answer == "x" and not e.success for e in eps)
    finally:
        envs.close()


def test_gymnasium_episode_statistics_wrapper_keeps_the_episode():
    """``info["episode"]`` belongs to Gymnasium's RecordEpisodeStatistics; the env's record is
    ``info["trajectory"]``, so the two coexist."""
    env = gym.wrappers.RecordEpisodeStatistics(TinyEnv(tools=[echo]))
    env.reset(options={"task_index": 0})
    *_, info = env.step(act(env, "<answer>hi</answer>"))
    assert isinstance(info["trajectory"], Episode) and info["trajectory"].success
    assert info["episode"]["r"] == pytest.approx(info["trajectory"].reward) and info["episode"]["l"] == 1
