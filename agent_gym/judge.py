"""LLM-as-judge answer scores through any OpenAI-compatible ``/chat/completions`` server.

A QA env given ``judge={...}`` (``envs/qa.py``) asks a judge model, for each final answer,
whether the answer means the gold answer, and reports the verdict as the answer score ``judge``
(1.0 yes, 0.0 no), usable in ``rewards: {answer_weights: {judge: w}}`` like ``em`` and ``f1``::

    judge:
      base_url: http://127.0.0.1:8000/v1   # required: vLLM's server (or any OpenAI-compatible one)
      model: smollm2                       # required: the served model name (GET BASE_URL/models)
      rubric: "...{question}...{gold}...{answer}..."   # default: DEFAULT_RUBRIC
      timeout_s: 20        # per attempt (connect, headers, body)
      retries: 2           # retries after the first attempt, exponential backoff with jitter
      backoff_s: 0.5       # the first retry's backoff; doubles each retry, at most 16x
      max_concurrency: 16  # requests in flight from this process (shared by every env in it)
      cooldown_s: 30       # after a request fails for good, judgments fail at once for this long (0: never)
      cache_path: null     # a JSONL file of verdicts, read at start and appended to (null: memory only)
      max_tokens: 8        # of the judge's reply; the verdict is its first word
      api_key_env: OPENAI_API_KEY   # the variable holding the key (unset: a placeholder, as local servers need none)
      extra_body: {}       # more request fields, e.g. vLLM's structured outputs

Batching: one request per (question, answer), sent from the thread of the env step that scores
it. A vector env steps its sub-envs on a thread pool, so the answers of a batch go out
concurrently and the server batches them (vLLM's continuous batching does, for concurrent
requests); ``max_concurrency`` bounds them. One request for many prompts would need the
completions endpoint (chat takes one conversation) and the env to hold its reward back until
the batch ends, which the step contract (the reward comes with the step) forbids.

Caching: verdicts are kept by (question, golds, answer) in memory, per judge configuration, and
shared by every env of the process that has the same configuration (:func:`get_judge`);
concurrent requests for the same key wait for the one in flight. ``cache_path`` keeps them on
disk across runs and processes: one JSON line per verdict, appended in a single ``O_APPEND``
write, tagged with the model and the rubric's hash (lines of another model or rubric are
ignored). Failures are not cached.

Failures: a request that times out, cannot connect, gets an HTTP error, or a reply that is not a
chat completion is retried (``retries``, with backoff; the client of
:mod:`agent_gym.integrations.openai_policy`); when it fails for good, or the reply has no
verdict (``unparseable``), the judgment is a :class:`Verdict` with ``score`` 0.0 and ``failed``
naming the kind (``timeout``, ``connection``, ``http_error``, ``bad_response``,
``unparseable``, ``unavailable`` (in the cooldown), ``error``). The env reports it as
``answer_scores["judge_failed"] = 1.0`` and ``info["judge"]``, and the first failure of each kind
is logged as a warning on the ``agent_gym.judge`` logger. Nothing raises into the env's step, and
a judgment takes at most about ``(retries + 1) * 2 * timeout_s`` plus the backoffs (the client's
deadline is ``timeout_s`` for the headers and again for the body).

Needs the ``openai`` package (``pip install -e .[openai]``), imported when a judge is built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import string
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from agent_gym.integrations.openai_policy import ChatClient, ClientConfig, RequestFailed

__all__ = [
    "DEFAULT_RUBRIC",
    "FAILURE_KINDS",
    "Judge",
    "JudgeConfig",
    "JudgeConfigError",
    "Verdict",
    "get_judge",
    "parse_verdict",
]

log = logging.getLogger("agent_gym.judge")

DEFAULT_RUBRIC = (
    "You are grading an answer to a question against the gold answer.\n"
    "Question: {question}\n"
    "Gold answer: {gold}\n"
    "Candidate answer: {answer}\n"
    "Does the candidate answer mean the same thing as the gold answer? Differences in wording, "
    "spelling, abbreviation or extra detail do not matter; a different or missing fact does. "
    "Reply with one word: yes or no."
)
"""The default rubric: a template with the fields ``{question}``, ``{gold}`` (the gold answer and
its aliases, joined by `` / ``) and ``{answer}``; literal braces are written ``{{`` and ``}}``."""

RUBRIC_FIELDS = ("question", "gold", "answer")
REQUIRED_FIELDS = ("gold", "answer")

YES_WORDS = frozenset({"yes", "correct", "true", "equivalent", "same", "right"})
NO_WORDS = frozenset({"no", "incorrect", "false", "wrong", "different"})

FAILURE_KINDS = ("timeout", "connection", "http_error", "bad_response", "unparseable", "unavailable", "error")
"""The values of :attr:`Verdict.failed`."""


class JudgeConfigError(ValueError):
    """A bad ``judge`` setting; ``key`` names it (``judge.timeout_s``)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True)
