import re
import time

from agent_gym.tools import Tool, ToolResult, run_tool, tool


@tool(
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)
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
    for args, needle in [
        ({"a": 1}, "'b' is a required property"),
        ({"a": 1, "b": "x"}, "is not of type"),
        ({"a": 1, "b": 2, "c": 3}, "Additional properties"),
        (["a"], "JSON object"),
    ]:
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
    """Before the fix, after 32 timed-out calls in the shared pool, an instant tool with a 1 s
    timeout returned ``timeout`` for every env until the hung calls ended. Now each call has its own
    thread (its timeout does not count queue time) and a tool keeps at most
    MAX_ABANDONED_PER_TOOL abandoned calls alive."""
    hang, other = Hang(), Hang()
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
        assert run_tool(other, {})[0] == "timeout" and abandoned_calls(other) == 1  # another instance is not saturated
    finally:
        hang.release.set()
        other.release.set()
    deadline = time.monotonic() + 10
    while abandoned_calls(hang) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert abandoned_calls(hang) == 0


class Unprintable:
    def __str__(self):
        raise RuntimeError("no str")


@pytest.mark.parametrize("timeout", [None, 1.0])
@pytest.mark.parametrize(
    "out,needle",
    [
        ([1, 2], "its result is a list"),
        (None, "its result is a NoneType"),
        (Unprintable(), "its result is a Unprintable"),
        (ToolResult(["x"]), "ToolResult.content is a list"),
    ],
)
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
    assert (
        "unprintable BadMessage"
        in run_tool(tool(description="x", parameters=empty, timeout=timeout)(bad), {})[1].content
    )
    with pytest.raises(KeyboardInterrupt):
        run_tool(tool(description="x", parameters=empty, timeout=timeout)(stop), {})


def test_invalid_schema_is_refused_by_check_schema():
    t = tool(description="x", name="x", parameters={"type": "object", "properties": {"a": {"type": "strng"}}})(
        lambda a: a
    )
    with pytest.raises(ValueError, match=r"tool 'x'.*invalid parameters schema at properties/a/type"):
        t.check_schema()
    add.check_schema()


# -- a dataclass tool with a timeout, schema regexes, a validation that raises ----------------------

from dataclasses import dataclass, field  # noqa: E402

from agent_gym.tools import check_arguments  # noqa: E402


@dataclass
class Lookup(Tool):
    """A tool written as a dataclass: ``__hash__`` is None, so it cannot key a (weak) dict."""

    table: dict = field(default_factory=lambda: {"a": "1"})
    name: str = "lookup"
    description: str = "Look a key up."
    parameters: dict = field(
        default_factory=lambda: {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    )
    timeout: float | None = 1.0
    release: threading.Event = field(default_factory=threading.Event)

    def execute(self, key: str) -> str:
        if key == "hang":
            self.release.wait(20)
        return self.table.get(key, "?")


@pytest.mark.timeout(30)
def test_dataclass_tool_with_a_timeout_runs():
    """The per-tool bound on abandoned calls was a WeakKeyDictionary keyed by the tool, so every
    timed call of a dataclass tool returned ``tool_error: TypeError: unhashable type``."""
    t = Lookup()
    assert type(t).__hash__ is None
    assert run_tool(t, {"key": "a"}) == ("ok", ToolResult("1"))
    t.timeout = 0.05
    try:
        assert [run_tool(t, {"key": "hang"})[0] for _ in range(MAX_ABANDONED_PER_TOOL + 1)] == ["timeout"] * (
            MAX_ABANDONED_PER_TOOL + 1
        )
        assert abandoned_calls(t) == MAX_ABANDONED_PER_TOOL
        assert "MAX_ABANDONED_PER_TOOL" in run_tool(t, {"key": "a"})[1].content
    finally:
        t.release.set()
    deadline = time.monotonic() + 10
    while abandoned_calls(t) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert abandoned_calls(t) == 0 and run_tool(t, {"key": "a"})[0] == "ok"


def _schema_tool(parameters):
    return tool(description="x", name="finder", parameters=parameters)(lambda **kw: "")


@pytest.mark.parametrize(
    "parameters,where",
    [
        # jsonschema's own check_schema does not look at these, yet validation runs them (re.error):
        (
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",  # $defs is not a draft-7 keyword
                "properties": {"q": {"$ref": "#/$defs/word"}},
                "$defs": {"word": {"type": "string", "pattern": "[a-"}},
            },
            "$defs/word/pattern",
        ),
        (
            {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"$ref": "#/x-shared/tag"}}},
                "x-shared": {"tag": {"type": "string", "pattern": "(x"}},
            },
            "x-shared/tag/pattern",
        ),
        (
            {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "type": "object",
                "patternProperties": {"*x": {"type": "string"}},
            },
            "patternProperties/*x",
        ),
        # ... and these it does reject, less precisely (no tool-level "regular expression" message):
        (
            {
                "type": "object",
                "properties": {"q": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "a{2,1}"}]}},
            },
            "properties/q/anyOf/1/pattern",
        ),
    ],
)
def test_schema_regex_that_does_not_compile_is_refused_by_check_schema(parameters, where):
    """Before the fix a schema whose regex does not compile passed check_schema, then every call
    raised re.error inside step."""
    with pytest.raises(
        ValueError, match=rf"tool 'finder' has an invalid regular expression .* at {re.escape(where)}: "
    ):
        _schema_tool(parameters).check_schema()


