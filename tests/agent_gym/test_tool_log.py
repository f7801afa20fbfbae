"""Tool record and replay (agent_gym/tool_log.py): a rollout's calls written to JSONL and served
back without running the tool, bit-identical episodes, and a clear error at the first call that differs."""

import json

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401
from agent_gym.tool_log import ToolReplayMismatch

pytestmark = pytest.mark.timeout(120)

KW = {"tools_in_prompt": False}


def _play(env, seed, task_index, turns):
    env.reset(seed=seed, options={"task_index": task_index})
    for text in turns:
        *_, term, trunc, info = env.step(env.encode_turn(text))
        if term or trunc:
            return info["trajectory"]
    raise AssertionError("the episode did not end")


def _oracle(env, task_index):
    env.reset(options={"task_index": task_index})
    return env.demonstration(env.task)


def test_record_then_replay_gives_the_same_episodes_without_running_the_tool(tmp_path):
    path = tmp_path / "calls.jsonl"
    rec = gym.make("AgentR1/FactChain-v0", tool_record=str(path), **KW).unwrapped
    scripts = {i: _oracle(rec, i) for i in (0, 1)}
    # A bad call (not recorded: the env answers it itself), then the oracle's lookups and answer.
    plays = [
        (11, 0, ['<tool_call>{"name": "lookup"</tool_call>', *scripts[0]]),
        (12, 1, scripts[1]),
        (13, 1, scripts[1]),
    ]
    recorded = [_play(rec, seed, i, turns) for seed, i, turns in plays]
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    hops = [sum(s == "ok" for s in sum(ep.step_call_statuses, [])) for ep in recorded]
    assert len(lines) == sum(hops) and hops[0] >= 2
    assert [(r["task_id"], r["seed"], r["call"]) for r in lines[:2]] == [
        (recorded[0].task_id, 11, 0),
        (recorded[0].task_id, 11, 1),
    ]
    assert {r["name"] for r in lines} == {"lookup"} and all(r["status"] == "ok" and r["content"] for r in lines)

    rep = gym.make("AgentR1/FactChain-v0", tool_replay=str(path), **KW).unwrapped
    tool = rep.tools["lookup"]
    tool.execute = lambda **kw: (_ for _ in ()).throw(AssertionError("the tool ran during replay"))
    for (seed, i, turns), ep in zip(plays, recorded):
        again = _play(rep, seed, i, turns)
        assert again.token_ids == ep.token_ids and again.step_rewards == ep.step_rewards
        assert again.step_reward_components == ep.step_reward_components and again.success == ep.success


def test_replay_names_the_first_call_that_differs(tmp_path):
    path = tmp_path / "calls.jsonl"
    rec = gym.make("AgentR1/FactChain-v0", tool_record=str(path), **KW).unwrapped
    turns = _oracle(rec, 0)
    _play(rec, 5, 0, turns)
    first = json.loads(path.read_text().splitlines()[0])
    rep = gym.make("AgentR1/FactChain-v0", tool_replay=str(path), **KW).unwrapped
    other = turns[0].replace(first["arguments"]["entity"], first["arguments"]["entity"] + "x")
    assert other != turns[0]
    rep.reset(seed=5, options={"task_index": 0})
    with pytest.raises(ToolReplayMismatch) as e:
        rep.step(rep.encode_turn(other))
    msg = str(e.value)
    assert msg.startswith(
        f"tool_replay: call 0 of task {first['task_id']!r} (reset seed 5) differs from {path} line 1: recorded lookup("
    )
    assert first["arguments"]["entity"] + "x" in msg and "exact re-runs only" in msg
    rep.reset(seed=6, options={"task_index": 0})  # a seed the recording never saw
    with pytest.raises(ToolReplayMismatch, match=r"call 0 of task .* \(reset seed 6\) is not in"):
        rep.step(rep.encode_turn(turns[0]))


def test_record_and_replay_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="exclude each other"):
        gym.make("AgentR1/FactChain-v0", tool_record=str(tmp_path / "a"), tool_replay=str(tmp_path / "a"))
    with pytest.raises(FileNotFoundError, match="no recording at .*record one first with the env kwarg tool_record"):
        gym.make("AgentR1/FactChain-v0", tool_replay=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "1"}\n')
    with pytest.raises(ToolReplayMismatch, match="bad.jsonl line 1 is not a recorded call"):
        gym.make("AgentR1/FactChain-v0", tool_replay=str(bad))
