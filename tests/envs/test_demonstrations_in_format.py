"""Scripted demonstrations are written in the env's own tool format.

Before, every env's oracle wrote hermes calls whatever ``tool_format`` said: an SFT warm start in
``smollm2`` (a JSON list inside ``<tool_call>``) then taught a layout the system prompt did not
show, and FactChain's oracle under any format other than hermes or smollm2 failed. Now
``ToolCallFormat.call_text`` writes a call, and each format's ``parse`` reads it back."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.formats import get_format, list_formats
from trainers.sft import demonstrations, play

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
CALLS = [
    ("lookup", {"entity": "Karimel", "relation": "rival"}),
    ("search", {"query": 'the "Nile" <b>'}),
    ("python", {"code": "print(1 + 1)\n"}),
    ("send", {"to": "agent_1", "text": "hop 1: Dorsil"}),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fmt", list_formats())
@pytest.mark.parametrize("name,args", CALLS, ids=[c[0] for c in CALLS])
def test_every_format_reads_back_the_call_it_writes(fmt, name, args):
    f = get_format(fmt)
    try:
        text = f.call_text(name, args)
    except ValueError as e:  # a format that cannot express this call says so
        assert fmt == "search_r1" and name != "search", (fmt, name, e)
        return
    turn = f.parse(text)
    assert [(c.name, c.arguments, c.error) for c in turn.calls] == [(name, args, None)], text
    assert turn.answer is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["hermes", "smollm2"])
def test_factchain_demonstrations_use_the_env_format_and_succeed(fmt):
    env = gym.make("AgentR1/FactChain-v0", tool_format=fmt).unwrapped
    call = get_format(fmt).call_text("lookup", {"entity": "E", "relation": "r"})
    opening = call[: call.index('"name"')]  # '<tool_call>{' or '<tool_call>[{'
    for policy in ("oracle", "reversed", "protocol"):
        (ep,) = demonstrations(env, [3], policy)
        env.reset(options={"task_index": 3})
        turns = (
            env.demonstration(env.task)
            if policy == "oracle"
            else getattr(env, f"{policy}_demonstration")(env.task, np.random.default_rng(0))
        )
        assert all(t.startswith(opening) for t in turns[:-1]), (fmt, policy, turns)
        assert ep.token_ids, (fmt, policy)
    ep = play(env, 5, env.demonstration)
    assert ep.success and ep.reward == 1.0, ep


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["hermes", "smollm2", "search_r1"])
def test_qa_oracle_in_each_format_succeeds(fmt):
    env = gym.make("AgentR1/2WikiMultiHopQA-v0", data_path=str(FIXTURES / "2wikimultihopqa"), tool_format=fmt).unwrapped
    for k in range(env.num_tasks()):
        ep = play(env, k, env.demonstration)
        assert ep.success, (fmt, k, env.transcript)
        env.reset(options={"task_index": k})
        first = env.demonstration(env.task)[0]
        assert get_format(fmt).parse(first).calls[0].name == "search", first


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["hermes", "smollm2"])
def test_math_oracle_calls_python_in_the_env_format(fmt):
    env = gym.make("AgentR1/Math-v0", tool_format=fmt).unwrapped
    for k in range(50):  # the first synthetic task that comes with a program
        env.reset(options={"task_index": k})
        if env.task.get("program"):
            break
    turns = env.demonstration(env.task)
    assert len(turns) == 2 and get_format(fmt).parse(turns[0]).calls[0].name == "python", turns
    assert turns[0] == get_format(fmt).call_text("python", {"code": env.task["program"]})
    ep = play(env, k, env.demonstration)
    assert ep.success, env.transcript
