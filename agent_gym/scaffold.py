"""Scaffolded turns: the env writes the structure of a turn around the model's part.

A small instruct model that has never seen the env's protocol rarely writes a whole tool call or
a closed ``<answer>`` tag, so RL from it gets no reward. Prefilling the assistant's turn with the
opening of a call (``<tool_call>[{"name": "search", "arguments": {"query": "``) makes it write a
query, but it does not close the structure; so the env also ends the model's part where the slot
ends (a stop string) and closes the structure itself. A :class:`Slot` says all three:

- ``prefix``: text the env appends after the generation prompt, before the model's turn. Env
  tokens (loss mask 0), encoded as a model's output would be (the format's tags are tokens where
  the tokenizer has them), never trained on.
- ``stop``: strings that end the model's part. The env reports them as ``info["stop_strings"]``
  so the sampler stops there (vLLM's ``stop``, the transformers backend's string check); the env
  also cuts the model's text at the first of them itself, so a sampler that runs on is read the
  same way.
- ``close``: text the env appends after the model's part to close the structure (env tokens).

The model's tokens stay exactly as sampled (token in, token out). Reading a turn:

- ``value`` is the model's text up to the first stop string (all of it when none occurs);
- the env parses ``prefix + value + close`` with its tool-call format (``Slot.read``); a slot
  inside a JSON string (a call's argument) reads ``value`` as JSON string content when it is
  valid as such, else escapes it, so a stray backslash or control character never breaks the
  call;
- the context holds ``prefix``, the model's tokens verbatim, then the part of ``close`` the
  model did not already write: when the stopping token carries the stop string and more
  (``"}}`` where the stop is ``"``), the env writes only ``close``'s remainder (``]</tool_call>``
  here); when the extra characters are not the start of ``close`` (``",``), the context holds them
  followed by ``close`` minus what matched (``"foo",}}]</tool_call>``), while the env reads the
  call as ``prefix + "foo" + close``. A turn the model ended itself (it sampled the end-of-turn
  or end-of-sequence token) gets no closing text in the context (it would fall outside the
  assistant's message); the env still reads it as closed.

Where the tokens come from: the prefix and the closing text are encoded on their own, as a
server that prefills an assistant message does (``continue_final_message``); the whole context
decodes to the chat template's render with ``prefix + model text + written close`` as the
assistant's content, and equals that render token for token wherever the model's part ends at a
pre-tokenizer boundary (tests/agent_gym/test_scaffold.py, four template families).

A :class:`Scaffold` picks a turn's slot: a schedule (``turns``: one entry per turn, ``None`` a
free turn; turns past the list are free), or a callable ``(env) -> Slot | None`` of the env's
state, evaluated when the turn starts. ``drop_prob`` drops a turn's slot with that probability
(drawn from the env's RNG, so a seeded reset repeats), to wean an agent off the scaffold;
``reset(options={"scaffold_drop_prob": p})`` sets it for one episode (a trainer anneals it).

In a config (``rollout.env_kwargs.scaffold``) it is a dict::

    scaffold:
      turns: [call:search, call:search, answer]   # default: call:<first tool> on every turn but the last, answer on the last
      drop_prob: 0.0
      slots: {mine: {prefix: "...", stop: ["\\n"], close: "..."}}   # named slots of your own

``call:<tool>`` is a call to a tool with one string argument (``call:<tool>.<argument>`` names
it), written in the env's tool format (``ToolCallFormat.call_text``); ``answer`` is
``<answer>`` ... ``</answer>``, stopping where a tag starts (``<``) or at a blank line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

ANSWER_SLOT = "answer"
_MARK = "SLOTVALUEq7z"  # stands for the value while a format writes a call around it


@dataclass(frozen=True)
class Slot:
    """One scaffolded turn: what the env writes before (``prefix``) and after (``close``) the model's
    part, which ends at the first of ``stop``. ``json_string``: the value sits inside a JSON string
    (read as JSON string content, escaped when it is not valid as such)."""

    prefix: str
    stop: tuple[str, ...]
    close: str
    json_string: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not isinstance(self.close, str):
            raise TypeError(f"scaffold slot {self.name!r}: prefix and close must be strings")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not stop or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(
                f"scaffold slot {self.name!r}: stop must be a non-empty list of non-empty strings, "
                f"got {self.stop!r}: without one the model's part would run to the end of its turn"
            )
        object.__setattr__(self, "stop", stop)

    def cut(self, text: str) -> tuple[str, str | None]:
        """``(value, tail)``: the model's text before the first stop string, and the text from that
        stop string on (``None`` when no stop string occurs: the value is the whole text)."""
        best = None
        for s in self.stop:
            i = text.find(s)
            if i >= 0 and (best is None or i < best):
                best = i
        return (text, None) if best is None else (text[:best], text[best:])

    def read(self, value: str) -> str:
        """The text the env parses for a turn whose model part is ``value``."""
        if self.json_string:
            try:
                json.loads('"' + value + '"')
            except ValueError:
                value = json.dumps(value)[1:-1]
        return self.prefix + value + self.close

    def close_to_write(self, tail: str | None) -> str:
        """The part of ``close`` the env writes after the model's tokens, given the text the model
        wrote from the stop string on (``tail``): ``close`` minus the longest start of it that
        ``tail`` already holds."""
        if not tail:
            return self.close
        k = 0
        while k < min(len(tail), len(self.close)) and tail[k] == self.close[k]:
            k += 1
        return self.close[k:]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "prefix": self.prefix,
            "stop": list(self.stop),
            "close": self.close,
            "json_string": self.json_string,
        }


def answer_slot() -> Slot:
    """``<answer>`` + the model's answer + ``</answer>``. The answer ends where a tag starts (``<``:
    ``</answer>``, or a ``<tool_response>`` the model makes up) or at a blank line. Not at a single
    newline: SmolLM2-135M-Instruct starts most answers with one, which left 33% of its sampled
    answers empty (8% with these stops; 12 training questions x 4 samples, docs/results.md)."""
    return Slot("<answer>", ("<", "\n\n"), "</answer>", name=ANSWER_SLOT)


def call_slot(fmt: Any, tool: Any, argument: str | None = None) -> Slot:
    """A call to ``tool`` with its one string argument (or ``argument``) as the model's part, written
    the way ``fmt`` (a :class:`~agent_gym.formats.ToolCallFormat`) writes calls."""
    schema = tool.schema()
    params = schema.get("function", schema).get("parameters") or {}
    props = params.get("properties") or {}
    if argument is None:
        strings = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"]
        required = list(params.get("required") or [])
        if len(strings) != 1 or any(r != strings[0] for r in required):
            raise ValueError(
                f"scaffold 'call:{tool.name}': the tool must take exactly one string argument to "
                f"fill, it has properties {sorted(props)} (required {required}); name one as "
                f"'call:{tool.name}.<argument>' or write the slot out under scaffold.slots"
            )
        argument = strings[0]
    elif argument not in props:
        raise ValueError(
            f"scaffold 'call:{tool.name}.{argument}': the tool has no argument {argument!r} (it has {sorted(props)})"
        )
    else:
        other = [r for r in (params.get("required") or []) if r != argument]
        if other:
            raise ValueError(
                f"scaffold 'call:{tool.name}.{argument}': the tool also requires {other}, which a "
                "one-value slot cannot fill; write the slot out under scaffold.slots"
            )
    text = fmt.call_text(tool.name, {argument: _MARK})
    if text.count(_MARK) != 1:
        raise ValueError(
            f"tool format {fmt.name!r} does not write the argument verbatim once; write the slot out "
            "under scaffold.slots"
        )
    prefix, close = text.split(_MARK)
    if prefix.endswith('"') and close.startswith('"'):  # inside a JSON string: the closing quote ends it
        return Slot(prefix, ('"', "\n"), close, json_string=True, name=f"call:{tool.name}")
    first_tag = close[: close.find(">") + 1] if close.startswith("<") and ">" in close else close
    stops = tuple(dict.fromkeys(s for s in (first_tag, "\n") if s))
    return Slot(prefix, stops, close, name=f"call:{tool.name}")


SlotSpec = Any
"""A schedule entry: a :class:`Slot`, a slot name (``answer``, ``call:<tool>``, ``call:<tool>.<arg>``
or a key of ``slots``), a dict of :class:`Slot`'s fields, or ``None`` (a free turn)."""


