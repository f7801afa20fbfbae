import gymnasium as gym
import numpy as np
import pytest

import agent_gym  # noqa: F401
from agent_gym.vector import ToolVectorEnv
from tests.agent_gym.fuzz import fuzz_action


def scripted_turns(env, task):
    """The ids of a correct FactChain episode: one lookup per hop, then the answer."""
    import json

    out = []
    for i, r in enumerate(task["chain"]):
        call = {"name": "lookup", "arguments": {"entity": task["path"][i], "relation": r}}
        out.append(env.encode_turn(f"<tool_call>{json.dumps(call)}</tool_call>"))
    out.append(env.encode_turn(f"<answer>{task['answer']}</answer>"))
    return out


@pytest.mark.parametrize("mode,kwargs", [("sync", {}), ("async", {"shared_memory": False})])
def test_make_vec_gymnasium_modes(mode, kwargs):
    envs = gym.make_vec("AgentR1/FactChain-v0", 3, vectorization_mode=mode, vector_kwargs=kwargs)
    obs, info = envs.reset(seed=1)
    single = gym.make("AgentR1/FactChain-v0")
    for i in range(3):
        assert np.array_equal(obs["input_ids"][i], single.reset(seed=1 + i)[0]["input_ids"])
    rng = np.random.default_rng(0)
    for _ in range(5):
        acts = tuple(fuzz_action(single, rng) for _ in range(3))
        obs, r, term, trunc, info = envs.step(acts)
        assert r.shape == (3,) and len(obs["input_ids"]) == 3
    envs.close()


def test_vector_entry_point_groups_and_active_stepping():
    envs = gym.make_vec("AgentR1/FactChain-v0", 4, info_format="list", num_threads=2)
    assert isinstance(envs, ToolVectorEnv)
    obs, infos = envs.reset(seed=0, options={"task_indices": [7, 9], "group_size": 2})
    assert [i["task_index"] for i in infos] == [7, 7, 9, 9]
    assert np.array_equal(obs["input_ids"][0], obs["input_ids"][1])
    plans = [scripted_turns(e, e.task) for e in envs.envs]
    # env 3 answers wrongly at once; the others follow the chain.
    wrong = envs.envs[3].encode_turn("<answer>nobody</answer>")
    obs, r, term, trunc, infos = envs.step([plans[0][0], plans[1][0], None, wrong])
    assert infos[2] == {} and term.tolist() == [False, False, False, True] and r[3] == 0.0
    assert envs.active.tolist() == [True, True, True, False]
    with pytest.raises(RuntimeError, match="not active"):
        envs.step([None, None, None, wrong])
    done = np.zeros(4, bool)
    done[3] = True
    turn = [1, 1, 0, 1]
    while not done.all():
        acts = [None if done[i] else plans[i][turn[i]] for i in range(4)]
        obs, r, term, trunc, infos = envs.step(acts)
        for i in range(4):
            if acts[i] is not None:
                turn[i] += 1
                if term[i] or trunc[i]:
                    done[i] = True
                    assert term[i] and r[i] == 1.0 and infos[i]["trajectory"].answer == envs.envs[i].task["answer"]
    envs.close()


def test_no_autoreset_by_default_and_autoreset_option():
    envs = ToolVectorEnv.from_entry_point("envs.factchain:FactChainEnv", num_envs=2, info_format="list")
    envs.reset(seed=0)
    wrong = envs.envs[0].encode_turn("<answer>x</answer>")
    envs.step([wrong, wrong])
    assert not envs.active.any()
    envs = ToolVectorEnv.from_entry_point("envs.factchain:FactChainEnv", num_envs=2, autoreset=True, info_format="list")
    envs.reset(seed=0)
    envs.step([wrong, wrong])
    obs, *_ = envs.step([None, None])  # the next step resets the finished envs
    assert envs.active.all() and len(obs["input_ids"][0]) == envs.envs[0].prompt_len


