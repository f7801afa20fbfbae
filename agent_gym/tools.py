"""Tools: one atomic action each, returning its raw result.

A tool is a name, a description, a JSON-schema for its arguments (checked before it runs), an
``execute`` method and an optional timeout. Interpreting the result (rewards, the next
observation) is the env's job, not the tool's.

The shortest way to write one::

    @tool(description="Add two integers.",
          parameters={"type": "object",
                      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]})
    def add(a: int, b: int) -> str:
        return str(a + b)
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

CallStatus = Literal["ok", "parse_error", "unknown_tool", "bad_arguments", "tool_error", "timeout", "budget"]
CALL_STATUSES: tuple[str, ...] = ("ok", "parse_error", "unknown_tool", "bad_arguments", "tool_error", "timeout", "budget")


@dataclass
class ToolResult:
    """What a tool returns. ``content`` is shown to the agent; ``metadata`` is for the env only
    (for example the titles a search returned, used by process rewards)."""

    content: str
    ok: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


class Tool:
    """Base class. Subclasses set ``name``, ``description``, ``parameters`` and implement
    ``execute(**arguments)``. ``timeout`` (seconds) runs the call on a worker thread and gives up
    after that long; ``None`` runs it inline (right for pure in-memory lookups)."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    timeout: float | None = None

    def execute(self, **arguments: Any) -> ToolResult | str:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Qwen function schema, as passed to ``apply_chat_template(tools=...)``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check_schema(self) -> None:
        """Raise ``ValueError`` naming the tool if ``parameters`` is not a valid JSON schema
        (``ToolEnv`` calls it at construction, so a bad schema never reaches a step)."""
        if not isinstance(self.parameters, dict):
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON-schema dict, got {type(self.parameters).__name__}")
        try:
            import jsonschema
        except ImportError:  # pragma: no cover - jsonschema is a core dependency
            return
        try:
            jsonschema.validators.validator_for(self.parameters).check_schema(self.parameters)
        except jsonschema.SchemaError as e:
            where = "/".join(str(p) for p in e.absolute_path)
            raise ValueError(f"tool {self.name!r} has an invalid parameters schema"
                             f"{' at ' + where if where else ''}: {e.message}") from None

    def validate(self, arguments: Any) -> str | None:
        """Return an error message if ``arguments`` do not satisfy the schema, else None."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        return _validator(self.parameters)(arguments)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionTool(Tool):
    """A tool backed by a plain function; see :func:`tool`."""

    def __init__(self, fn: Callable[..., Any], name: str, description: str, parameters: dict[str, Any],
                 timeout: float | None = None):
        self.fn = fn
        self.name = name
        self.description = description
        self.parameters = parameters
        self.timeout = timeout

    def execute(self, **arguments: Any) -> ToolResult | str:
        return self.fn(**arguments)


def tool(description: str, parameters: dict[str, Any], name: str | None = None, timeout: float | None = None):
    """Decorator that turns a function into a :class:`Tool`."""

    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(fn, name or fn.__name__, description, parameters, timeout)

    return wrap


# -- argument validation ---------------------------------------------------------------------

_VALIDATORS: dict[int, Callable[[dict], str | None]] = {}
_VALIDATORS_LOCK = threading.Lock()


def _validator(schema: dict[str, Any]) -> Callable[[dict], str | None]:
    """A cached validator per schema object. Uses ``jsonschema`` when installed; the built-in
    fallback checks required keys, unknown keys (when additionalProperties is false) and the
    primitive JSON types, which covers the tool schemas in this project."""
    key = id(schema)
    fn = _VALIDATORS.get(key)
    if fn is not None:
        return fn
    with _VALIDATORS_LOCK:
        try:
            import jsonschema

            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            v = cls(schema)

            def fn(args: dict, _v=v) -> str | None:
                err = next(iter(_v.iter_errors(args)), None)
                if err is None:
                    return None
                where = "/".join(str(p) for p in err.absolute_path)
                return f"{where + ': ' if where else ''}{err.message}"
        except ImportError:  # pragma: no cover - jsonschema is a core dependency
            fn = lambda args, _s=schema: _basic_check(_s, args)  # noqa: E731
        # Keep the schema alive with its validator so id() is never reused for another dict.
        _VALIDATORS[key] = fn
        fn.__dict__["_schema"] = schema
        return fn


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def _basic_check(schema: dict[str, Any], args: dict) -> str | None:
    props = schema.get("properties", {})
    for k in schema.get("required", []):
        if k not in args:
            return f"'{k}' is a required property"
    for k, v in args.items():
        if k not in props:
            if schema.get("additionalProperties", True) is False:
                return f"unexpected argument '{k}'"
            continue
        t = props[k].get("type")
        if t in _JSON_TYPES and (not isinstance(v, _JSON_TYPES[t]) or (t in ("integer", "number") and isinstance(v, bool))):
            return f"{k}: {v!r} is not of type '{t}'"
    return None


# -- execution ---------------------------------------------------------------------------------
#
# A call with a timeout runs on a thread of its own, started for that call: its timeout counts from
# the moment it starts running, never time spent waiting for a free worker. The old shared pool of
# 32 workers let 32 hung calls from one env make every other env's instant calls time out for as
# long as they hung. Python cannot kill a thread, so a timed-out call is abandoned and keeps running;
# each tool object may have at most ``MAX_ABANDONED_PER_TOOL`` abandoned calls alive. Past that, a
# call to the same tool fails at once (status ``timeout``, with a message saying why) instead of
# starting yet another thread, which bounds the threads one misbehaving tool can leak. Envs build
# their own tool objects, so one env's hung tool never limits another env's calls. Starting a thread
# costs a fraction of a millisecond (an instant tool: 0.51 ms per call against 0.30 ms through the
# old pool, on this project's 2-core machine under a load average of 15), small next to any call
# slow enough to need a timeout; tools with ``timeout=None`` run inline as before (0.02 ms).

MAX_ABANDONED_PER_TOOL = 8
_ABANDONED: "weakref.WeakKeyDictionary[Tool, int]" = weakref.WeakKeyDictionary()
_ABANDONED_LOCK = threading.Lock()


def abandoned_calls(t: Tool) -> int:
    """How many timed-out calls of ``t`` are still running on their threads."""
    with _ABANDONED_LOCK:
        return _ABANDONED.get(t, 0)


def _execute_with_timeout(t: Tool, arguments: dict[str, Any]) -> Any:
    """Run ``t.execute`` on a fresh daemon thread and wait at most ``t.timeout`` s for it; raises
    ``TimeoutError`` when it does not finish, re-raises what the tool raised otherwise."""
    with _ABANDONED_LOCK:
        if _ABANDONED.get(t, 0) >= MAX_ABANDONED_PER_TOOL:
            raise _Saturated()
    box: dict[str, Any] = {}
    state = {"abandoned": False}
    done = threading.Event()

    def target() -> None:
        try:
            box["out"] = t.execute(**arguments)
        except BaseException as e:  # handed to the caller, which decides
            box["exc"] = e
        finally:
            with _ABANDONED_LOCK:
                done.set()
                if state["abandoned"]:
                    _ABANDONED[t] = _ABANDONED.get(t, 1) - 1

    th = threading.Thread(target=target, name=f"agent_gym-tool-{t.name}", daemon=True)
    th.start()
    if not done.wait(t.timeout):
        with _ABANDONED_LOCK:
            if not done.is_set():
                state["abandoned"] = True
                _ABANDONED[t] = _ABANDONED.get(t, 0) + 1
                raise TimeoutError
    if "exc" in box:
        raise box["exc"]
    return box["out"]


class _Saturated(Exception):
    pass


def run_tool(t: Tool, arguments: dict[str, Any], validate: bool = True) -> tuple[CallStatus, ToolResult]:
    """Validate and run one call. Every failure of the tool becomes a status and a message:

    - an ``Exception`` or a ``SystemExit`` raised by the tool: ``tool_error`` (a tool calling
      ``sys.exit`` must not end the training process);
    - a return value that is neither ``str`` nor :class:`ToolResult` (a list, ``None``, an object
      whose ``__str__`` raises), or a ``ToolResult`` whose ``content`` is not a ``str``:
      ``tool_error`` naming the type;
    - a call that runs past ``t.timeout``: ``timeout`` (see the note above on abandoned threads).

    ``KeyboardInterrupt`` (and other ``BaseException`` s such as ``GeneratorExit``) propagate: they
    mean "stop", and :meth:`ToolEnv.step` leaves the env as it was before the step.
    """
    err = t.validate(arguments) if validate else None
    if err is not None:
        return "bad_arguments", ToolResult(f"Error: bad arguments for {t.name}: {err}", ok=False)
    try:
        if t.timeout is None:
            out = t.execute(**arguments)
        else:
            out = _execute_with_timeout(t, arguments)
    except TimeoutError:
        return "timeout", ToolResult(f"Error: {t.name} timed out after {t.timeout:g} s", ok=False)
    except _Saturated:
        return "timeout", ToolResult(
            f"Error: {t.name} has {MAX_ABANDONED_PER_TOOL} earlier calls still running past their "
            f"{t.timeout:g} s timeout; not started.", ok=False)
    except (Exception, SystemExit) as e:  # a tool's own failure is the agent's observation, not a crash
        return "tool_error", ToolResult(f"Error: {t.name} failed: {type(e).__name__}: {_safe_str(e)}", ok=False)
    if isinstance(out, str):
        out = ToolResult(out)
    if not isinstance(out, ToolResult) or not isinstance(out.content, str):
        got = type(out.content if isinstance(out, ToolResult) else out).__name__
        what = "ToolResult.content" if isinstance(out, ToolResult) else "its result"
        return "tool_error", ToolResult(
            f"Error: {t.name} failed: {what} is a {got}; a tool must return a str or a ToolResult with str content.",
            ok=False)
    return ("ok" if out.ok else "tool_error"), out


def _safe_str(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # an exception whose __str__ raises
        return f"<unprintable {type(e).__name__}>"
