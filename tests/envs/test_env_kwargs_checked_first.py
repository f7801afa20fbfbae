"""A misspelled or bad keyword argument to any built-in env fails at once, naming the nearest valid
name, before the env reads its data: here ``data_path`` points nowhere, so an env that read its data
first would fail on the path instead (and ``gym.make("AgentR1/HotpotQA-v0")`` would first try to
download the dev file)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.builtin_envs import BUILTIN_ENVS

DATA_KW = {"data_path": "/nonexistent/agent_gym_rows.jsonl"}


def _kwargs(env_id: str, **kw):
    return kw if env_id == "AgentR1/FactChain-v0" else {**DATA_KW, **kw}  # FactChain generates its data


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENVS))
def test_a_misspelled_keyword_is_refused_before_the_data_is_read(env_id):
    with pytest.raises(TypeError) as e:
        gym.make(env_id, **_kwargs(env_id, max_turnz=3))
    msg = str(e.value)
    assert "unknown keyword argument 'max_turnz'" in msg and "did you mean 'max_turns'?" in msg, msg
    assert "Valid arguments:" in msg and "max_context_tokens" in msg, msg


BAD_SETTINGS = [
    ({"max_context_tokens": 0}, "max_context_tokens must be a positive integer"),
    ({"max_tool_calls": -1}, "max_tool_calls must be a positive integer"),
    ({"tool_format": "xml"}, "unknown tool_format 'xml'"),
    ({"answer_source": "guess"}, "answer_source must be one of"),
    ({"render_mode": "rgb"}, "render_mode must be None or one of"),
]
CASES = [
    (env_id, kw, needle)
    for env_id in sorted(BUILTIN_ENVS)
    for kw, needle in BAD_SETTINGS
    if not (env_id.endswith("NaiveRAG-v0") and "tool_format" in kw)  # Naive RAG has no tools, so no tool format
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_id,kw,needle", CASES)
def test_a_bad_setting_is_refused_before_the_data_is_read(env_id, kw, needle):
    with pytest.raises(ValueError, match=needle):
        gym.make(env_id, **_kwargs(env_id, **kw))


def test_a_valid_setting_still_reaches_the_data():
    """The early check refuses nothing valid: with good settings, the missing file is the error."""
    with pytest.raises(Exception) as e:
        gym.make("AgentR1/HotpotQA-v0", max_turns=2, tool_format="smollm2", **DATA_KW)
    assert "does not exist" in str(e.value) and "/nonexistent/agent_gym_rows.jsonl" in str(e.value)
