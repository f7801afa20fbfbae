"""``reset`` is transactional. Any exception anywhere in a reset (a prompt over the
context budget, a bad task, a task index out of range, a subclass hook or a subclass's own ``reset``
raising, ``KeyboardInterrupt``) leaves the env exactly as before the call; a ``step`` after a failed
reset raises naming the failed reset, and a later good reset starts a clean episode.

Before the fix, a reset that raised "prompt over max_context_tokens" mid-episode left the new
prompt's ids with the old loss mask and ``_done`` False, and the next step was accepted."""

import copy

import numpy as np
import pytest

from agent_gym.env import ToolEnv
from tests.agent_gym.test_conformance import ENV_IDS, make
from tests.agent_gym.test_env import TinyEnv, call, echo

_EPISODE_ATTRS = (
    "_ids",
    "_loss_mask",
    "prompt_len",
    "turn",
    "tool_calls_used",
    "invalid_streak",
    "step_spans",
    "step_rewards",
    "step_reward_components",
    "step_call_statuses",
    "transcript",
    "messages",
    "task",
    "task_index",
    "answer",
    "_done",
)


def snapshot(u: ToolEnv) -> dict:
    """Everything an episode is made of, deep-copied, with the RNG's state."""
    names = _EPISODE_ATTRS + tuple(u._episode_state_all)
    out = {k: copy.deepcopy(u.__dict__.get(k, "<absent>")) for k in names}
    rng = u.__dict__.get("_np_random")
    out["rng"] = None if rng is None else copy.deepcopy(rng.bit_generator.state)
    out["rng_seed"] = u.__dict__.get("_np_random_seed")
    return out


def assert_consistent(u: ToolEnv) -> None:
    assert len(u._ids) == len(u._loss_mask) <= u.max_context_tokens
    assert u._loss_mask[: u.prompt_len] == [0] * u.prompt_len


class HookEnv(TinyEnv):
    """A subclass whose hooks raise on demand: ``task_messages`` (before the prompt is built) and its
    own ``reset`` override (after the base reset has finished)."""

    episode_state = ("_seen",)

    def task_messages(self, task):
        if task.get("explode") == "messages":
            raise RuntimeError("task_messages failed")
        return super().task_messages(task)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self._seen = {"task": self.task["id"]}
        if self.task.get("explode") == "after":
            raise RuntimeError("subclass reset failed after the base reset")
        if self.task.get("explode") == "interrupt":
            raise KeyboardInterrupt
        return obs, info


def _bad_resets():
    long_task = {"id": "long", "question": "word " * 5000, "answer": "x"}
    return {
        "prompt_too_long": (dict(options={"task": long_task}), ValueError),
        "missing_key": (dict(options={"task": {"question": "q"}}), ValueError),
        "index_out_of_range_with_seed": (dict(seed=123, options={"task_index": 99}), ValueError),
        "unknown_option": (dict(seed=7, options={"bogus": 1}), ValueError),
        "hook_raises": (
            dict(options={"task": {"id": "m", "question": "q", "answer": "a", "explode": "messages"}}),
            RuntimeError,
        ),
        "subclass_reset_raises": (
            dict(seed=5, options={"task": {"id": "s", "question": "q", "answer": "a", "explode": "after"}}),
            RuntimeError,
        ),
        "keyboard_interrupt": (
            dict(options={"task": {"id": "k", "question": "q", "answer": "a", "explode": "interrupt"}}),
            KeyboardInterrupt,
        ),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(_bad_resets()))
