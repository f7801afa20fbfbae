"""A tool's output and the calls read per turn are capped.

Before: a tool returning 10 MB made one step take 11.3 s (the whole text was encoded), and 4,000
empty ``<tool_call></tool_call>`` in one turn were each parsed, answered and rendered. Timings are
in ``benchmarks/faults/tool_output_cap.py``; these tests check the behaviour and what is reported."""

import pytest

from agent_gym.formats import ParsedTurn, ToolCall, ToolCallFormat, get_format
from agent_gym.tools import CALL_STATUSES, Tool, ToolResult, tool
from tests.agent_gym.test_env import TinyEnv, call, echo


def _returns(name, text, exc=False, timeout=None):
    def fn():
        if exc:
            raise RuntimeError(text)
        return text

    return tool(description=name, name=name, parameters={"type": "object", "properties": {}}, timeout=timeout)(fn)


class Big(Tool):
    name, description = "big", "Returns a ToolResult with metadata."
    parameters = {"type": "object", "properties": {}}

    def execute(self):
        return ToolResult("abc " * 50_000, metadata={"titles": ["t"]})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [None, 1.0])
def test_a_huge_result_is_cut_and_reported(timeout):
    text = "word " * 2_000_000  # 10 MB
    env = TinyEnv(
        tools=[_returns("huge", text, timeout=timeout), echo], max_tool_output_chars=1000, max_context_tokens=4096
    )
    env.reset(options={"task_index": 0})
    *_, term, trunc, info = env.step(env.encode_turn(call("huge") + call("echo", text="short")))
    assert not (term or trunc)
    assert info["tool_calls"][0] == {
        "name": "huge",
        "arguments": {},
        "status": "ok",
        "truncated": True,
        "output_chars": len(text),
    }
    assert info["tool_calls"][1] == {"name": "echo", "arguments": {"text": "short"}, "status": "ok"}  # not cut
    shown = env.messages[-2]["content"]
    assert shown.startswith(text[:1000]) and not shown.startswith(text[:1001])
    assert f"{len(text) - 1000:,} of {len(text):,} characters not shown" in shown
    assert env.messages[-1]["content"] == "echo: short"
    *_, term, _, info = env.step(env.encode_turn("<answer>hi</answer>"))
    ep = info["trajectory"]
    assert term and ep.tool_outputs_truncated == 1 and ep.tool_calls_skipped == 0
    assert ep.step_call_statuses == [["ok", "ok"], []]


def test_error_messages_and_tool_result_objects_are_capped_too():
    """The whole class: an exception whose message is huge (a ``tool_error``) and a ``ToolResult``
    (metadata kept) are cut like a plain string."""
    env = TinyEnv(tools=[_returns("raiser", "x" * 100_000, exc=True), Big()], max_tool_output_chars=500)
    env.reset(options={"task_index": 0})
    *_, info = env.step(env.encode_turn(call("raiser")))
    assert info["tool_calls"][0]["status"] == "tool_error" and info["tool_calls"][0]["truncated"]
    assert len(env.messages[-1]["content"]) < 700 and "characters not shown" in env.messages[-1]["content"]
    *_, info = env.step(env.encode_turn(call("big")))
    assert info["tool_calls"][0]["status"] == "ok" and info["tool_calls"][0]["output_chars"] == 200_000
    assert len(env.messages[-1]["content"]) < 700


def test_the_default_cap_applies_and_results_under_it_are_untouched():
    env = TinyEnv(
        tools=[_returns("huge", "y" * 10_000_000), _returns("fits", "z" * 32_768)],
        max_context_tokens=32_768,
        max_invalid_calls=5,
    )
    assert env.max_tool_output_chars == 32_768
    env.reset(options={"task_index": 0})
    *_, info = env.step(env.encode_turn(call("fits")))
    assert info["tool_calls"][0] == {"name": "fits", "arguments": {}, "status": "ok"}
    env.reset(options={"task_index": 0})
    *_, info = env.step(env.encode_turn(call("huge")))
    assert info["tool_calls"][0]["truncated"] and info["tool_calls"][0]["output_chars"] == 10_000_000


