"""Tool-call formats: how an assistant turn's text becomes tool calls and an answer, and how
tool results become the next messages.

Two formats ship, in a small registry (``get_format(name)``):

- ``hermes``: Qwen2.5/Hermes style, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
  each result is a ``tool`` message (the chat template wraps it in ``<tool_response>``).
- ``search_r1``: Search-R1 style, ``<search>query</search>``, answered with
  ``<information>...</information>``. Search-R1 splices the information into the same assistant
  turn; here it arrives as a ``user`` message after the assistant turn closes, so every format
  has the same turn structure and the same token-exact chat-template delta.

Both read the final answer from ``<answer>...</answer>``. Parsers never raise, on any input, and
run in time linear in the text's length (:func:`tag_spans`). ``parse(text, max_calls=k)`` reads at
most ``k`` calls: the ones after them are counted (``ParsedTurn.calls_skipped``) but not parsed, so a
turn of thousands of calls costs little more than ``k`` (``ToolEnv`` passes its
``max_calls_per_turn``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from agent_gym.tools import Tool, ToolResult


@dataclass
class ToolCall:
    """One call found in a turn. ``error`` is set when it could not be parsed (status
    ``parse_error``); ``name`` is then the best guess or ``None``."""

    name: str | None
    arguments: dict[str, Any]
    raw: str
    error: str | None = None


@dataclass
class ParsedTurn:
    text: str
    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    calls_skipped: int = 0
    """Calls in the text after the first ``max_calls``: counted, not parsed, not run."""


@dataclass
class CallOutcome:
    call: ToolCall
    status: str
    result: ToolResult
    output_chars: int | None = None
    """When the result's text was cut to the env's ``max_tool_output_chars``: its full length in
    characters (``None``: not cut)."""


def tag_spans(text: str, open_tag: str, close_tag: str):
    """Yield ``(start, body_start, body_end, end)`` of each ``open_tag ... close_tag`` pair, left to
    right, each body ending at the first ``close_tag`` after its opening tag (what the non-greedy
    regex ``open(.*?)close`` matches, with DOTALL).

    Linear in ``len(text)``: the regex restarts its search for a closing tag at every opening tag,
    which is quadratic on a run of unclosed tags (7,000 ``<tool_call>`` took 13 s); here, once no
    closing tag is left, no later opening tag can be closed either, so the scan stops.
    """
    pos = 0
    while True:
        i = text.find(open_tag, pos)
        if i < 0:
            return
        body = i + len(open_tag)
        j = text.find(close_tag, body)
        if j < 0:
            return
        pos = j + len(close_tag)
        yield i, body, j, pos


class _Capped:
    """The call budget of one ``parse``: ``spans`` yields the tag spans while ``turn.calls`` has room
    for another call and counts the spans after that in ``turn.calls_skipped`` (a scan for the tags,
    no parsing); ``room()`` says whether one more call (an unclosed tag) may be added, else counts
    it as skipped."""

    def __init__(self, turn: ParsedTurn, max_calls: int | None):
        self.turn, self.max_calls = turn, max_calls

    def room(self) -> bool:
        if self.max_calls is None or len(self.turn.calls) < self.max_calls:
            return True
        self.turn.calls_skipped += 1
        return False

    def spans(self, text: str, open_tag: str, close_tag: str):
        spans = tag_spans(text, open_tag, close_tag)
        for span in spans:
            if not self.room():
                self.turn.calls_skipped += sum(1 for _ in spans)
                return
            yield span


CALL_IN_TEXT = re.compile(r'"name"\s*:\s*"[^"]*"\s*,\s*"arguments"|<tool_call>|<search>')
"""A tool call of the shipped formats inside a text, tagged or not: a JSON call's ``"name": ...,
"arguments"`` (the body of ``hermes`` and ``smollm2`` calls, which a scaffold's answer slot can hold
without the tags) or a ``<tool_call>`` / ``<search>`` tag. ``ToolEnv`` reads answers with it and with
its own format's parser (``Episode.answer_holds_call``); ``benchmarks/analysis/qa_answers.py`` with it."""


def _parse_answer(text: str) -> str | None:
    last = None
    for _, b, e, _ in tag_spans(text, "<answer>", "</answer>"):
        last = (b, e)
    return text[last[0] : last[1]].strip() if last else None