def test_failed_reset_mid_episode_leaves_the_env_as_it_was_and_step_refuses(case):
    kwargs, exc = _bad_resets()[case]
    env = HookEnv(max_context_tokens=512, tools=[echo])
    env.reset(seed=0, options={"task_index": 0})
    env.step(env.encode_turn(call("echo", text="a")))
    before = snapshot(env)
    with pytest.raises(exc):
        env.reset(**kwargs)
    assert snapshot(env) == before  # ids, mask, task, counters, subclass state and RNG: all as before
    assert_consistent(env)
    with pytest.raises(RuntimeError, match=r"reset\(\) .*failed"):
        env.step(env.encode_turn("<answer>hi</answer>"))
    assert snapshot(env) == before
    # A good reset afterwards starts a clean episode that steps normally.
    obs, info = env.reset(options={"task_index": 1})
    assert env.turn == 0 and not env._done and env._seen == {"task": "t1"}
    assert len(obs["input_ids"]) == info["prompt_len"] == env.prompt_len
    *_, term, trunc, info = env.step(env.encode_turn("<answer>yo</answer>"))
    ep = info["trajectory"]
    assert term and ep.success and len(ep.token_ids) == len(ep.loss_mask)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(_bad_resets()))
def test_failed_first_reset_leaves_a_must_reset_env(case):
    kwargs, exc = _bad_resets()[case]
    env = HookEnv(max_context_tokens=512, tools=[echo])
    with pytest.raises(exc):
        env.reset(**kwargs)
    assert env._done and env._ids == [] and not hasattr(env, "task") and not hasattr(env, "_seen")
    with pytest.raises(RuntimeError, match=r"reset\(\)"):
        env.step(env.encode_turn("<answer>hi</answer>"))
    env.reset(options={"task_index": 0})
    *_, term, _, info = env.step(env.encode_turn("<answer>hi</answer>"))
    assert term and info["trajectory"].success


@pytest.mark.timeout(60)
def test_failed_reset_does_not_move_the_task_stream():
    """A failed reset (here: one with a seed and a bad option) leaves the RNG as it was, so the
    tasks drawn afterwards are the ones an env that never saw the failed call draws."""
    a, b = TinyEnv(), TinyEnv()
    a.reset(seed=11)
    b.reset(seed=11)
    with pytest.raises(ValueError):
        a.reset(seed=99, options={"task_index": 5})
    draws_a = [a.reset()[1]["task_index"] for _ in range(12)]
    draws_b = [b.reset()[1]["task_index"] for _ in range(12)]
    assert draws_a == draws_b


