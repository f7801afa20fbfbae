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

import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

CallStatus = Literal[
    "ok", "parse_error", "unknown_tool", "bad_arguments", "tool_error", "timeout", "budget", "too_many_calls"
]
CALL_STATUSES: tuple[str, ...] = (
    "ok",
    "parse_error",
    "unknown_tool",
    "bad_arguments",
    "tool_error",
    "timeout",
    "budget",
    "too_many_calls",
)


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
            raise ValueError(
                f"tool {self.name!r}: parameters must be a JSON-schema dict, got {type(self.parameters).__name__}"
            )
        for where, regex in _schema_regexes(self.parameters, ()):
            try:
                re.compile(regex)
            except re.error as e:  # jsonschema's check_schema accepts it, then every call would raise
                raise ValueError(
                    f"tool {self.name!r} has an invalid regular expression {regex!r} at "
                    f"{'/'.join(where)}: {e}; fix the pattern (JSON-schema patterns are run "
                    f"with Python's re) or remove it"
                ) from None
        try:
            import jsonschema  # deferred: jsonschema (~70 ms) stays out of `import agent_gym`
        except ImportError:  # pragma: no cover - jsonschema is a core dependency
            return
        try:
            jsonschema.validators.validator_for(self.parameters).check_schema(self.parameters)
        except jsonschema.SchemaError as e:
            where = "/".join(str(p) for p in e.absolute_path)
            raise ValueError(
                f"tool {self.name!r} has an invalid parameters schema{' at ' + where if where else ''}: {e.message}"
            ) from None

    def validate(self, arguments: Any) -> str | None:
        """Return an error message if ``arguments`` do not satisfy the schema, else None."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        return _validator(self.parameters)(arguments)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionTool(Tool):
    """A tool backed by a plain function; see :func:`tool`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        description: str,
        parameters: dict[str, Any],
        timeout: float | None = None,
    ):
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

# Keywords whose values are data, not subschemas: a "pattern" key inside them is not a regex.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "description", "title", "$comment"})
# Keywords whose values map names to subschemas (a property may be called "pattern" or "enum").
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _schema_regexes(node: Any, where: tuple[str, ...], names: bool = False):
    """Yield ``(path, regex)`` for every ``pattern`` and every ``patternProperties`` key in a
    schema, at any depth (subschemas under properties, items, anyOf, $defs, ...). ``names``: ``node``
    maps names to subschemas."""
    if isinstance(node, dict):
        if names:
            for k, v in node.items():
                yield from _schema_regexes(v, where + (str(k),))
            return
        if isinstance(node.get("pattern"), str):
            yield where + ("pattern",), node["pattern"]
        if isinstance(node.get("patternProperties"), dict):
            for k in node["patternProperties"]:
                if isinstance(k, str):
                    yield where + ("patternProperties", k), k
        for k, v in node.items():
            if k not in _DATA_KEYWORDS and isinstance(v, (dict, list)):
                yield from _schema_regexes(v, where + (str(k),), names=k in _NAME_MAPS)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _schema_regexes(v, where + (str(i),))


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
            import jsonschema  # deferred: jsonschema (~70 ms) stays out of `import agent_gym`

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
        if t in _JSON_TYPES and (
            not isinstance(v, _JSON_TYPES[t]) or (t in ("integer", "number") and isinstance(v, bool))
        ):
            return f"{k}: {v!r} is not of type '{t}'"
    return None