@pytest.mark.parametrize("fmt,one", [("hermes", "<tool_call></tool_call>"), ("search_r1", "<search></search>")])
def test_the_parser_stops_after_max_calls_and_counts_the_rest(fmt, one):
    f = get_format(fmt)
    text = one * 4000 + "<answer>a</answer>"
    full = f.parse(text)
    capped = f.parse(text, max_calls=16)
    assert len(full.calls) == 4000 and full.calls_skipped == 0
    assert capped.calls == full.calls[:16] and capped.calls_skipped == 3984 and capped.answer == "a"
    # An unclosed tag at the end is a call too: read when there is room, else counted.
    opener = one[: one.index(">") + 1]
    assert f.parse(one * 3 + opener, max_calls=4).calls[-1].error.startswith("unclosed")
    assert f.parse(one * 3 + opener, max_calls=3).calls_skipped == 1
    assert f.parse(one * 3, max_calls=3).calls_skipped == 0


@pytest.mark.timeout(60)
def test_a_turn_of_4000_empty_calls_runs_at_most_the_cap_and_reports_the_rest():
    env = TinyEnv(max_context_tokens=32_768, max_tool_calls=16, max_invalid_calls=5, rewards={"call_invalid": -0.1})
    assert env.max_calls_per_turn == 16 and "too_many_calls" in CALL_STATUSES
    env.reset(options={"task_index": 0})
    *_, r, term, trunc, info = env.step(env.encode_turn("<tool_call></tool_call>" * 4000))
    statuses = [c["status"] for c in info["tool_calls"]]
    assert statuses == ["parse_error"] * 16 + ["too_many_calls"] and not (term or trunc)
    assert info["tool_calls"][-1]["skipped"] == 3984 and info["tool_calls"][-1]["name"] is None
    assert r == pytest.approx(-0.1 * 17)  # the skipped calls count as one failed call
    msgs = [m["content"] for m in env.messages if m["role"] == "tool"]
    assert len(msgs) == 17 and "3984 more tool call(s) after the first 16" in msgs[-1]
    *_, term, _, info = env.step(env.encode_turn("<answer>hi</answer>"))
    ep = info["trajectory"]
    assert ep.tool_calls_skipped == 3984 and ep.call_statuses == {"parse_error": 16, "too_many_calls": 1}


def test_valid_calls_past_the_cap_are_not_run_and_the_cap_is_configurable():
    runs = []

    @tool(description="Count.", parameters={"type": "object", "properties": {}})
    def count() -> str:
        runs.append(1)
        return str(len(runs))

    env = TinyEnv(tools=[count], max_tool_calls=100, max_calls_per_turn=3)
    env.reset(options={"task_index": 0})
    *_, info = env.step(env.encode_turn(call("count") * 10))
    assert len(runs) == 3 and [c["status"] for c in info["tool_calls"]] == ["ok"] * 3 + ["too_many_calls"]
    assert env.tool_calls_used == 3


def test_a_format_without_max_calls_is_capped_by_the_env():
    """A custom format written against the old ``parse(text)`` still works, and its calls past the
    cap are not run."""

    class Lines(ToolCallFormat):
        uses_template_tools = False

        def parse(self, text):
            calls = [ToolCall("echo", {"text": w}, w) for w in text.split() if not w.startswith("<")]
            return ParsedTurn(text=text, calls=calls, answer=None)

        def result_messages(self, outcomes):
            return [{"role": "user", "content": "\n".join(o.result.content for o in outcomes)}]

        def instructions(self, tools):
            return "Write words."

    env = TinyEnv(tools=[echo], tool_format=Lines(), max_calls_per_turn=2, max_tool_calls=50)
    env.reset(options={"task_index": 0})
    *_, info = env.step(env.encode_turn("a b c d e"))
    assert [c["status"] for c in info["tool_calls"]] == ["ok", "ok", "too_many_calls"]
    assert info["tool_calls"][-1]["skipped"] == 3


@pytest.mark.parametrize(
    "kw",
    [
        {"max_tool_output_chars": 0},
        {"max_calls_per_turn": -1},
        {"max_tool_output_chars": "10"},
        {"max_calls_per_turn": 2.5},
    ],
)
def test_bad_caps_are_refused_at_construction(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        TinyEnv(**kw)


def test_a_step_rolled_back_restores_the_counters():
    from tests.agent_gym.test_env import _const_tool

    env = TinyEnv(
        tools=[_returns("huge", "q" * 5000), _const_tool("stop", exc=KeyboardInterrupt)],
        max_tool_output_chars=100,
        max_calls_per_turn=2,
    )
    env.reset(options={"task_index": 0})
    with pytest.raises(KeyboardInterrupt):
        env.step(env.encode_turn(call("huge") + call("stop") + call("huge")))
    assert env.outputs_truncated == 0 and env.calls_skipped == 0
    env.step(env.encode_turn(call("huge") * 3))
    assert env.outputs_truncated == 2 and env.calls_skipped == 1
