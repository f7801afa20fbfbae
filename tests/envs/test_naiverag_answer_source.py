"""NaiveRAG's ``answer_source: text``: the paper's Naive RAG reads the answer from the
model's text; a reply without ``<answer>`` tags was unscored (EM 0) however right it was."""

import gymnasium as gym
import pytest

import envs  # noqa: F401
from envs.naiverag import answer_from_text
from tests.envs.test_qa_envs import HOTPOT, NO_CACHE, act


def make(**kw):
    return gym.make("AgentR1/HotpotQA-NaiveRAG-v0", data_path=HOTPOT, retriever_kwargs=NO_CACHE, **kw)


@pytest.mark.parametrize(
    "text,want",
    [
        ("The answer is: 2009.", "2009"),
        ("No, Scott Derrickson and Ed Wood were not.", "no"),
        ("yes", "yes"),
        ("Answer: **Chief of Protocol**\nbecause ...", "Chief of Protocol"),
        ("The capital of France is Paris. It is large.", "The capital of France is Paris"),
        ("I think the final answer is Quillhaven", "Quillhaven"),
        ("   ", None),
        ("Dr. No is a film", "Dr"),
    ],
)
def test_answer_from_text(text, want):
    assert answer_from_text(text) == want


def test_text_answers_are_scored_without_the_format_reward_and_tags_still_win():
    tags, text = make(rewards={"format": 0.5}), make(rewards={"format": 0.5}, answer_source="text")
    for env in (tags, text):
        env.reset(options={"task_index": 0})  # gold: Quillhaven
    _, r_tags, *_, i_tags = tags.step(act(tags, "The answer is Quillhaven."))
    _, r_text, term, trunc, i_text = text.step(act(text, "The answer is Quillhaven."))
    assert (r_tags, i_tags["answer"], i_tags["truncation_reason"]) == (0.0, None, "max_turns")
    assert (r_text, term, trunc) == (1.0, True, False)  # EM 1, and no format reward for untagged text
    assert i_text["answer"] == "Quillhaven" and i_text["answer_extracted"] is True
    assert i_text["reward_components"].get("format", 0.0) == 0.0 and i_text["answer_scores"]["em"] == 1.0
    text.reset(options={"task_index": 0})
    _, r, *_, info = text.step(act(text, "Maybe Paris. <answer>Quillhaven</answer>"))
    assert r == 1.5 and info["answer"] == "Quillhaven" and info["answer_extracted"] is False
    text.reset(options={"task_index": 0})  # the flag does not leak from one episode into the next
    assert "answer_extracted" not in text.reset(options={"task_index": 0})[1]


def test_bad_answer_source_is_refused():
    with pytest.raises(ValueError, match="answer_source must be one of"):
        make(answer_source="free")