class ToolCallFormat:
    """Base class of a format. ``uses_template_tools``: pass the tool schemas to the chat template
    (``apply_chat_template(tools=...)``) rather than describing them in the system prompt."""

    name: str = ""
    uses_template_tools: bool = False

    def parse(self, text: str, max_calls: int | None = None) -> ParsedTurn:
        """The turn's calls and answer. ``max_calls``: read at most that many calls, in order, and
        count the rest in ``calls_skipped`` without parsing them (``None``: read all)."""
        raise NotImplementedError

    def result_messages(self, outcomes: list[CallOutcome]) -> list[dict[str, str]]:
        raise NotImplementedError

    def instructions(self, tools: list[Tool]) -> str:
        """Text appended to the system prompt that tells the model how to call tools."""
        raise NotImplementedError

    def check_tools(self, tools: list[Tool]) -> None:
        """Raise ValueError if this format cannot drive ``tools``."""

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        """The text of an assistant turn that makes one call in this format (what scripted
        policies and demonstrations write, so they teach the format the env parses); ``parse``
        reads it back as that call. Raises ValueError for a call the format cannot express."""
        raise NotImplementedError(f"tool format {self.name!r} does not say how to write a call")

    def nudge(self) -> str:
        """The message sent when a turn holds neither a call nor an answer."""
        return (
            "Your reply contained no tool call and no final answer. Call a tool, or give the "
            "final answer as <answer>...</answer>."
        )


_FORMATS: dict[str, Callable[[], ToolCallFormat]] = {}


def register_format(name: str):
    def deco(cls):
        if name in _FORMATS and _FORMATS[name] is not cls:
            raise ValueError(f"tool-call format {name!r} is already registered to {_FORMATS[name]!r}")
        cls.name = name
        _FORMATS[name] = cls
        return cls

    return deco


def get_format(name: str | ToolCallFormat) -> ToolCallFormat:
    if isinstance(name, ToolCallFormat):
        return name
    if name not in _FORMATS:
        raise ValueError(f"unknown tool_format {name!r}; valid formats: {sorted(_FORMATS)}")
    return _FORMATS[name]()


def list_formats() -> list[str]:
    return sorted(_FORMATS)


@register_format("hermes")
class HermesFormat(ToolCallFormat):
    uses_template_tools = True

    def parse(self, text: str, max_calls: int | None = None) -> ParsedTurn:
        turn = ParsedTurn(text=text, answer=_parse_answer(text))
        calls = _Capped(turn, max_calls)
        for _, b, e, _ in calls.spans(text, "<tool_call>", "</tool_call>"):
            turn.calls.append(self._parse_call(text[b:e]))
        closed = text.count("</tool_call>")
        if text.count("<tool_call>") > closed and calls.room():
            tail = text[text.rfind("<tool_call>") :]
            turn.calls.append(ToolCall(None, {}, tail, "unclosed <tool_call> tag"))
        return turn

    @staticmethod
    def _parse_call(body: str) -> ToolCall:
        raw = body
        try:
            obj = json.loads(body.strip())
        except (ValueError, RecursionError) as e:
            return ToolCall(None, {}, raw, f"tool call is not valid JSON ({e})")
        if not isinstance(obj, dict):
            return ToolCall(None, {}, raw, "tool call must be a JSON object with 'name' and 'arguments'")
        name = obj.get("name")
        if not isinstance(name, str):
            return ToolCall(None, {}, raw, "tool call has no string 'name'")
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models emit the arguments as a JSON string
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return ToolCall(name, {}, raw, "'arguments' is a string that is not a JSON object")
        if not isinstance(args, dict):
            return ToolCall(name, {}, raw, "'arguments' must be a JSON object")
        return ToolCall(name, args, raw)

    def result_messages(self, outcomes: list[CallOutcome]) -> list[dict[str, str]]:
        return [{"role": "tool", "content": o.result.content} for o in outcomes]

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

    def instructions(self, tools: list[Tool]) -> str:
        return (
            'Call tools with <tool_call>{"name": <tool name>, "arguments": {...}}</tool_call>. '
            "When you know the answer, reply with <answer>...</answer>."
        )


