"""Multi-hop QA over a retriever: the shared base of the HotpotQA, 2WikiMultiHopQA and MuSiQue envs.

The dataset modules (``envs/hotpotqa.py``, ``envs/twowiki.py``, ``envs/musique.py``) only name
their dataset and carry their cards; ``envs/naiverag.py`` holds the single-turn, no-tool variant.
Everything below is shared.

Card (shared part)
------------------
Task
    A multi-hop question from the dataset's ``split``; the answer is a short string (the gold
    answer or one of its aliases). A task given as ``reset(options={"task": ...})`` is checked
    as a data row is (``check_task``): a string ``aliases``, a null, list or blank ``answer``, a
    blank alias raise a ``ValueError`` naming the key, and the env is left as it was.
Tools
    ``search(query)``: the ``topk`` (default 3) best passages of the retriever, best first, one
    per line as ``Doc i (Title: <title>) <text>``. The result is cut to ``max_result_tokens``
    (default 512, as Search-R1's ``max_obs_length``) tokens of the env's tokenizer, counted
    passage by passage: passages that fit are kept whole, the first one that does not is cut at
    a word boundary and ends with `` ...`` (with no space before the cut, e.g. CJK text, only
    its title shows), the rest are dropped; a long passage is never tokenized whole. A blank
    query and a retriever failure (``RetrieverError``: server down, timeout, bad answer; or any
    other exception) come back as a ``tool_error`` message; the episode goes on.
    ``lookup(title)`` (only with ``lookup_tool=True``; hermes format only): every paragraph with
    that exact title (case and surrounding space ignored), cut to the same budget; an unknown
    title is a ``tool_error``. Titles are looked up in the corpus the retriever searches:
    ``corpus_path``, else the retriever's own corpus (by default the split's context
    paragraphs, which is also what search sees). With a retriever that has no corpus here (an
    HTTP server, a prebuilt pyserini index), ``lookup_tool=True`` raises at construction unless
    ``corpus_path`` names the served corpus: looking up the split's own paragraphs would leak
    the gold paragraphs in a fullwiki setting.
Oracle
    ``demonstration(task)``: one search per supporting title (the title as the query; at most
    ``max_turns - 1``) in the env's tool format, then the gold answer. ``trainers/evaluate.py
    --policy oracle`` and SFT's ``demo_policy: oracle`` use it (as for FactChain).
Observation
    The token ids of the conversation: system prompt (with the tool schemas), the question, every
    assistant turn and every tool response. ``tool_format="hermes"`` (default) or
    ``"search_r1"`` (``<search>query</search>`` answered by ``<information>...</information>``;
    its only tool is ``search``).
Reward
    Outcome, on the answer turn: ``answer_metric`` (default ``"em"``) with weight 1, i.e.
    ``answer_weights={answer_metric: 1.0}`` unless ``rewards["answer_weights"]`` says otherwise.
    ``em`` and ``f1`` are those of the dataset's official evaluation script
    (:data:`agent_gym.scoring.OFFICIAL_SCORERS`; each dataset module's card names the script),
    max over the answer and its aliases; they are always computed and logged in
    ``info["answer_scores"]``. ``f1_squad`` (MuSiQue's F1) can also be named in
    ``answer_weights``. ``substring`` (Agent-R1's public
    reward, hackable by answers that list many candidates) is computed only when named in
    ``answer_metric`` or ``answer_weights``.
    Format: ``rewards["format"]`` (default 0) when the episode ends with an ``<answer>``;
    with ``rewards["format_gate"]`` naming an answer score (``"f1"``), only when that score is
    above 0 (the score is then computed even if no weight names it).
    Process, per call: ``call_ok`` / ``call_invalid`` (default 0 each) from ``RewardConfig``, and
    ``supporting_hit``: ``rewards["extra"]["supporting_hit"]`` (default 0) for each supporting
    paragraph (matched by its title) shown by a search or lookup for the first time in the
    episode. So it is paid at most once per supporting title. It is logged as
    ``reward_components["supporting_hit"]`` whenever a new supporting title turns up (with
    value 0 under the default weight), and ``info["supporting_found"]`` /
    ``info["supporting_total"]`` count them on every step. All process and format weights are
    0 by default so that the answer alone defines success; ``call_ok`` in particular can be
    farmed by calling often, while ``supporting_hit`` is bounded by the number of hops.
    LLM judge (``judge={base_url, model, ...}``, :mod:`agent_gym.judge`): each answer is also
    sent to a judge model on an OpenAI-compatible server, which says whether it means the gold
    (or an alias); ``answer_scores["judge"]`` is 1.0 or 0.0, usable in ``answer_weights``
    (``{"judge": 1.0}``; naming it without a judge raises). ``answer_scores["judge_failed"]``
    is 1.0 when the judge failed (server down, timeout, HTTP error, no yes/no verdict): the
    judge score is then 0, the first failure of each kind is logged as a warning, and
    ``info["judge"]`` (on the answer step) holds the verdict, the reply, the failure's kind and
    reason, and whether it came from the cache. Success stays exact match.
Data
    ``load_qa(dataset, data_path, split, limit)``: the official file, the Hugging Face export or
    the normalized JSONL, a file or a directory. With ``data_path=None`` the official file is
    downloaded into ``$AGENT_GYM_CACHE``; offline that fails with an error that says to pass
    ``data_path=``. The retriever's corpus is ``corpus_path`` (JSONL ``{id, title, text}`` or
    wiki-18 ``{id, contents}``) or, by default, the deduplicated context paragraphs of the
    loaded split (``corpus_from_tasks``: the distractor pool), so no corpus file is needed.
    Loaded tasks and env-built retrievers are shared by every env of the process with the same
    data arguments, so a vector env of 64 reads the data and builds the index once.
Parameters
    ``data_path``, ``split`` (default ``"dev"``), ``limit``; ``retriever``: ``"bm25"`` (default,
    bm25s), another kind of :func:`agent_gym.retrievers.make_retriever` (``"pyserini"``,
    ``"dense"``, ``"http"``), an ``http(s)://`` URL of a Search-R1-style ``/retrieve`` server, or
    any object with ``search(queries, k)``; ``retriever_kwargs`` (passed to ``make_retriever``;
    the corpus is added for corpus-based kinds); ``corpus_path``; ``topk`` (3);
    ``max_result_tokens`` (512); ``lookup_tool`` (False); ``answer_metric`` (``"em"``);
    ``max_turns`` (6), ``max_context_tokens`` (8192), ``max_tool_calls`` (16),
    ``max_invalid_calls`` (3) and every other ``ToolEnv`` argument, ``scaffold`` among them
    (scaffolded turns for a model with no foothold: ``scaffold=True`` writes the opening of a
    ``search`` call on every turn but the last and ``<answer>`` on the last; the model writes the
    query and the answer; agent_gym/scaffold.py, ``configs/smollm2_qa_grpo_scaffold.yaml``).
    ``judge`` (None): an LLM judge's settings, see :mod:`agent_gym.judge` (``base_url``,
    ``model`` required; ``rubric``, ``timeout_s``, ``retries``, ``backoff_s``,
    ``max_concurrency``, ``cooldown_s``, ``cache_path``, ``max_tokens``, ``api_key_env``,
    ``extra_body``); a bad or unknown key raises one ``JudgeConfigError`` naming it.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from agent_gym.datasets import QATask, corpus_from_tasks, load_corpus, load_qa
from agent_gym.datasets.base import (
    DATASETS,
    DataPathError,
    RowRef,
    gold_aliases,
    gold_answer,
    resolve_data_file,
    string_list,
)
from agent_gym.env import RewardConfig, ToolEnv, check_env_kwargs
from agent_gym.formats import CallOutcome
from agent_gym.judge import Judge, JudgeConfig, get_judge
from agent_gym.retrievers import RETRIEVERS, Passage, Retriever, make_retriever
from agent_gym.retrievers.tools import (  # moved there from this module (2026-11-25)
    LookupTool,
    PassageFormatter,
    SearchTool,
)
from agent_gym.scoring import ANSWER_SCORERS, get_answer_scorer, official_scorers
from agent_gym.tokenizer import load_tokenizer
from agent_gym.tools import Tool

__all__ = ["MultiHopQAEnv", "PassageFormatter", "LookupTool", "SearchTool"]

ANSWER_METRICS = ("em", "f1", "substring")
JUDGE_SCORE = "judge"
"""The answer score of the LLM judge (``judge=`` kwarg; agent_gym/judge.py), usable in ``answer_weights``."""
JUDGE_FAILED = "judge_failed"
"""1.0 when the judge failed for this answer (its ``judge`` score is then 0), else 0.0."""
EXTRA_COMPONENTS = ("supporting_hit",)
CORPUS_KINDS = ("bm25", "pyserini", "dense")
"""Retriever kinds built over a corpus; the env adds ``corpus=`` for them."""

SYSTEM_PROMPT = (
    "Answer the question. It may need facts from several Wikipedia paragraphs: search for one "
    "fact at a time and use what you find to search for the next. Give only the final short "
    "answer (a name, a date, a number, yes or no) inside <answer></answer>."
)
LOOKUP_HINT = " You can also read a whole paragraph by its exact title with the lookup tool."


# -- process-wide sharing of tasks and retrievers -------------------------------------------

_SHARED: OrderedDict[tuple, Any] = OrderedDict()
_SHARED_MAX = 16


def _shared(key: tuple, build: Callable[[], Any]) -> Any:
    """Memoize ``build()`` under ``key`` (bounded, most recent kept). Envs only read what is
    shared (task lists, retrievers), so one copy serves every env of the process."""
    if key in _SHARED:
        _SHARED.move_to_end(key)
        return _SHARED[key]
    value = build()
    _SHARED[key] = value
    while len(_SHARED) > _SHARED_MAX:
        _SHARED.popitem(last=False)
    return value


_LOOKUP_INDEXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Retriever -> its lookup index (built once per retriever, which envs share)."""