# -- execution ---------------------------------------------------------------------------------
#
# A call with a timeout runs on a thread of its own, started for that call: its timeout counts from
# the moment it starts running, never time spent waiting for a free worker. The old shared pool of
# 32 workers let 32 hung calls from one env make every other env's instant calls time out for as
# long as they hung. Python cannot kill a thread, so a timed-out call is abandoned and keeps running.
#
# Abandoned calls are bounded per (scope, tool): ``ToolEnv`` passes itself as the scope, so each
# env may have at most ``MAX_ABANDONED_PER_TOOL`` abandoned calls of each tool alive, even when
# several envs share one tool object; past that, that env's calls to that tool fail at once (status
# ``timeout``, with a message saying why) instead of starting yet another thread. One env's hung
# calls therefore never limit another env's calls, short of ``MAX_ABANDONED_TOTAL``: a process-wide
# backstop on the threads all envs may leak together (128 envs each saturating one tool stay under
# it), past which every timed call fails at once naming it. ``abandoned_calls()`` reports the
# counts. The counts live in a dict keyed by ``(id(scope), id(tool))`` holding only nonzero entries;
# each abandoned thread keeps its scope and tool alive, so an id in a key always belongs to a live
# object (no weak references: a tool need not be hashable, e.g. a ``@dataclass`` tool, and the env
# holds no lock, so it still pickles). Starting a thread costs a fraction of a millisecond (an
# instant tool: 0.51 ms per call against 0.30 ms through the old pool, on this project's 2-core
# machine under a load average of 15), small next to any call slow enough to need a timeout; tools
# with ``timeout=None`` run inline as before (0.02 ms).

MAX_ABANDONED_PER_TOOL = 8
MAX_ABANDONED_TOTAL = 1024
_ABANDONED: dict[tuple[int, int], int] = {}
_ABANDONED_LOCK = threading.Lock()


def _scope_key(t: Tool, scope: object | None) -> tuple[int, int]:
    return (id(t if scope is None else scope), id(t))


def abandoned_calls(t: Tool | None = None, scope: object | None = None) -> int:
    """How many timed-out calls are still running on their threads: of tool ``t`` in ``scope`` (the
    env that made them; ``None``: calls made without a scope), of every tool in ``scope`` when
    ``t`` is None, and in the whole process when both are None."""
    with _ABANDONED_LOCK:
        if t is not None:
            return _ABANDONED.get(_scope_key(t, scope), 0)
        if scope is not None:
            return sum(n for (s, _), n in _ABANDONED.items() if s == id(scope))
        return sum(_ABANDONED.values())


def _execute_with_timeout(t: Tool, arguments: dict[str, Any], scope: object | None) -> Any:
    """Run ``t.execute`` on a fresh daemon thread and wait at most ``t.timeout`` s for it; raises
    ``TimeoutError`` when it does not finish, re-raises what the tool raised otherwise."""
    key = _scope_key(t, scope)
    with _ABANDONED_LOCK:
        mine, total = _ABANDONED.get(key, 0), sum(_ABANDONED.values())
    if mine >= MAX_ABANDONED_PER_TOOL:
        raise _Saturated(
            f"{mine} earlier calls still running past their {t.timeout:g} s timeout (at most "
            f"tools.MAX_ABANDONED_PER_TOOL={MAX_ABANDONED_PER_TOOL} per env and tool)"
        )
    if total >= MAX_ABANDONED_TOTAL:
        raise _Saturated(
            f"{total} timed-out tool calls in this process still running "
            f"(tools.MAX_ABANDONED_TOTAL={MAX_ABANDONED_TOTAL})"
        )
    box: dict[str, Any] = {}
    state = {"abandoned": False}
    done = threading.Event()

    def target(_tool: Tool, _scope: object | None) -> None:  # the args keep both alive while it runs
        try:
            box["out"] = _tool.execute(**arguments)
        except BaseException as e:  # handed to the caller, which decides
            box["exc"] = e
        finally:
            with _ABANDONED_LOCK:
                done.set()
                if state["abandoned"]:
                    n = _ABANDONED[key] - 1
                    if n:
                        _ABANDONED[key] = n
                    else:
                        del _ABANDONED[key]

    th = threading.Thread(target=target, args=(t, scope), name=f"agent_gym-tool-{t.name}", daemon=True)
    th.start()
    if not done.wait(t.timeout):
        with _ABANDONED_LOCK:
            if not done.is_set():
                state["abandoned"] = True
                _ABANDONED[key] = _ABANDONED.get(key, 0) + 1
                raise TimeoutError
    if "exc" in box:
        raise box["exc"]
    return box["out"]


class _Saturated(Exception):
    pass