@dataclass
class Scaffold:
    """Which slot each turn gets (the module docstring). ``turns``: a list of slot specs, turn ``t``
    (from 1) taking entry ``t - 1`` and turns past the list free; or a callable ``(env) -> Slot |
    None``, evaluated when a turn starts. ``drop_prob``: the chance that a turn's slot is dropped."""

    turns: Sequence[Slot | None] | Callable[[Any], Slot | None]
    drop_prob: float = 0.0
    slots: dict[str, Slot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_drop_prob(self.drop_prob)
        if not callable(self.turns):
            self.turns = list(self.turns)
            bad = [t for t in self.turns if t is not None and not isinstance(t, Slot)]
            if bad:
                raise TypeError(f"Scaffold.turns holds {bad[0]!r}; build it with Scaffold.build(...) from names")

    @classmethod
    def build(cls, spec: Any, env: Any) -> Scaffold | None:
        """A scaffold from an env argument: ``None``/``False`` (none), ``True`` (the default
        schedule), a :class:`Scaffold`, a callable, or a dict with ``turns``, ``drop_prob`` and
        ``slots`` (the module docstring). Unknown keys and names fail here, naming what is valid."""
        if spec is None or spec is False:
            return None
        if isinstance(spec, Scaffold):
            return spec
        if callable(spec):
            return cls(spec)
        if spec is True:
            spec = {}
        if not isinstance(spec, dict):
            raise TypeError(
                f"scaffold must be a dict (turns, drop_prob, slots), true, a Scaffold or a callable, got "
                f"{type(spec).__name__}"
            )
        unknown = sorted(set(spec) - {"turns", "drop_prob", "slots"})
        if unknown:
            raise ValueError(f"unknown scaffold key(s) {unknown}; valid keys: ['drop_prob', 'slots', 'turns']")
        own = {}
        for name, s in (spec.get("slots") or {}).items():
            own[name] = _slot_from(s, name, env, {})
        turns = spec.get("turns")
        if turns is None:
            if not env.tools:
                turns = [ANSWER_SLOT]
            else:
                first = next(iter(env.tools))
                turns = [f"call:{first}"] * (env.max_turns - 1) + [ANSWER_SLOT]
        if isinstance(turns, (str, dict)) or not isinstance(turns, (list, tuple)):
            raise TypeError(f"scaffold.turns must be a list (one slot per turn), got {turns!r}")
        return cls(
            [None if t is None else _slot_from(t, f"turn {i + 1}", env, own) for i, t in enumerate(turns)],
            drop_prob=spec.get("drop_prob", 0.0),
            slots=own,
        )

    def slot(self, env: Any, turn: int) -> Slot | None:
        """Turn ``turn``'s slot (from 1) before any drop."""
        if callable(self.turns):
            s = self.turns(env)
            if s is not None and not isinstance(s, Slot):
                raise TypeError(f"the scaffold callable returned {s!r}; it must return a Slot or None")
            return s
        return self.turns[turn - 1] if 0 < turn <= len(self.turns) else None


def check_drop_prob(p: Any) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"scaffold drop_prob must be a number in [0, 1], got {p!r}")
    return float(p)


