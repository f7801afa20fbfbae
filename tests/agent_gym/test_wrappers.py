import gymnasium as gym
import numpy as np
import pytest

import agent_gym  # noqa: F401
from agent_gym.wrappers import ChatView, PaddedTokens, TextView
from tests.agent_gym.test_vector import scripted_turns


def test_text_view_round_trip_and_flags():
    env = TextView(gym.make("AgentR1/FactChain-v0"))
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, str) and obs.endswith("<|im_start|>assistant\n")
    task = env.unwrapped.task
    obs, r, term, trunc, info = env.step(f"<answer>{task['answer']}</answer>")
    assert term and r == 1.0 and info["retokenized"] and not info["retokenize_lossy"]


def test_chat_view_messages():
    env = ChatView(gym.make("AgentR1/FactChain-v0"))
    msgs, _ = env.reset(seed=0)
    assert [m["role"] for m in msgs] == ["system", "user"]
    task = env.unwrapped.task
    msgs, *_ = env.step(
        '<tool_call>{"name": "lookup", "arguments": {"entity": "%s", "relation": "%s"}}</tool_call>'
        % (task["path"][0], task["chain"][0])
    )
    assert msgs[-1] == {"role": "tool", "content": task["path"][1]}
    msgs, r, term, *_ = env.step("<answer>no</answer>")
    assert term and msgs[-1] == {"role": "assistant", "content": "<answer>no</answer>"}


def test_padded_tokens_fixed_shapes():
    base = gym.make("AgentR1/FactChain-v0")
    env = PaddedTokens(base, max_action_len=64)
    obs, _ = env.reset(seed=0)
    assert obs["input_ids"].shape == (base.unwrapped.max_context_tokens + 1,) and env.observation_space.contains(obs)
    plan = scripted_turns(base.unwrapped, base.unwrapped.task)
    a = np.full(64, env.no_token)
    a[: len(plan[0])] = plan[0]
    assert env.action_space.contains(a)
    obs2, r, term, trunc, info = env.step(a)
    n = int(obs["length"])
    assert info["tool_calls"][0]["status"] == "ok" and np.array_equal(obs2["input_ids"][n : n + len(plan[0])], plan[0])
    assert env.observation_space.contains(obs2)


def test_padded_tokens_rejects_float_and_out_of_range_actions():
    """Float actions were truncated to ints silently; they raise like the base env."""
    import pytest

    env = PaddedTokens(gym.make("AgentR1/FactChain-v0"), max_action_len=8)
    obs, _ = env.reset(seed=0)
    a = np.full(8, env.no_token, dtype=np.float64)
    a[0] = 5.7
    with pytest.raises(ValueError, match="integer token ids"):
        env.step(a)
    with pytest.raises(ValueError, match="outside"):
        env.step(np.full(8, env.no_token + 1))
    assert env.unwrapped.turn == 0 and len(env.unwrapped._ids) == int(obs["length"])


def test_views_check_actions_in_their_own_space_without_stepping():
    """Each view validates an action in its own action space without stepping
    (what ``ToolVectorEnv`` checks every slot with), and ``step`` runs the same check."""
    import pytest

    from agent_gym.wrappers import action_checker, tool_env_of

    padded = PaddedTokens(gym.make("AgentR1/FactChain-v0"), max_action_len=8)
    obs, _ = padded.reset(seed=0)
    u = tool_env_of(padded)
    ids = u.encode_turn("<answer>x</answer>")[:8]
    a = np.full(8, padded.no_token)
    a[: len(ids)] = ids
    assert np.array_equal(padded.check_action(a), ids) and action_checker(padded) == padded.check_action
    with pytest.raises(ValueError, match="over max_action_len=8"):
        padded.check_action(np.zeros(9, dtype=np.int64))
    with pytest.raises(ValueError, match="over max_action_len=8"):
        padded.step(np.zeros(9, dtype=np.int64))
    assert u.turn == 0 and len(u._ids) == int(obs["length"])
    for view in (TextView(gym.make("AgentR1/FactChain-v0")), ChatView(gym.make("AgentR1/FactChain-v0"))):
        view.reset(seed=0)
        assert list(view.check_action("<answer>x</answer>")) == list(view.unwrapped.encode_turn("<answer>x</answer>"))
        with pytest.raises(ValueError, match=f"{type(view).__name__} actions are strings"):
            view.check_action(np.array([1, 2]))
        assert view.unwrapped.turn == 0
        view.step("<answer>x</answer>")  # the episode ends: the env below refuses the next action
        with pytest.raises(RuntimeError, match="finished episode"):
            view.check_action("<answer>x</answer>")
    # gym.make's wrappers pass actions through: the ToolEnv's own check applies.
    made = gym.make("AgentR1/FactChain-v0")
    assert action_checker(made) == made.unwrapped.check_action
    with pytest.raises(TypeError, match="needs a ToolEnv underneath"):
        tool_env_of(gym.make("CartPole-v1"))


@pytest.mark.parametrize("max_len", [None, 501])
def test_padded_tokens_keeps_the_closing_token_of_an_action_that_fills_the_context(max_len):
    """An action that fills the context is cut and closed with the env's
    end-of-turn token, so the observation has max_context_tokens + 1 ids; the padding was
    max_context_tokens long and dropped that token. Every id of the env's observation is kept."""
    base = gym.make("AgentR1/FactChain-v0", max_context_tokens=500)
    u = base.unwrapped
    env = PaddedTokens(base, max_len=max_len, max_action_len=600)
    obs, _ = env.reset(seed=0)
    filler = u.tokenizer.encode(" word" * 600, add_special_tokens=False)[:600]
    a = np.asarray(filler, dtype=np.int64)
    obs, r, term, trunc, info = env.step(a)
    assert trunc and info["truncation_reason"] == "context" and info["action_tokens_dropped"] > 0
    assert len(u._ids) == 501 and u._ids[-1] == u.eot_id
    assert int(obs["length"]) == 501 and np.array_equal(obs["input_ids"][:501], u._ids)
    assert env.observation_space.contains(obs)


def test_padded_tokens_refuses_a_max_len_that_could_cut_an_observation():
    base = gym.make("AgentR1/FactChain-v0", max_context_tokens=500)
    with pytest.raises(ValueError, match=r"max_len 500 is below the longest observation the env can produce, 501 ids"):
        PaddedTokens(base, max_len=500)