class JudgeConfig:
    """The ``judge`` env kwarg (see the module docstring). Build it with :meth:`from_any`, which
    checks every key and raises one :class:`JudgeConfigError` naming the first bad one."""

    base_url: str
    model: str
    rubric: str = DEFAULT_RUBRIC
    timeout_s: float = 20.0
    retries: int = 2
    backoff_s: float = 0.5
    max_concurrency: int = 16
    cooldown_s: float = 30.0
    cache_path: str | None = None
    max_tokens: int = 8
    api_key_env: str = "OPENAI_API_KEY"
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        w = "judge."
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise JudgeConfigError(
                w + "base_url",
                "must be the server's http(s) URL with its /v1, such as "
                f"http://127.0.0.1:8000/v1; got {self.base_url!r}",
            )
        if not isinstance(self.model, str) or not self.model.strip():
            raise JudgeConfigError(
                w + "model",
                f"must name the model the server serves (GET BASE_URL/models lists them); got {self.model!r}",
            )
        if not isinstance(self.rubric, str):
            raise JudgeConfigError(w + "rubric", f"must be a string, got {type(self.rubric).__name__}")
        _check_rubric(self.rubric)
        for name in ("timeout_s", "backoff_s"):
            v = getattr(self, name)
            if not _is_number(v) or not v > 0 or v == float("inf"):
                raise JudgeConfigError(w + name, f"must be a positive number of seconds, got {v!r}")
        if not _is_number(self.cooldown_s) or not 0 <= self.cooldown_s < float("inf"):
            raise JudgeConfigError(w + "cooldown_s", f"must be a number of seconds >= 0, got {self.cooldown_s!r}")
        if not _is_int(self.retries) or self.retries < 0:
            raise JudgeConfigError(w + "retries", f"must be an integer >= 0, got {self.retries!r}")
        for name in ("max_concurrency", "max_tokens"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise JudgeConfigError(w + name, f"must be a positive integer, got {v!r}")
        if self.cache_path is not None and not isinstance(self.cache_path, (str, os.PathLike)):
            raise JudgeConfigError(w + "cache_path", f"must be a file path or null, got {self.cache_path!r}")
        if self.cache_path is not None:
            parent = Path(self.cache_path).expanduser().parent
            if not parent.is_dir():
                raise JudgeConfigError(w + "cache_path", f"its folder {str(parent)!r} does not exist")
            if Path(self.cache_path).expanduser().is_dir():
                raise JudgeConfigError(w + "cache_path", f"{str(self.cache_path)!r} is a folder; name a file")
        if not isinstance(self.api_key_env, str):
            raise JudgeConfigError(
                w + "api_key_env", f"must be an environment variable's name, got {self.api_key_env!r}"
            )
        if not isinstance(self.extra_body, dict):
            raise JudgeConfigError(w + "extra_body", f"must be a dict of request fields, got {self.extra_body!r}")
        try:
            json.dumps(self.extra_body)
        except (TypeError, ValueError) as e:
            raise JudgeConfigError(w + "extra_body", f"must be JSON-serializable ({e})") from None

    @classmethod
    def from_any(cls, value: JudgeConfig | dict[str, Any]) -> JudgeConfig:
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise JudgeConfigError(
                "judge", f"must be a dict of judge settings (at least base_url and model), got {type(value).__name__}"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(names), key=str)
        if unknown:
            raise JudgeConfigError(f"judge.{unknown[0]}", f"unknown key; valid keys: {', '.join(names)}")
        for req in ("base_url", "model"):
            if req not in value:
                raise JudgeConfigError(
                    f"judge.{req}",
                    "is required (judge needs base_url, the server's /v1 URL, and model, the served model's name)",
                )
        v = dict(value)
        if isinstance(v.get("cache_path"), os.PathLike):
            v["cache_path"] = os.fspath(v["cache_path"])
        return cls(**v)

    def key(self) -> str:
        """The configuration as canonical JSON: the process-wide judge's key."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def rubric_sha(self) -> str:
        return hashlib.sha256(self.rubric.encode()).hexdigest()[:16]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # NaN != NaN


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_rubric(rubric: str) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(rubric) if f is not None]
    except ValueError as e:
        raise JudgeConfigError(
            "judge.rubric", f"is not a valid template ({e}); write literal braces as {{{{ and }}}}"
        ) from None
    for f in fields:
        if f not in RUBRIC_FIELDS:
            raise JudgeConfigError(
                "judge.rubric",
                f"has the field {{{f}}}; the fields are "
                f"{', '.join('{' + n + '}' for n in RUBRIC_FIELDS)} (literal braces: {{{{ and }}}})",
            )
    missing = [f for f in REQUIRED_FIELDS if f not in fields]
    if missing:
        raise JudgeConfigError(
            "judge.rubric",
            f"must contain {', '.join('{' + m + '}' for m in missing)}: the judge compares the answer with the gold",
        )


def parse_verdict(text: str) -> float | None:
    """1.0 or 0.0 from a judge's reply, None when it holds no verdict.

    The first word decides (``yes``, ``correct``, ``true``, ``equivalent``, ``same``, ``right`` ->
    1.0; ``no``, ``incorrect``, ``false``, ``wrong``, ``different`` -> 0.0), case,
    markdown and punctuation ignored ("**Yes.**", "No, because..."); failing that, a
    ``verdict:`` or ``answer:`` label followed by such a word, on any line."""
    words = re.findall(r"[a-z]+", str(text).lower())
    if words:
        if words[0] in YES_WORDS:
            return 1.0
        if words[0] in NO_WORDS:
            return 0.0
    m = re.search(r"\b(?:verdict|answer|judgement|judgment)\s*[:=\-]\s*\**\s*([a-z]+)", str(text).lower())
    if m:
        if m.group(1) in YES_WORDS:
            return 1.0
        if m.group(1) in NO_WORDS:
            return 0.0
    return None


@dataclass
class Verdict:
    """One judgment. ``score``: 1.0 (the answer means the gold), else 0.0, failures included;
    ``failed``: None, or the failure's kind (:data:`FAILURE_KINDS`) with ``error`` saying what
    happened; ``reply``: the judge's text; ``cached``: served from the cache (or from a
    concurrent request for the same key); ``attempts``: requests sent for it."""

    score: float
    failed: str | None = None
    error: str | None = None
    reply: str | None = None
    cached: bool = False
    attempts: int = 0

    def info(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _classify(reason: str) -> str:
    r = reason.lower()
    if r.startswith("timeout"):
        return "timeout"
    if r.startswith("connection"):
        return "connection"
    if r.startswith("http"):
        return "http_error"
    if r.startswith("bad response"):
        return "bad_response"
    return "error"


class Judge:
    """A judge client for one :class:`JudgeConfig`: thread-safe, cached, bounded. Get the
    process-wide one with :func:`get_judge`; :meth:`judge` never raises for a server's fault."""

    def __init__(self, cfg: JudgeConfig, *, sleep=time.sleep):
        self.cfg = cfg
        key = os.environ.get(cfg.api_key_env) or "EMPTY"
        ccfg = ClientConfig(
            base_url=cfg.base_url,
            model=cfg.model,
            api_key=key,
            timeout=float(cfg.timeout_s),
            max_retries=cfg.retries,
            backoff_base=float(cfg.backoff_s),
            backoff_max=float(cfg.backoff_s) * 16,
            temperature=0.0,
            max_tokens=cfg.max_tokens,
            extra_body=dict(cfg.extra_body),
        )
        self._client = ChatClient(ccfg, sleep=sleep)  # raises ImportError naming the extra without openai
        self._slots = threading.BoundedSemaphore(cfg.max_concurrency)
        self._lock = threading.Lock()
        self._cache: dict[tuple, tuple[float, str]] = {}
        self._inflight: dict[tuple, Future] = {}
        self._warned: set[str] = set()
        self._down_until = 0.0
        self.stats: Counter[str] = Counter()
        """``requests`` (judgments sent), ``cache_hits``, ``failed_<kind>``: counts since start."""
        self._rubric_sha = cfg.rubric_sha()
        self._cache_file = Path(cfg.cache_path).expanduser() if cfg.cache_path else None
        if self._cache_file is not None:
            self._load_cache()

    def __reduce__(self):  # pickles (and deep-copies) as the process-wide judge of its config
        return (get_judge, (self.cfg,))

    def close(self) -> None:
        self._client.close()

    # -- the cache ------------------------------------------------------------------------------

    @staticmethod
    def _key(question: str, golds: Sequence[str], answer: str) -> tuple:
        return (" ".join(str(question).split()), tuple(" ".join(g.split()) for g in golds), " ".join(answer.split()))

    def _load_cache(self) -> None:
        path = self._cache_file
        if not path.is_file():
            return
        bad = 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
                if rec["model"] != self.cfg.model or rec["rubric_sha"] != self._rubric_sha:
                    continue
                score = float(rec["score"])
                key = self._key(rec["question"], rec["golds"], rec["answer"])
                self._cache[key] = (score, str(rec.get("reply", "")))
            except (ValueError, KeyError, TypeError, AttributeError):
                bad += 1  # a line cut short by a crash, or not ours
        if bad:
            log.warning("judge cache %s: %d line(s) unreadable, ignored", path, bad)

    def _store(self, key: tuple, score: float, reply: str) -> None:
        with self._lock:
            self._cache[key] = (score, reply)
        if self._cache_file is None:
            return
        line = (
            json.dumps(
                {
                    "model": self.cfg.model,
                    "rubric_sha": self._rubric_sha,
                    "question": key[0],
                    "golds": list(key[1]),
                    "answer": key[2],
                    "score": score,
                    "reply": reply,
                }
            )
            + "\n"
        )
        try:
            fd = os.open(self._cache_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line.encode())  # one write: lines of concurrent writers do not interleave
            finally:
                os.close(fd)
        except OSError as e:
            self._warn("cache_write", f"cannot append to the judge cache {self._cache_file}: {e}")

    # -- judging --------------------------------------------------------------------------------

    def judge(self, question: str, golds: Sequence[str], answer: str) -> Verdict:
        """Does ``answer`` mean the gold (``golds[0]``, or one of its aliases ``golds[1:]``)?"""
        if not str(answer).strip():  # a blank answer means nothing: no request
            return Verdict(0.0, reply=None)
        key = self._key(question, golds, str(answer))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self.stats["cache_hits"] += 1
                return Verdict(hit[0], reply=hit[1], cached=True)
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = self._inflight[key] = Future()
        if not owner:  # the same key is being asked by another thread: its answer, when it comes
            v = fut.result()
            with self._lock:
                self.stats["cache_hits"] += 1
            return dataclasses.replace(v, cached=True, attempts=0)
        try:
            v = self._ask(key)
        except BaseException as e:  # noqa: BLE001  (a bug or an interrupt: the waiters must not hang)
            fut.set_result(Verdict(0.0, failed="error", error=f"{type(e).__name__}: {e}"))
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)
        fut.set_result(v)
        return v

    def _ask(self, key: tuple) -> Verdict:
        if self._in_cooldown():
            return self._fail(
                "unavailable",
                f"skipped: a judge request failed for good less than {self.cfg.cooldown_s:g} s ago (judge.cooldown_s)",
            )
        question, golds, answer = key
        prompt = self.cfg.rubric.format(question=question, gold=" / ".join(golds), answer=answer)
        with self._slots:
            if self._in_cooldown():  # it failed while this one waited for a slot
                return self._fail(
                    "unavailable",
                    "skipped: a judge request failed for good less than "
                    f"{self.cfg.cooldown_s:g} s ago (judge.cooldown_s)",
                )
            with self._lock:
                self.stats["requests"] += 1
            try:
                reply = self._client.complete([{"role": "user", "content": prompt}])
            except RequestFailed as e:
                if self.cfg.cooldown_s > 0:
                    self._down_until = time.monotonic() + float(self.cfg.cooldown_s)
                return self._fail(_classify(e.reason), str(e), attempts=e.attempts)
            except Exception as e:  # noqa: BLE001  (never a crash of the rollout)
                return self._fail("error", f"{type(e).__name__}: {e}", attempts=1)
        score = parse_verdict(reply.text)
        if score is None:
            return self._fail(
                "unparseable",
                f"no yes/no verdict in the judge's reply {reply.text[:200]!r}",
                reply=reply.text,
                attempts=reply.attempts,
            )
        self._store(key, score, reply.text)
        return Verdict(score, reply=reply.text, attempts=reply.attempts)

    def _in_cooldown(self) -> bool:
        return self.cfg.cooldown_s > 0 and time.monotonic() < self._down_until

    def _fail(self, kind: str, error: str, reply: str | None = None, attempts: int = 0) -> Verdict:
        with self._lock:
            self.stats[f"failed_{kind}"] += 1
        self._warn(
            kind,
            f"judge failed ({kind}): {error}. The judge score of such answers is 0 and "
            "answer_scores['judge_failed'] is 1 (info['judge'] has each reason); this warning is "
            "logged once per kind.",
        )
        return Verdict(0.0, failed=kind, error=error, reply=reply, attempts=attempts)

    def _warn(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        log.warning("%s (judge %s at %s)", message, self.cfg.model, self.cfg.base_url)


_JUDGES: dict[str, Judge] = {}
_JUDGES_LOCK = threading.Lock()


def get_judge(cfg: JudgeConfig | dict[str, Any]) -> Judge:
    """The process-wide :class:`Judge` of ``cfg`` (checked by :meth:`JudgeConfig.from_any`): every
    env of the process with the same settings shares its cache, its in-flight requests and its
    ``max_concurrency``."""
    cfg = JudgeConfig.from_any(cfg)
    key = cfg.key()
    with _JUDGES_LOCK:
        j = _JUDGES.get(key)
        if j is None:
            j = _JUDGES[key] = Judge(cfg)
        return j