def test_the_reported_case_leaves_no_oversized_trajectory():
    """The reported reproduction: a 5,000-word task mid-episode, max_context_tokens 1024."""
    env = TinyEnv(max_context_tokens=1024, tools=[echo])
    env.reset(options={"task_index": 0})
    env.step(env.encode_turn(call("echo", text="a")))
    ids = list(env._ids)
    with pytest.raises(ValueError, match="over max_context_tokens"):
        env.reset(options={"task": {"question": "word " * 5000, "answer": "x"}})
    assert env._ids == ids and len(env._loss_mask) == len(ids)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.encode_turn("<answer>hi</answer>"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_registered_env_resets_transactionally(env_id):
    """Over every registered id (their own ``reset`` overrides included): a reset whose prompt does
    not fit, and one with a seed and a bad index, change nothing and make step refuse."""
    from tests.agent_gym.fuzz import fuzz_action

    env = make(env_id)
    u = env.unwrapped
    rng = np.random.default_rng(0)
    env.reset(seed=1, options={"task_index": 0})
    for _ in range(3):  # somewhere into an episode
        if u._done:
            env.reset(options={"task_index": 0})
        env.step(fuzz_action(env, rng, u.task))
    before, budget = snapshot(u), u.max_context_tokens
    u.max_context_tokens = u.prompt_len  # the same task's prompt no longer fits
    with pytest.raises(ValueError, match="max_context_tokens"):
        env.reset(options={"task_index": u.task_index if u.task_index >= 0 else 0})
    u.max_context_tokens = budget
    assert snapshot(u) == before
    with pytest.raises(ValueError):
        env.reset(seed=42, options={"task_index": u.num_tasks()})
    assert snapshot(u) == before
    with pytest.raises(RuntimeError, match="reset"):
        u.step(u.encode_turn("<answer>x</answer>"))
    obs, info = env.reset(options={"task_index": 0})
    assert len(obs["input_ids"]) == info["prompt_len"] and not u._done
    assert_consistent(u)
    env.close()


class LazyStateEnv(TinyEnv):
    """Creates its ``episode_state`` attribute during the first step (in a process hook)."""

    episode_state = ("_lazy",)

    def process_components(self, outcome, task):
        self._lazy = getattr(self, "_lazy", 0) + 1
        return {}


@pytest.mark.timeout(60)
def test_step_rollback_deletes_an_episode_state_attribute_the_step_created():
    """The sentinel for "absent before the step" was a plain ``object()``, which ``copy.deepcopy``
    copies into a new object: the rollback then set the attribute to that copy instead of deleting
    it (found while making reset transactional, which uses the same sentinel)."""
    from tests.agent_gym.test_env import _const_tool

    env = LazyStateEnv(tools=[echo, _const_tool("stop", exc=KeyboardInterrupt)])
    env.reset(options={"task_index": 0})
    with pytest.raises(KeyboardInterrupt):
        env.step(env.encode_turn(call("echo", text="a") + call("stop")))
    assert not hasattr(env, "_lazy")
    env.step(env.encode_turn(call("echo", text="a")))
    assert env._lazy == 1


def _failing_reset(u: ToolEnv, rng: np.random.Generator):
    """A reset that must fail, drawn at random: kwargs, the exception, and an undo for any setup."""
    kind = int(rng.integers(4))
    if kind == 0:  # the prompt of a task no longer fits: set the budget to its prompt length
        k = int(rng.integers(u.num_tasks()))
        budget = u.max_context_tokens
        u.max_context_tokens = len(u.renderer.prompt_ids(u.task_messages(u.get_task(k))))
        return dict(options={"task_index": k}), ValueError, lambda: setattr(u, "max_context_tokens", budget)
    if kind == 1:
        return (
            dict(seed=int(rng.integers(1 << 30)), options={"task_index": u.num_tasks() + int(rng.integers(5))}),
            ValueError,
            None,
        )
    if kind == 2:
        return dict(seed=int(rng.integers(1 << 30)), options={"oops": 1}), ValueError, None
    return dict(options={"task": {"question": 5}}), ValueError, None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_fuzzed_steps_with_failed_resets_keep_every_invariant(env_id):
    """Fuzzed steps with a failing reset drawn now and then (every registered id): a failed reset
    changes nothing and makes step refuse; the episodes around it keep the token invariants."""
    from tests.agent_gym.fuzz import fuzz_action
    from tests.agent_gym.test_conformance import budget

    env = make(env_id)
    u = env.unwrapped
    rng = np.random.default_rng(20)
    env.reset(seed=3)
    failed = 0
    for _ in range(budget(env_id, 300, 20)):
        if rng.random() < 0.1:
            before = snapshot(u)
            kwargs, exc, undo = _failing_reset(u, rng)
            with pytest.raises(exc):
                env.reset(**kwargs)
            if undo:
                undo()
            assert snapshot(u) == before
            with pytest.raises(RuntimeError, match="reset"):
                u.step(u.encode_turn("<answer>x</answer>"))
            failed += 1
            env.reset()
        prev, prev_mask = list(u._ids), list(u._loss_mask)
        obs, _, term, trunc, info = env.step(fuzz_action(env, rng, u.task))
        ids, mask = obs["input_ids"].tolist(), u._loss_mask
        s, e = info["action_span"]
        assert ids[: len(prev)] == prev and s == len(prev) and len(mask) == len(ids)
        assert mask == prev_mask + [1] * (e - s) + [0] * (len(ids) - e)
        assert len(ids) <= u.max_context_tokens + 1  # + the env's closing token of a cut action
        if term or trunc:
            ep = info["trajectory"]
            assert len(ep.token_ids) == len(ep.loss_mask) and ep.prompt_len == u.prompt_len
            env.reset()
    assert failed > 0
    env.close()
