import time

from agent_gym.tools import Tool, ToolResult, run_tool, tool


@tool(description="Add two integers.",
      parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"], "additionalProperties": False})
def add(a: int, b: int) -> str:
    return str(a + b)


class Slow(Tool):
    name = "slow"
    description = "sleeps"
    parameters = {"type": "object", "properties": {}}
    timeout = 0.05

    def execute(self) -> str:
        time.sleep(1.0)
        return "done"


class Broken(Tool):
    name = "broken"
    description = "raises"

    def execute(self) -> str:
        raise KeyError("missing row")


def test_function_tool_runs_and_has_schema():
    assert add.name == "add"
    assert add.schema()["function"]["parameters"]["required"] == ["a", "b"]
    status, res = run_tool(add, {"a": 2, "b": 3})
    assert (status, res.content, res.ok) == ("ok", "5", True)


def test_bad_arguments_are_reported_not_raised():
    for args, needle in [({"a": 1}, "'b' is a required property"), ({"a": 1, "b": "x"}, "is not of type"),
                         ({"a": 1, "b": 2, "c": 3}, "Additional properties"), (["a"], "JSON object")]:
        status, res = run_tool(add, args)
        assert status == "bad_arguments" and not res.ok
        assert needle in res.content, res.content


def test_timeout_and_exception_become_statuses():
    t0 = time.perf_counter()
    status, res = run_tool(Slow(), {})
    assert status == "timeout" and "timed out after 0.05 s" in res.content
    assert time.perf_counter() - t0 < 0.5
    status, res = run_tool(Broken(), {})
    assert status == "tool_error" and "KeyError" in res.content and "missing row" in res.content


def test_not_ok_result_is_tool_error():
    @tool(description="fails softly", parameters={"type": "object", "properties": {}})
    def soft():
        return ToolResult("no such entity", ok=False)

    assert run_tool(soft, {})[0] == "tool_error"


import threading  # noqa: E402

import pytest  # noqa: E402

from agent_gym.tools import MAX_ABANDONED_PER_TOOL, abandoned_calls  # noqa: E402


class Hang(Tool):
    name = "hang"
    description = "waits until released"
    timeout = 0.05

    def __init__(self):
        self.release = threading.Event()

    def execute(self) -> str:
        self.release.wait(20)
        return "late"


@pytest.mark.timeout(30)
def test_hung_calls_do_not_starve_other_tools():
    """Issue 10 item 11: after 32 timed-out calls in the shared pool, an instant tool with a 1 s
    timeout returned ``timeout`` for every env until the hung calls ended. Now each call has its own
    thread (its timeout does not count queue time) and a tool keeps at most
    MAX_ABANDONED_PER_TOOL abandoned calls alive."""
    hang = Hang()
    quick = tool(description="instant", parameters={"type": "object", "properties": {}}, timeout=1.0)(lambda: "ok")
    try:
        t0 = time.perf_counter()
        statuses = [run_tool(hang, {})[0] for _ in range(40)]
        assert statuses == ["timeout"] * 40
        assert time.perf_counter() - t0 < 0.05 * MAX_ABANDONED_PER_TOOL + 2.0  # saturated calls fail at once
        assert abandoned_calls(hang) == MAX_ABANDONED_PER_TOOL
        assert "earlier calls still running" in run_tool(hang, {})[1].content
        for _ in range(20):
            assert run_tool(quick, {})[0] == "ok"
        assert Hang().timeout and run_tool(Hang(), {})[0] == "timeout"  # another instance is not saturated
    finally:
        hang.release.set()
    deadline = time.monotonic() + 10
    while abandoned_calls(hang) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert abandoned_calls(hang) == 0


class Unprintable:
    def __str__(self):
        raise RuntimeError("no str")


@pytest.mark.parametrize("timeout", [None, 1.0])
@pytest.mark.parametrize("out,needle", [
    ([1, 2], "its result is a list"), (None, "its result is a NoneType"), (Unprintable(), "its result is a Unprintable"),
    (ToolResult(["x"]), "ToolResult.content is a list"),
])
def test_bad_return_values_are_tool_errors(out, needle, timeout):
    t = tool(description="returns junk", parameters={"type": "object", "properties": {}}, timeout=timeout)(lambda: out)
    status, res = run_tool(t, {})
    assert status == "tool_error" and needle in res.content and not res.ok


@pytest.mark.parametrize("timeout", [None, 1.0])
def test_system_exit_is_a_tool_error_and_keyboard_interrupt_propagates(timeout):
    def leave():
        raise SystemExit(3)

    def stop():
        raise KeyboardInterrupt

    class BadMessage(Exception):
        def __str__(self):
            raise RuntimeError

    def bad():
        raise BadMessage

    empty = {"type": "object", "properties": {}}
    status, res = run_tool(tool(description="x", parameters=empty, timeout=timeout)(leave), {})
    assert status == "tool_error" and "SystemExit: 3" in res.content
    assert "unprintable BadMessage" in run_tool(tool(description="x", parameters=empty, timeout=timeout)(bad), {})[1].content
    with pytest.raises(KeyboardInterrupt):
        run_tool(tool(description="x", parameters=empty, timeout=timeout)(stop), {})


def test_invalid_schema_is_refused_by_check_schema():
    t = tool(description="x", name="x", parameters={"type": "object", "properties": {"a": {"type": "strng"}}})(lambda a: a)
    with pytest.raises(ValueError, match=r"tool 'x'.*invalid parameters schema at properties/a/type"):
        t.check_schema()
    add.check_schema()