@register_format("search_r1")
class SearchR1Format(ToolCallFormat):
    uses_template_tools = False

    def parse(self, text: str, max_calls: int | None = None) -> ParsedTurn:
        turn = ParsedTurn(text=text, answer=_parse_answer(text))
        calls = _Capped(turn, max_calls)
        for s, b, e, end in calls.spans(text, "<search>", "</search>"):
            q = text[b:e].strip()
            if q:
                turn.calls.append(ToolCall("search", {"query": q}, text[s:end]))
            else:
                turn.calls.append(ToolCall("search", {}, text[s:end], "empty <search></search> query"))
        if text.count("<search>") > text.count("</search>") and calls.room():
            turn.calls.append(ToolCall("search", {}, text[text.rfind("<search>") :], "unclosed <search> tag"))
        return turn

    def result_messages(self, outcomes: list[CallOutcome]) -> list[dict[str, str]]:
        body = "\n".join(o.result.content for o in outcomes)
        return [{"role": "user", "content": f"<information>{body}</information>"}]

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        if name != "search" or set(arguments) != {"query"}:
            raise ValueError(
                f"tool_format 'search_r1' writes only search(query) calls, not {name}({sorted(arguments)})"
            )
        return f"<search>{arguments['query']}</search>"

    def check_tools(self, tools: list[Tool]) -> None:
        names = [t.name for t in tools]
        if "search" not in names:
            raise ValueError(
                f"tool_format 'search_r1' needs a tool named 'search'; this env has {names}. "
                "Use tool_format='hermes' for other tools."
            )

    def instructions(self, tools: list[Tool]) -> str:
        return (
            "To search, write <search> query </search>; the results come back between "
            "<information> and </information>. When you know the answer, reply with "
            "<answer>...</answer>."
        )


@register_format("smollm2")
class SmolLM2Format(HermesFormat):
    """``tool_format: smollm2``: the layout SmolLM2's function-calling data used (the SmolLM2
    instruct models were tuned on Argilla's Synth-APIGen; Ollama's published SmolLM2 template, for
    all three sizes, spells it out): the tool signatures as JSON inside ``<tools></tools>`` in the
    system prompt, a turn's calls as one JSON *list* inside ``<tool_call>...</tool_call>``, and
    each result as a user message ``<tool_response>...</tool_response>``. A single object inside
    the tags is read as one call too. The answer is read from ``<answer>...</answer>`` as in every
    format. SmolLM2's chat template has no tool support, so nothing goes through its ``tools``
    (docs/models/smollm2.md)."""

    uses_template_tools = False

    def parse(self, text: str, max_calls: int | None = None) -> ParsedTurn:
        turn = ParsedTurn(text=text, answer=_parse_answer(text))
        for _, b, e, _ in tag_spans(text, "<tool_call>", "</tool_call>"):
            body = text[b:e]
            try:
                obj = json.loads(body.strip())
            except (ValueError, RecursionError):
                obj = None
            if isinstance(obj, list):
                turn.calls += [self._parse_call(json.dumps(o)) for o in obj]
            else:
                turn.calls.append(self._parse_call(body))
        if text.count("<tool_call>") > text.count("</tool_call>"):
            turn.calls.append(ToolCall(None, {}, text[text.rfind("<tool_call>") :], "unclosed <tool_call> tag"))
        if max_calls is not None and len(turn.calls) > max_calls:  # the env's per-turn cap
            turn.calls_skipped += len(turn.calls) - max_calls
            del turn.calls[max_calls:]
        return turn

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        return "<tool_call>" + json.dumps([{"name": name, "arguments": arguments}]) + "</tool_call>"

    def result_messages(self, outcomes: list[Any]) -> list[dict[str, str]]:
        body = "\n".join(f"<tool_response>\n{o.result.content}\n</tool_response>" for o in outcomes)
        return [{"role": "user", "content": body}]

    def instructions(self, tools: list[Any]) -> str:
        sigs = json.dumps([t.schema()["function"] if "function" in t.schema() else t.schema() for t in tools])
        return (
            "You have access to the following tools:\n<tools>" + sigs + "</tools>\n"
            "To call tools, write a list of calls in this format:\n"
            '<tool_call>[{"name": "func_name", "arguments": {"argument1": "value1"}}]</tool_call>\n'
            "When you know the answer, reply with <answer>...</answer>."
        )


_ANSWER_LEAD = re.compile(r"(?:the\s+)?(?:final\s+|short\s+)?answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)


def answer_from_text(text: str) -> str | None:
    """The short answer a reply without ``<answer>`` tags gives in plain text (``answer_source:
    text``): "yes" or "no" when it starts with one; else the words after its last "answer is" /
    "answer:" if it has one, else its first line; cut at the first sentence end (a period followed
    by a space or the end) and stripped of quotes and markdown emphasis. None for a reply with no
    text. E.g. "The answer is: 2009." -> "2009"."""
    text = text.strip()
    if not text:
        return None
    yes_no = re.match(r"(yes|no)\b", text, re.IGNORECASE)
    if yes_no:  # "No, Scott Derrickson and Ed Wood were not ..." answers a yes/no question
        return yes_no.group(1).lower()
    leads = list(_ANSWER_LEAD.finditer(text))
    rest = text[leads[-1].end() :] if leads else text
    line = rest.strip().split("\n", 1)[0]
    end = re.search(r"\.(?:\s|$)", line)
    out = (line[: end.start()] if end else line).strip().strip("*\"'` ").strip()
    return out or None