def test_bad_reset_options():
    envs = ToolVectorEnv.from_entry_point("envs.factchain:FactChainEnv", num_envs=4)
    with pytest.raises(ValueError, match="divide num_envs"):
        envs.reset(options={"task_indices": [1], "group_size": 3})
    with pytest.raises(ValueError, match=r"1 task_indices x group_size 2 != num_envs 4"):
        envs.reset(options={"task_indices": [1], "group_size": 2})
    with pytest.raises(ValueError, match="unknown reset option"):
        envs.reset(options={"groups": 2})
    with pytest.raises(ValueError, match="expected 4 actions"):
        envs.reset()
        envs.step([None])


@pytest.mark.parametrize("bad", [np.array([1.5, 2.0]), np.array([[1, 2]]), np.array([10**9])])
def test_one_bad_slot_steps_no_sub_env(bad):
    """Before the fix a bad action in one slot stepped the other sub-envs and threw their results
    away. Every action is checked first: nothing is stepped and the error names the slot."""
    envs = ToolVectorEnv.from_entry_point("envs.factchain:FactChainEnv", num_envs=3, info_format="list")
    envs.reset(seed=0)
    before = [(list(e._ids), e.turn) for e in envs.envs]
    good = scripted_turns(envs.envs[0], envs.envs[0].task)[0]
    with pytest.raises(ValueError, match=r"action of sub-env 2: .*no sub-env was stepped"):
        envs.step([good, good, bad])
    assert [(list(e._ids), e.turn) for e in envs.envs] == before
    _, r, term, trunc, infos = envs.step([good, None, None])  # still usable
    assert infos[0]["turn"] == 1 and infos[1] == {}
    envs.close()


def _padded(ids, n=64, no_token=None):
    a = np.full(n, no_token, dtype=np.int64)
    a[: len(ids)] = ids
    return a


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["gym.make", "PaddedTokens", "TextView"])
def test_one_bad_slot_steps_no_wrapped_sub_env(kind):
    """The same for wrapped sub-envs: the up-front check was skipped for any sub-env that was
    not a bare ToolEnv (``gym.make`` adds OrderEnforcing and PassiveEnvChecker; the views change the
    action space), so one bad slot still stepped the others. Each slot is now checked in its own
    action space before any is stepped."""
    from agent_gym.wrappers import PaddedTokens, TextView

    make = {
        "gym.make": lambda: gym.make("AgentR1/FactChain-v0"),
        "PaddedTokens": lambda: PaddedTokens(gym.make("AgentR1/FactChain-v0"), max_action_len=64),
        "TextView": lambda: TextView(gym.make("AgentR1/FactChain-v0")),
    }[kind]
    envs = ToolVectorEnv([make] * 3, info_format="list", num_threads=3)
    envs.reset(seed=0, options={"task_indices": [3], "group_size": 3})
    base = [e.unwrapped for e in envs.envs]
    plan = scripted_turns(base[0], base[0].task)[0]
    if kind == "gym.make":
        good, bads = plan, [np.array([1.5, 2.0]), np.array([[1, 2]]), np.array([10**9])]
    elif kind == "PaddedTokens":
        nt = envs.envs[0].no_token
        good = _padded(plan, no_token=nt)
        bads = [good.astype(np.float64), _padded(plan, 65, nt), np.full(64, nt + 1), np.array([10**9])]
    else:
        good = base[0].tokenizer.decode(plan[:-1], skip_special_tokens=False)
        bads = [plan, 5, b"<answer>x</answer>"]
    before = [(list(e._ids), e.turn) for e in base]
    for bad in bads:
        with pytest.raises(ValueError, match=r"action of sub-env 2: .*no sub-env was stepped"):
            envs.step([good, good, bad])
        assert [(list(e._ids), e.turn) for e in base] == before, (kind, bad)
    _, r, term, trunc, infos = envs.step([good, None, good])  # still usable
    assert infos[0]["turn"] == 1 and infos[1] == {} and infos[2]["tool_calls"][0]["status"] == "ok"
    assert [e.turn for e in base] == [1, 0, 1]
    envs.close()


