"""``answer_source`` on every ToolEnv: a turn with no answer tags and no tool
call can be scored without overriding anything private: "text" reads its short plain-text answer,
"reply" takes the whole reply (a single-turn task's ``score_answer`` is then its reward function),
and a subclass may override the public ``untagged_answer``."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from envs.factchain import FactChainEnv


def turn(env, text):
    u = env.unwrapped
    return u.tokenizer.encode(text, add_special_tokens=False) + [u.eot_id]


def gold(env):
    return env.unwrapped.task["answer"]


@pytest.mark.timeout(60)
def test_tags_by_default_text_and_reply_score_untagged_turns_without_format_reward():
    envs = {
        src: gym.make("AgentR1/FactChain-v0", answer_source=src, rewards={"format": 0.25})
        for src in ("tags", "text", "reply")
    }
    for env in envs.values():
        env.reset(options={"task_index": 3})
    g = gold(envs["tags"])
    _, r, term, trunc, info = envs["tags"].step(turn(envs["tags"], f"The answer is {g}."))
    assert (r <= 0, term, "answer" in info) == (True, False, False)  # no call, no answer: an invalid turn
    _, r, term, _, info = envs["text"].step(turn(envs["text"], f"The answer is {g}."))
    assert term and info["answer"] == g and info["answer_extracted"] is True and r == pytest.approx(1.0)
    assert info["reward_components"]["format"] == 0.0 and info["trajectory"].answer == g
    _, r, term, _, info = envs["reply"].step(turn(envs["reply"], f"  {g}  "))
    assert term and info["answer"] == g and info["answer_extracted"] is True and r == pytest.approx(1.0)
    # A tagged answer still wins, with its format reward, and is not flagged as extracted.
    envs["text"].reset(options={"task_index": 3})
    _, r, _, _, info = envs["text"].step(turn(envs["text"], f"Maybe X. <answer>{g}</answer>"))
    assert info["answer_extracted"] is False and r == pytest.approx(1.25)


@pytest.mark.timeout(60)
def test_a_turn_with_a_tool_call_is_never_read_as_an_answer():
    env = gym.make("AgentR1/FactChain-v0", answer_source="reply")
    env.reset(options={"task_index": 0})
    _, _, term, _, info = env.step(
        turn(env, '<tool_call>{"name": "lookup", "arguments": {"entity": "nobody", "relation": "sibling"}}</tool_call>')
    )
    assert not term and "answer" not in info and len(info["tool_calls"]) == 1


class ShoutedAnswer(FactChainEnv):
    """A subclass reading answers its own way, through the public hook only."""

    def untagged_answer(self, text):
        return text.split("!")[0].strip() if text.endswith("!") else None


@pytest.mark.timeout(60)
def test_subclass_overrides_the_public_hook():
    env = ShoutedAnswer()
    env.reset(options={"task_index": 1})
    _, r, term, _, info = env.step(turn(env, f"{env.task['answer']}!"))
    assert term and info["answer_extracted"] and r == pytest.approx(1.0)


def test_unknown_answer_source_is_refused():
    with pytest.raises(ValueError, match="answer_source must be one of"):
        gym.make("AgentR1/FactChain-v0", answer_source="free")
