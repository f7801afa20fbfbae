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

from collections import OrderedDict
from typing import Any

from agent_gym.formats import answer_from_text  # noqa: F401  (re-exported: it used to live here)
from agent_gym.tools import Tool
from envs.qa import MultiHopQAEnv

NAIVE_RAG_PROMPT = (
    "Answer the question using the passages (not all of them are relevant). Give only the final "
    "short answer (a name, a date, a number, yes or no) inside <answer></answer>."
)


class NaiveRAGEnv(MultiHopQAEnv):
    """Single-turn QA over passages retrieved for the question; subclasses set ``dataset``."""

    _CACHE_SIZE = 10_000

    def __init__(self, max_context_tokens: int = 4096, **kwargs: Any):
        # answer_source (ToolEnv): "text" reads the short answer of a reply without tags, as the
        # paper's Naive RAG reads the model's text; the default stays "tags".
        if kwargs.get("max_turns", 1) != 1:
            raise ValueError(f"{self.env_id} is single-turn: max_turns is fixed at 1, got {kwargs['max_turns']!r}")
        if kwargs.get("lookup_tool"):
            raise ValueError(f"{self.env_id} has no tools: lookup_tool must be False")
        kwargs["max_turns"] = 1
        self._passages: OrderedDict[str, tuple[str, list[str]]] = OrderedDict()
        self._retrieval_error = ""
        self._shown: list[str] = []
        super().__init__(max_context_tokens=max_context_tokens, **kwargs)

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
        info.setdefault("answer_extracted", False)
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
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
