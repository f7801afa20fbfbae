"""AgentR1/{HotpotQA,2WikiMultiHopQA,MuSiQue}-NaiveRAG-v0: retrieve once, answer in one turn.

The retrieval-augmented baseline of the Agent-R1 paper: the passages are retrieved for the
question before the agent sees it, and the agent has no tools.

Card
----
Task
    The questions of the dataset (HotpotQA, 2WikiMultiHopQA or MuSiQue), exactly as in the
    tool-using envs (``envs/hotpotqa.py``, ``envs/twowiki.py``, ``envs/musique.py``).
Tools
    None. ``max_turns`` is fixed at 1 and every episode *terminates* after its single turn:
    with an ``<answer>...</answer>`` it is scored (with ``answer_source="text"`` a reply without
    tags or calls is scored on :func:`answer_from_text`, with no ``format`` reward and
    ``info["answer_extracted"]`` True); without one it ends with no outcome reward,
    ``info["answer"]`` None and ``info["truncation_reason"]`` ``"max_turns"``; an action longer
    than the context left is cut to it, never parsed or scored, and ends with
    ``"context"``. ``info["truncation_reason"]`` is always ``info["trajectory"].truncation_reason``
    (None only when the agent answered): the reason the episode ended without an answer,
    though it terminated. (Terminated, not truncated: the task is one step long, so there is no
    later state to bootstrap a value from; Gymnasium's checker also rejects an env that
    truncates after one random step.) A tool call in the turn gets status ``unknown_tool`` or
    ``parse_error``.
Observation
    The system prompt, then one user message: ``Passages:`` followed by the ``topk`` (default 3)
    passages that the retriever returns for the question, one per line as
    ``Doc i (Title: <title>) <text>``, cut to ``max_result_tokens`` (default 512) tokens as the
    search tool's results are, then ``Question: <question>``. Passages are retrieved at reset
    and memoized per question (a GRPO group retrieves once). A retriever failure at reset does
    not raise: the message says that retrieval failed, and ``info["retrieval_error"]`` holds the
    error ("" otherwise). ``info["retrieved_titles"]`` lists the titles shown and
    ``info["supporting_found"]`` / ``info["supporting_total"]`` count the supporting
    paragraphs among them (retrieval recall, for analysis; it pays no reward).
Reward
    As the tool envs: ``answer_metric`` (default ``"em"``) with weight 1; ``em`` and ``f1`` are
    those of the dataset's official script (see its card), logged in ``info["answer_scores"]``,
    ``rewards["format"]`` (default 0) for an answer in tags. No process rewards (no calls).
Data
    The same as the tool envs: ``data_path``, ``split``, ``limit``, and the retriever over
    ``corpus_path`` or, by default, over the split's own context paragraphs.
Parameters
    Those of :class:`envs.qa.MultiHopQAEnv` except ``lookup_tool`` and ``max_turns``; default
    ``max_context_tokens`` 4096; ``answer_source`` ``"tags"`` (default) or ``"text"``.
Versions
    v0: first release.
"""

from __future__ import annotations

import inspect
import re
from collections import OrderedDict
from typing import Any

from agent_gym.formats import ParsedTurn, ToolCallFormat
from agent_gym.registration import register_env
from agent_gym.tools import Tool
from envs.qa import MultiHopQAEnv

NAIVE_RAG_PROMPT = (
    "Answer the question using the passages (not all of them are relevant). Give only the final "
    "short answer (a name, a date, a number, yes or no) inside <answer></answer>."
)


ANSWER_SOURCES = ("tags", "text")

