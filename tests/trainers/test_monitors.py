"""The collapse monitors (``monitor/*`` of ``trainers.rollout.summarize``) by hand, and the env's
``Episode.step_calls`` they read."""

import dataclasses

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401
from agent_gym.episode import Episode
from trainers.rollout import summarize

pytestmark = pytest.mark.timeout(120)


def _ep(spans, calls, statuses, answer, reason):
    return Episode(
        token_ids=[0] * 40,
        loss_mask=[0] * 40,
        prompt_len=2,
        step_spans=spans,
        step_rewards=[0.0] * len(spans),
        step_reward_components=[{}] * len(spans),
        step_call_statuses=statuses,
        task_id="t",
        task_index=0,
        answer=answer,
        answer_scores={},
        success=False,
        truncation_reason=reason,
        step_calls=calls,
    )


def test_monitors_by_hand():
    q = 'search({"query": "a"})'
    eps = [
        # the same successful search twice (one repeat), then an answer: 3 turns of 4, 5 and 2 tokens
        _ep([[2, 6], [7, 12], [13, 15]], [[q], [q], []], [["ok"], ["ok"], []], "x", None),
        # an answer with no call at all (1 turn of 3 tokens)
        _ep([[2, 5]], [[]], [[]], "y", None),
        # a failed call, then the same call failing again (not a repeat: only successful calls
        # count), then cut at the context: 2 turns of 8 and 0 tokens
        _ep([[2, 10], [11, 11]], [[q], [q]], [["bad_arguments"], ["bad_arguments"]], None, "context"),
        # a repeat of a call that failed first, then succeeded twice (one repeat), cut by max_turns
        _ep([[2, 3], [4, 5], [6, 7]], [[q], [q], [q]], [["tool_error"], ["ok"], ["ok"]], None, "max_turns"),
    ]
    m = summarize(eps)
    assert m["monitor/calls_per_episode"] == (2 + 0 + 2 + 3) / 4
    assert m["monitor/repeated_calls_per_episode"] == (1 + 0 + 0 + 1) / 4
    assert m["monitor/answer_without_call_rate"] == 1 / 4
    assert m["monitor/empty_answer_rate"] == 0.0
    empty = summarize([*eps, _ep([[2, 4]], [[]], [[]], " ", None), _ep([[2, 4]], [[]], [[]], "", None)])
    assert empty["monitor/empty_answer_rate"] == 2 / 6  # a blank answer counts; no answer (None) does not
    assert m["monitor/answer_holds_call_rate"] == 0.0
    calls = [  # a call's body in the answer (a scaffold's answer slot), each format's tag, and a near miss
        '[{"name": "search", "arguments": {"query": "Jaws"}}]',
        '<tool_call>{"name": "search"}</tool_call>',
        "<search>Jaws</search>",
        'the "name" of the film, "arguments" aside',
    ]
    held = summarize([*eps, *(_ep([[2, 4]], [[]], [[]], a, None) for a in calls)])
    assert held["monitor/answer_holds_call_rate"] == 3 / 8
    # a call in a user's own format, which only the env that parsed it knows (Episode.answer_holds_call)
    own = dataclasses.replace(_ep([[2, 4]], [[]], [[]], "!search Jaws", None), answer_holds_call=True)
    assert summarize([*eps, own])["monitor/answer_holds_call_rate"] == 1 / 5
    assert summarize([*eps, dataclasses.replace(own, answer_holds_call=False)])["monitor/answer_holds_call_rate"] == 0
    assert m["monitor/length_cut_rate"] == 2 / 4
    assert m["monitor/reply_tokens_mean"] == pytest.approx((4 + 5 + 2 + 3 + 8 + 0 + 1 + 1 + 1) / 9)
    assert m["monitor/reply_tokens_max"] == 8.0


def test_the_env_records_each_calls_signature():
    env = gym.make("AgentR1/FactChain-v0", tools_in_prompt=False).unwrapped
    env.reset(seed=0, options={"task_index": 3})
    turns = env.demonstration(env.task)
    calls = []
    for text in turns:
        *_, term, trunc, info = env.step(env.encode_turn(text))
        calls += [
            f"{c['name']}({__import__('json').dumps(c['arguments'], sort_keys=True)})" for c in info["tool_calls"]
        ]
        if term or trunc:
            ep = info["trajectory"]
            break
    assert [c for step in ep.step_calls for c in step] == calls and len(calls) >= 2
    assert [len(c) for c in ep.step_calls] == [len(s) for s in ep.step_call_statuses]
    assert summarize([ep])["monitor/repeated_calls_per_episode"] == 0.0