def _slot_from(spec: SlotSpec, where: str, env: Any, own: dict[str, Slot]) -> Slot:
    if isinstance(spec, Slot):
        return spec
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - {"prefix", "stop", "close", "json_string", "name"})
        missing = sorted({"prefix", "stop", "close"} - set(spec))
        if unknown or missing:
            raise ValueError(
                f"scaffold slot {where}: unknown key(s) {unknown}, missing {missing}; a slot has "
                "prefix, stop, close (and json_string)"
            )
        return Slot(**{"name": where, **spec})
    if not isinstance(spec, str):
        raise TypeError(f"scaffold slot {where}: expected a slot name or a dict, got {spec!r}")
    if spec in own:
        return own[spec]
    if spec == ANSWER_SLOT:
        return answer_slot()
    if spec.startswith("call:"):
        name, _, arg = spec[len("call:") :].partition(".")
        tool = env.tools.get(name)
        if tool is None:
            raise ValueError(f"scaffold slot {spec!r}: this env has no tool {name!r} (it has {sorted(env.tools)})")
        return call_slot(env.format, tool, arg or None)
    raise ValueError(
        f"scaffold slot {spec!r} is unknown; valid: 'answer', 'call:<tool>', 'call:<tool>.<argument>'"
        f", null (a free turn) or a name under scaffold.slots ({sorted(own)})"
    )