_LEAD = re.compile(r"(?:the\s+)?(?:final\s+|short\s+)?answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)


def answer_from_text(text: str) -> str | None:
    """The answer a reply without ``<answer>`` tags gives in plain text (``answer_source: text``):
    "yes" or "no" when it starts with one; else the words after its last "answer is" / "answer:"
    if it has one, else its first line; cut at
    the first sentence end (a period followed by a space or the end) and stripped of quotes and
    markdown emphasis. None for a reply with no text. E.g. "The answer is: 2009." -> "2009"."""
    text = text.strip()
    if not text:
        return None
    yes_no = re.match(r"(yes|no)\b", text, re.IGNORECASE)
    if yes_no:  # "No, Scott Derrickson and Ed Wood were not ..." answers a yes/no question
        return yes_no.group(1).lower()
    leads = list(_LEAD.finditer(text))
    rest = text[leads[-1].end():] if leads else text
    line = rest.strip().split("\n", 1)[0]
    end = re.search(r"\.(?:\s|$)", line)
    out = (line[: end.start()] if end else line).strip().strip("*\"'` ").strip()
    return out or None


class _TextAnswerFormat(ToolCallFormat):
    """A format whose answer falls back to :func:`answer_from_text` when there are no tags;
    ``extracted`` on the parsed turn marks the fallback."""

    def __init__(self, inner: ToolCallFormat):
        self.inner, self.name, self.uses_template_tools = inner, inner.name, inner.uses_template_tools

    def parse(self, text: str, max_calls: int | None = None) -> ParsedTurn:
        takes_limit = "max_calls" in inspect.signature(self.inner.parse).parameters
        turn = self.inner.parse(text, max_calls=max_calls) if takes_limit else self.inner.parse(text)
        turn.extracted = False
        if turn.answer is None and not turn.calls:
            turn.answer = answer_from_text(text)
            turn.extracted = turn.answer is not None
        return turn

    def result_messages(self, outcomes):
        return self.inner.result_messages(outcomes)

    def instructions(self, tools):
        return self.inner.instructions(tools)

    def check_tools(self, tools):
        return self.inner.check_tools(tools)

    def nudge(self) -> str:
        return self.inner.nudge()


class NaiveRAGEnv(MultiHopQAEnv):
    """Single-turn QA over passages retrieved for the question; subclasses set ``dataset``."""

    _CACHE_SIZE = 10_000
    episode_state = ("_extracted",)

    def __init__(self, max_context_tokens: int = 4096, answer_source: str = "tags", **kwargs: Any):
        if answer_source not in ANSWER_SOURCES:
            raise ValueError(f"answer_source must be one of {ANSWER_SOURCES}, got {answer_source!r}: 'tags' scores "
                             "only <answer>...</answer>; 'text' also reads a reply without tags as its answer")
        if kwargs.get("max_turns", 1) != 1:
            raise ValueError(f"{self.env_id} is single-turn: max_turns is fixed at 1, got {kwargs['max_turns']!r}")
        if kwargs.get("lookup_tool"):
            raise ValueError(f"{self.env_id} has no tools: lookup_tool must be False")
        kwargs["max_turns"] = 1
        self._passages: OrderedDict[str, tuple[str, list[str]]] = OrderedDict()
        self._retrieval_error = ""
        self._shown: list[str] = []
        self._extracted = False
        super().__init__(max_context_tokens=max_context_tokens, **kwargs)
        self.answer_source = answer_source
        if answer_source == "text":
            self.format = _TextAnswerFormat(self.format)

    def _score_answer(self, turn: Any) -> None:
        super()._score_answer(turn)
        self._extracted = bool(getattr(turn.parsed, "extracted", False))
        if self._extracted:
            turn.comps["format"] = 0.0  # the format reward pays for tags only

    def default_system_prompt(self) -> str:
        return NAIVE_RAG_PROMPT

    def _make_tools(self) -> list[Tool]:
        return []

    def _retrieve(self, question: str) -> tuple[str, list[str]]:
        """(passage text, titles shown) for ``question``; failures are reported, not cached."""
        hit = self._passages.get(question)
        if hit is not None:
            self._passages.move_to_end(question)
            return hit
        try:
            passages = self.retriever.search([question], self.topk)[0][: self.topk]
        except Exception as err:  # noqa: BLE001  (a down server must not crash reset)
            self._retrieval_error = f"{type(err).__name__}: {err}"
            return "(retrieval failed; answer from your own knowledge)", []
        out = self.formatter.format(passages) if passages else ("(no passages found)", [])
        self._passages[question] = out
        if len(self._passages) > self._CACHE_SIZE:
            self._passages.popitem(last=False)
        return out

    def task_messages(self, task: dict[str, Any]) -> list[dict[str, str]]:
        self._retrieval_error = ""
        text, self._shown = self._retrieve(task["question"])
        user = f"Passages:\n{text}\n\nQuestion: {task['question']}"
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = super().step(action)
        if truncated:  # the one turn held no answer: the (one-step) task is over, not cut short
            terminated, truncated = True, False
            # The reason stays as the Episode records it ("max_turns": no answer; "context": the
            # action was cut at the budget and never scored), so info and the trainer agree.
            info["truncation_reason"] = info["trajectory"].truncation_reason
            info["answer"], info["answer_scores"] = None, {}
        info["answer_extracted"] = self._extracted
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._extracted = False
        obs, info = super().reset(seed=seed, options=options)
        supporting = set(self.task.get("supporting_titles") or ())
        self._found = supporting.intersection(self._shown)  # reported again by step()
        info["retrieved_titles"] = list(self._shown)
        info["supporting_found"] = len(self._found)
        info["retrieval_error"] = self._retrieval_error
        return obs, info


class HotpotQANaiveRAGEnv(NaiveRAGEnv):
    dataset = "hotpotqa"
    env_id = "AgentR1/HotpotQA-NaiveRAG-v0"


class TwoWikiMultiHopQANaiveRAGEnv(NaiveRAGEnv):
    dataset = "2wikimultihopqa"
    env_id = "AgentR1/2WikiMultiHopQA-NaiveRAG-v0"


class MuSiQueNaiveRAGEnv(NaiveRAGEnv):
    dataset = "musique"
    env_id = "AgentR1/MuSiQue-NaiveRAG-v0"


for _cls in (HotpotQANaiveRAGEnv, TwoWikiMultiHopQANaiveRAGEnv, MuSiQueNaiveRAGEnv):
    register_env(_cls.env_id, f"{__name__}:{_cls.__name__}")