def _file_key(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_mtime_ns, st.st_size)


# -- the env -----------------------------------------------------------------------------------


def _positive_int(name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return v


class MultiHopQAEnv(ToolEnv):
    """Shared base; subclasses set ``dataset`` (a name of :data:`agent_gym.datasets.DATASETS`)."""

    dataset: str = ""
    env_id: str = "AgentR1/MultiHopQA"
    episode_state = ("_found",)
    """The supporting titles already paid (``process_components``): restored when a step raises."""

    def __init__(
        self,
        data_path: str | os.PathLike[str] | None = None,
        split: str = "dev",
        limit: int | None = None,
        corpus_path: str | os.PathLike[str] | None = None,
        retriever: str | Retriever = "bm25",
        retriever_kwargs: dict[str, Any] | None = None,
        topk: int = 3,
        max_result_tokens: int = 512,
        lookup_tool: bool = False,
        answer_metric: str = "em",
        rewards: RewardConfig | dict | None = None,
        judge: JudgeConfig | dict[str, Any] | None = None,
        tokenizer: Any = None,
        tool_format: str = "hermes",
        system_prompt: str | None = None,
        max_turns: int = 6,
        max_context_tokens: int = 8192,
        **kwargs: Any,
    ):
        if self.dataset not in DATASETS:
            raise TypeError(f"{type(self).__name__} must set `dataset` to one of {sorted(DATASETS)}")
        # Cheap checks first, so a bad argument fails before any data is read.
        check_env_kwargs(
            type(self),
            {**kwargs, "tool_format": tool_format, "max_turns": max_turns, "max_context_tokens": max_context_tokens},
        )
        self.topk = _positive_int("topk", topk)
        self.max_result_tokens = _positive_int("max_result_tokens", max_result_tokens)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
        if answer_metric not in ANSWER_METRICS:
            raise ValueError(f"unknown answer_metric {answer_metric!r}; valid: {', '.join(ANSWER_METRICS)}")
        if not isinstance(lookup_tool, bool):
            raise ValueError(f"lookup_tool must be True or False, got {lookup_tool!r}")
        if lookup_tool and tool_format == "search_r1":
            raise ValueError("lookup_tool=True needs tool_format='hermes': the search_r1 format has only <search>")
        if retriever_kwargs is not None and not isinstance(retriever_kwargs, dict):
            raise ValueError(f"retriever_kwargs must be a dict, got {type(retriever_kwargs).__name__}")
        if not (isinstance(retriever, str) or callable(getattr(retriever, "search", None))):
            raise ValueError(
                "retriever must be a kind name, an http(s):// URL, or an object with "
                f"search(queries, k); got {type(retriever).__name__}"
            )
        if corpus_path is not None and not Path(corpus_path).expanduser().is_file():
            raise DataPathError(f"{self.env_id}: corpus_path {str(corpus_path)!r} does not exist", "corpus_path")
        judge_cfg = None if judge is None else JudgeConfig.from_any(judge)  # one error naming the bad key
        self.answer_metric = answer_metric
        reward_cfg = self._reward_config(rewards, answer_metric, judged=judge_cfg is not None)
        gate = {reward_cfg.format_gate} if reward_cfg.format_gate else set()
        self._scored = sorted((set(reward_cfg.answer_weights) | {"em", "f1", answer_metric} | gate) - {JUDGE_SCORE})
        self.judge: Judge | None = None if judge_cfg is None else get_judge(judge_cfg)
        self._judge_info: dict[str, Any] | None = None
        self.lookup_enabled = lookup_tool

        self.split = split
        self.tasks: list[QATask] = self._load_tasks(data_path, split, limit)
        if not self.tasks:
            raise ValueError(f"{self.env_id}: no tasks in {data_path!r} (split {split!r}, limit {limit})")
        self.corpus_path = Path(corpus_path).expanduser() if corpus_path is not None else None
        self._path_docs: list[dict[str, str]] | None = None
        self.retriever = self._make_retriever(retriever, dict(retriever_kwargs or {}))
        tok = load_tokenizer(tokenizer)
        self.formatter = PassageFormatter(tok, self.max_result_tokens)
        tools = self._make_tools()
        if system_prompt is None:
            system_prompt = self.default_system_prompt()
        super().__init__(
            tools=tools,
            tokenizer=tok,
            tool_format=tool_format,
            system_prompt=system_prompt,
            max_turns=max_turns,
            max_context_tokens=max_context_tokens,
            rewards=reward_cfg,
            **kwargs,
        )
        self._found: set[str] = set()

    # -- construction helpers ----------------------------------------------------------------

    def default_system_prompt(self) -> str:
        return SYSTEM_PROMPT + (LOOKUP_HINT if self.lookup_enabled else "")

    @staticmethod
    def _reward_config(rewards: RewardConfig | dict | None, answer_metric: str, judged: bool = False) -> RewardConfig:
        if rewards is None or (isinstance(rewards, dict) and "answer_weights" not in rewards):
            rewards = {**(rewards or {}), "answer_weights": {answer_metric: 1.0}}
        cfg = RewardConfig.from_any(rewards)
        if JUDGE_SCORE in cfg.answer_weights and not judged:
            raise ValueError(
                f"rewards.answer_weights names {JUDGE_SCORE!r} but no judge is configured: pass the env "
                "kwarg judge={base_url: http://HOST:PORT/v1, model: NAME} (docs/envs/hotpotqa.md, "
                '"LLM-as-judge")'
            )
        valid = sorted(set(ANSWER_SCORERS) | ({JUDGE_SCORE} if judged else set()))
        unknown = sorted(set(cfg.answer_weights) - set(valid))
        if unknown:
            raise ValueError(f"unknown answer_weights key(s) {unknown}; valid: {valid}")
        if cfg.format_gate is not None and cfg.format_gate not in valid:
            raise ValueError(f"unknown rewards.format_gate {cfg.format_gate!r}; valid: {valid}")
        unknown = sorted(set(cfg.extra) - set(EXTRA_COMPONENTS))
        if unknown:
            raise ValueError(f"unknown rewards extra key(s) {unknown}; valid: {list(EXTRA_COMPONENTS)}")
        return cfg

    def _load_tasks(self, data_path: Any, split: str, limit: int | None) -> list[QATask]:
        path = resolve_data_file(DATASETS[self.dataset], data_path, split)  # downloads if None
        key = ("tasks", self.dataset, _file_key(path), split, limit)
        self._tasks_key = key
        return _shared(key, lambda: load_qa(self.dataset, data_path=path, split=split, limit=limit))

    def _corpus_docs(self) -> list[dict[str, str]]:
        if self.corpus_path is not None:
            return _shared(("corpus", _file_key(self.corpus_path)), lambda: load_corpus(self.corpus_path))
        return _shared(("corpus",) + self._tasks_key, lambda: corpus_from_tasks(self.tasks))

    def _make_retriever(self, spec: str | Retriever, kwargs: dict[str, Any]) -> Retriever:
        if not isinstance(spec, str):
            if kwargs:
                raise ValueError("retriever_kwargs apply only when retriever is a kind name or a URL")
            return spec
        kind = spec
        if spec.startswith(("http://", "https://")):
            kind, kwargs = "http", {**kwargs, "url": spec}
        if kind not in RETRIEVERS:
            raise ValueError(
                f"unknown retriever kind {kind!r}; valid kinds: {', '.join(sorted(RETRIEVERS))}, or an http(s):// URL"
            )
        src: tuple = ()
        wraps_corpus = kind == "ray" and kwargs.get("inner", "bm25") in CORPUS_KINDS  # a shared actor's index
        if (kind in CORPUS_KINDS or wraps_corpus) and not ({"corpus", "index", "prebuilt"} & set(kwargs)):
            if self.corpus_path is not None:
                kwargs["corpus"] = str(self.corpus_path)
                src = ("corpus", _file_key(self.corpus_path))
            else:
                kwargs["corpus"] = self._corpus_docs()
                src = ("corpus",) + self._tasks_key
        key: tuple | None = None
        if src or isinstance(kwargs.get("corpus", ""), str):  # not a row list the caller passed
            try:
                shown = sorted((k, v) for k, v in kwargs.items() if not (src and k == "corpus"))
                key = ("retriever", kind, src, repr(shown))
            except TypeError:  # unorderable values: build a private one
                key = None
        build = lambda: make_retriever(kind, **kwargs)  # noqa: E731
        r = _shared(key, build) if key is not None else build()
        if src and src[0] == "corpus" and self.corpus_path is not None:
            self._path_docs = getattr(r, "docs", None)  # the file as the retriever read it
        return r

    def _make_tools(self) -> list[Tool]:
        tools: list[Tool] = [SearchTool(self.retriever, self.topk, self.formatter)]
        if self.lookup_enabled:
            tools.append(LookupTool(self._lookup_index(), self.formatter))
        return tools

    def _lookup_index(self) -> dict[str, list[Passage]]:
        """Titles -> paragraphs of the corpus the retriever searches, never more.

        ``corpus_path`` when given; else the retriever's own ``docs`` (bm25s, dense, pyserini
        built from a corpus: by default the split's context paragraphs, the pool search also
        sees). A retriever without one (an HTTP server, a prebuilt index, a custom object)
        gets no lookup: indexing the split's own paragraphs would hand the gold paragraphs of a
        fullwiki setting to the agent.
        """
        if self.corpus_path is not None:
            docs = self._path_docs  # not None when a bm25/dense retriever already read the file
            return _shared(
                ("lookup", _file_key(self.corpus_path)), lambda: LookupTool.index(docs or self._corpus_docs())
            )
        docs = getattr(self.retriever, "docs", None)
        if not isinstance(docs, list) or not docs:
            raise ValueError(
                f"{self.env_id}: lookup_tool=True needs the corpus the retriever searches, and "
                f"{type(self.retriever).__name__} does not expose one (an HTTP server or a prebuilt "
                "index). Pass corpus_path= (the same corpus the retriever serves), or "
                "lookup_tool=False. (Looking titles up in the split's own paragraphs would leak "
                "the gold paragraphs in a fullwiki setting.)"
            )
        try:
            cached = _LOOKUP_INDEXES.get(self.retriever)
        except TypeError:  # not weak-referenceable: build a private index
            return LookupTool.index(docs)
        if cached is None:
            cached = LookupTool.index(docs)
            _LOOKUP_INDEXES[self.retriever] = cached
        return cached

    # -- ToolEnv hooks -------------------------------------------------------------------------

    def num_tasks(self) -> int:
        return len(self.tasks)

    def get_task(self, index: int) -> dict[str, Any]:
        t = self.tasks[index]
        return {
            "id": t.id,
            "question": t.question,
            "answer": t.answer,
            "aliases": list(t.aliases),
            "supporting_titles": list(t.supporting_titles),
            "type": t.type,
        }

    def check_task(self, task: Any) -> dict[str, Any]:
        """A task given as ``reset(options={"task": ...})``, checked as the loaders check a data
        row: ``answer`` a non-blank string (an int becomes its decimal string), ``aliases`` a list
        of non-blank strings and ``supporting_titles`` a list of strings (missing or None: ``[]``).
        A blank gold or alias (which every answer normalizing to "" would match), a string
        ``aliases`` (each character would become an alias), a null or list answer and the like
        raise a ``ValueError`` naming the key, before the env changes."""
        task = super().check_task(task)
        ref = RowRef(f"{self.env_id} reset", "options['task']")
        task["answer"] = gold_answer(task["answer"], ref, "answer")
        task["aliases"] = gold_aliases(task.get("aliases"), ref, "aliases")
        task["supporting_titles"] = string_list(task.get("supporting_titles"), ref, "supporting_titles")
        return task

    def demonstration(self, task: dict[str, Any]) -> list[str]:
        """The oracle's assistant turns for ``task`` (the hook FactChain has, used by
        ``trainers/evaluate.py --policy oracle`` and SFT's ``demo_policy: oracle``): one search
        per supporting title, with the title as the query (as many as ``max_turns - 1`` allows,
        in the env's tool format), then the gold answer in ``<answer>`` tags. Its EM is 1.0
        whenever the episode is not truncated first (e.g. by ``max_context_tokens``)."""
        searches = list(task.get("supporting_titles") or [])[: max(self.max_turns - 1, 0)]
        return [self._search_turn(title) for title in searches] + [f"<answer>{task['answer']}</answer>"]

    def _search_turn(self, query: str) -> str:
        return self.format.call_text("search", {"query": query})

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        golds = [task["answer"], *task.get("aliases", [])]
        scores = {name: fn(answer, golds) for name, fn in official_scorers(self.dataset).items()}
        for name in self._scored:
            if name not in scores:
                scores[name] = get_answer_scorer(name)(answer, golds)
        if self.judge is not None:
            verdict = self.judge.judge(task["question"], golds, answer)  # never raises for the server's fault
            scores[JUDGE_SCORE] = verdict.score
            scores[JUDGE_FAILED] = 1.0 if verdict.failed else 0.0
            self._judge_info = verdict.info()
        return scores

    def process_components(self, outcome: CallOutcome, task: dict[str, Any]) -> dict[str, float]:
        supporting = task.get("supporting_titles") or ()
        new = [
            t
            for t in dict.fromkeys(outcome.result.metadata.get("titles", ()))
            if t in supporting and t not in self._found
        ]
        if not new:
            return {}
        self._found.update(new)
        return {"supporting_hit": self.reward_cfg.extra.get("supporting_hit", 0.0) * len(new)}

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)  # a bad task raises here, nothing changed
        self._found = set()
        info["supporting_total"] = len(self.task.get("supporting_titles") or ())
        return obs, info

    def step(self, action: Any):
        self._judge_info = None
        obs, reward, terminated, truncated, info = super().step(action)
        if self._judge_info is not None and "answer_scores" in info:
            info["judge"] = self._judge_info
        info["supporting_found"] = len(self._found)
        info["supporting_total"] = len(self.task.get("supporting_titles") or ())
        return obs, reward, terminated, truncated, info