def test_schema_regexes_that_compile_pass_and_names_are_not_regexes():
    _schema_tool(
        {
            "type": "object",
            "properties": {
                "q": {"type": "string", "pattern": "^[a-z]+$"},
                "pattern": {"type": "string", "enum": ["(", "["]},  # a property called "pattern"; enum values are data
            },
            "patternProperties": {"^x-": {"type": "string"}},
        }
    ).check_schema()


@pytest.mark.parametrize("timeout", [None, 1.0])
def test_a_validation_that_raises_is_a_tool_error(timeout):
    class Picky(Tool):
        name, description = "picky", "validates badly"

        def validate(self, arguments):
            raise RuntimeError("validator down")

        def execute(self):
            return "ran"

    t = Picky()
    t.timeout = timeout
    status, res = run_tool(t, {})
    assert status == "tool_error" and "could not be checked: RuntimeError: validator down" in res.content
    assert check_arguments(t, {}) == (status, res)
    # The original case: a regex jsonschema cannot compile, put in after check_schema ran.
    bad = _schema_tool({"type": "object", "properties": {"q": {"type": "string"}}})
    bad.check_schema()
    bad.parameters["properties"]["q"]["pattern"] = "[a-"
    status, res = run_tool(bad, {"q": "x"})
    assert status == "tool_error" and "could not be checked" in res.content
    assert check_arguments(add, {"a": 1})[0] == "bad_arguments" and check_arguments(add, {"a": 1, "b": 2}) is None


@pytest.mark.timeout(30)
def test_abandoned_calls_are_bounded_per_scope_and_in_total(monkeypatch):
    """The bound is per (scope, tool): callers sharing a tool object get their own, and the
    process-wide MAX_ABANDONED_TOTAL caps the threads all of them may leak together."""
    import agent_gym.tools as tools_mod

    hang = Hang()
    scopes = [object() for _ in range(4)]
    deadline = time.monotonic() + 20  # calls earlier tests abandoned (Slow sleeps 1 s) end first
    while abandoned_calls() and time.monotonic() < deadline:
        time.sleep(0.01)
    monkeypatch.setattr(tools_mod, "MAX_ABANDONED_TOTAL", abandoned_calls() + 3)
    try:
        results = [run_tool(hang, {}, scope=s) for s in scopes]
        assert [r[0] for r in results] == ["timeout"] * 4
        assert all("timed out after 0.05 s" in r[1].content for r in results[:3])
        assert "MAX_ABANDONED_TOTAL" in results[3][1].content and "not started" in results[3][1].content
        assert [abandoned_calls(hang, scope=s) for s in scopes] == [1, 1, 1, 0]
        assert abandoned_calls(scope=scopes[0]) == 1 and abandoned_calls(hang) == 0  # no scope: its own count
    finally:
        hang.release.set()
    deadline = time.monotonic() + 10
    while any(abandoned_calls(hang, scope=s) for s in scopes) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [abandoned_calls(hang, scope=s) for s in scopes] == [0] * 4