def test_sub_env_whose_actions_cannot_be_checked_is_refused():
    """A wrapper that transforms actions and has no ``check_action`` could only be checked by
    stepping: the vector env refuses it when built, naming the sub-env, the wrapper and the fix."""

    class Shift(gym.ActionWrapper):
        def action(self, action):
            return np.asarray(action) + 1

    with pytest.raises(TypeError, match=r"sub-env 0 cannot be used in a ToolVectorEnv: wrapper Shift .*check_action"):
        ToolVectorEnv([lambda: Shift(gym.make("AgentR1/FactChain-v0"))] * 2)


class _HookFails:
    """A FactChain env whose process_components hook raises ``fail`` (when set) on an ok call."""

    @staticmethod
    def make(fail_box):
        from envs.factchain import FactChainEnv

        class Failing(FactChainEnv):
            def process_components(self, outcome, task):
                if fail_box.get(id(self)) is not None:
                    raise fail_box[id(self)]
                return super().process_components(outcome, task)

        return Failing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("failing", [0, 1])
@pytest.mark.parametrize(
    ("source", "exc"),
    [
        ("hook", RuntimeError("hook failed")),
        ("hook", KeyboardInterrupt()),
        ("tool", KeyboardInterrupt()),  # a tool's other exceptions are tool_error results, not raised
    ],
)
def test_a_raising_slot_keeps_its_siblings_finished_episode(threads, failing, source, exc):
    """Before the fix, when one slot raised while stepping (a subclass hook, a tool's
    KeyboardInterrupt), a sibling's finished episode was thrown away, the sibling stayed active and
    the next step on it raised. Every step that completed is now recorded (inactive, its result
    in the error or ``partial_step``), the failing slot is as it was (its step rolled back), and a
    KeyboardInterrupt still propagates as itself."""
    from agent_gym.vector import VectorStepError

    fail_box: dict = {}
    cls = _HookFails.make(fail_box)
    vec = ToolVectorEnv([cls, cls], num_threads=threads, info_format="list")
    vec.reset(options={"task_indices": [4, 5]})
    other = 1 - failing
    envs = vec.envs
    if source == "hook":
        fail_box[id(envs[failing])] = exc
    else:  # the lookup tool itself raises
        tool = envs[failing].tools["lookup"]

        def execute(entity, relation, _orig=tool.execute):
            if fail_box.get("tool") is not None:
                raise fail_box["tool"]
            return _orig(entity, relation)

        tool.execute = execute
        fail_box["tool"] = exc
    lookup = scripted_turns(envs[failing], envs[failing].task)[0]
    answer = envs[other].encode_turn(f"<answer>{envs[other].task['answer']}</answer>")
    actions = [None, None]
    actions[failing], actions[other] = lookup, answer
    before = (list(envs[failing]._ids), envs[failing].turn)
    sequential_interrupt = threads == 0 and isinstance(exc, KeyboardInterrupt) and failing == 0
    with pytest.raises(type(exc)) as raised:
        vec.step(actions)
    err = vec.partial_step
    assert isinstance(err, VectorStepError)
    if isinstance(exc, RuntimeError):
        assert (
            raised.value is err and err.__cause__ is exc and f"sub-env {failing}: RuntimeError: hook failed" in str(err)
        )
    assert err.errors == {failing: exc}
    assert (list(envs[failing]._ids), envs[failing].turn) == before and vec.active[failing]
    if sequential_interrupt:  # slot 1 is never started after slot 0's interrupt: nothing to keep
        assert err.not_stepped == [1] and err.results == {} and vec.active[1] and envs[1].turn == 0
        return
    obs, r, term, trunc, info = err.results[other]
    assert term and r == 1.0 and info["trajectory"].answer == envs[other].task["answer"]
    assert not vec.active[other]
    assert np.array_equal(vec._last_obs[other]["input_ids"], obs["input_ids"])
    with pytest.raises(RuntimeError, match=f"sub-env {other} is not active"):
        vec.step(actions)  # refused before stepping anything, as for any finished slot
    fail_box.clear()
    actions[other] = None
    _, _, _, _, infos = vec.step(actions)  # the failing slot goes on from where it was
    assert infos[failing]["turn"] == 1 and infos[failing]["tool_calls"][0]["status"] == "ok"
    assert vec.partial_step is None
    vec.close()