def check_arguments(t: Tool, arguments: Any) -> tuple[CallStatus, ToolResult] | None:
    """``t.validate(arguments)`` as an outcome, never an ``Exception``: ``None`` when the arguments
    are valid, ``bad_arguments`` with the message when they are not, and ``tool_error`` when the
    validation itself fails (a schema ``check_schema`` let through but ``jsonschema`` cannot apply,
    a ``validate`` override that raises): that is the tool's fault, not the agent's."""
    try:
        err = t.validate(arguments)
    except Exception as e:
        return "tool_error", ToolResult(
            f"Error: the arguments of {t.name} could not be checked: {type(e).__name__}: {_safe_str(e)}", ok=False
        )
    if err is not None:
        return "bad_arguments", ToolResult(f"Error: bad arguments for {t.name}: {err}", ok=False)
    return None


def run_tool(
    t: Tool, arguments: dict[str, Any], validate: bool = True, scope: object | None = None
) -> tuple[CallStatus, ToolResult]:
    """Validate (:func:`check_arguments`) and run one call. Every failure of the tool becomes a
    status and a message:

    - an ``Exception`` or a ``SystemExit`` raised by the tool: ``tool_error`` (a tool calling
      ``sys.exit`` must not end the training process);
    - a return value that is neither ``str`` nor :class:`ToolResult` (a list, ``None``, an object
      whose ``__str__`` raises), or a ``ToolResult`` whose ``content`` is not a ``str``:
      ``tool_error`` naming the type;
    - a call that runs past ``t.timeout``: ``timeout`` (see the note above on abandoned threads).

    ``scope`` is whoever makes the call (``ToolEnv`` passes itself): the bound on abandoned calls is
    per ``(scope, t)``, so callers sharing one tool object do not use up each other's; ``None``
    bounds them per tool object.

    ``KeyboardInterrupt`` (and other ``BaseException`` s such as ``GeneratorExit``) propagate: they
    mean "stop", and :meth:`ToolEnv.step` leaves the env as it was before the step.
    """
    if validate:
        bad = check_arguments(t, arguments)
        if bad is not None:
            return bad
    try:
        if t.timeout is None:
            out = t.execute(**arguments)
        else:
            out = _execute_with_timeout(t, arguments, scope)
    except TimeoutError:
        return "timeout", ToolResult(f"Error: {t.name} timed out after {t.timeout:g} s", ok=False)
    except _Saturated as e:
        return "timeout", ToolResult(f"Error: {t.name} not started: {e}.", ok=False)
    except (Exception, SystemExit) as e:  # a tool's own failure is the agent's observation, not a crash
        return "tool_error", ToolResult(f"Error: {t.name} failed: {type(e).__name__}: {_safe_str(e)}", ok=False)
    if isinstance(out, str):
        out = ToolResult(out)
    if not isinstance(out, ToolResult) or not isinstance(out.content, str):
        got = type(out.content if isinstance(out, ToolResult) else out).__name__
        what = "ToolResult.content" if isinstance(out, ToolResult) else "its result"
        return "tool_error", ToolResult(
            f"Error: {t.name} failed: {what} is a {got}; a tool must return a str or a ToolResult with str content.",
            ok=False,
        )
    return ("ok" if out.ok else "tool_error"), out


def cap_result(result: ToolResult, max_chars: int) -> tuple[ToolResult, int | None]:
    """``result`` with its ``content`` cut to its first ``max_chars`` characters, followed by a line
    telling the agent how much was cut; and the full length (``None`` when nothing was cut, and
    ``result`` is returned as is). ``ToolEnv`` applies it to every call's result, error messages
    included, before anything is encoded (``max_tool_output_chars``)."""
    n = len(result.content)
    if n <= max_chars:
        return result, None
    note = (
        f"\n[output truncated: {n - max_chars:,} of {n:,} characters not shown; "
        f"tool output is limited to {max_chars:,} characters]"
    )
    return ToolResult(result.content[:max_chars] + note, ok=result.ok, metadata=result.metadata), n


def _safe_str(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # an exception whose __str__ raises
        return f"<unprintable {type(e).__name__}>"
