"""Any OpenAI-compatible chat model as the policy of an env, for evaluation.

    OPENAI_API_KEY=... python trainers/evaluate.py --env AgentR1/HotpotQA-v0 \\
        --openai-base-url http://127.0.0.1:8000/v1 --model NAME --concurrency 8 --tasks 50 --out runs/eval_x

The env runs in this process behind :class:`agent_gym.wrappers.ChatView`: each turn its messages
(and, for formats whose chat template takes them, its tool schemas) go to the server's
``/chat/completions``, and the assistant's text comes back as the action. The env tokenizes that
text with its own tokenizer (``info["retokenized"]``), so the scores are the env's own (EM, F1,
success...), whatever model and tokenizer the server runs.

- Concurrency: ``concurrency`` episodes at once, one env per worker thread.
- Retries: a 408, 409, 429 or 5xx answer, a dropped or refused connection, a timeout or a body
  that is not a chat completion is retried up to ``max_retries`` times, after an exponential
  backoff with jitter (``backoff_delay``; a 429's ``Retry-After`` is honoured up to
  ``backoff_max``). Any other status (400, 401, 404...) is not retried.
- Timeout: ``timeout`` seconds per request: to connect, for the headers, and for the whole body
  (a server that trickles bytes is cut off too), so one request takes at most about twice
  ``timeout``, and a row at most ``turns x (max_retries + 1)`` of those plus the backoffs.
- Resumable output: one JSON line per row in ``OUT/rows.jsonl``, appended as each row ends; a
  rerun with the same settings skips the rows already finished and runs the others again. A row
  whose request still fails after the retries (or whose env raises) is a line with
  ``status: "error"`` and the reason: never dropped, never waited on forever.
- Greedy (temperature 0) by default; each row sends ``seed`` + its row index as the request's
  ``seed`` (a server that rejects the field is asked again without it).

With ``same_tokenizer`` (vLLM serving the model whose tokenizer the env uses), the request also
carries vLLM's ``stop_token_ids`` (the env's) and ``skip_special_tokens: false``, so the reply
stops and reads as the in-process backend's would. A scaffolded env (``scaffold``,
agent_gym/scaffold.py) needs ``same_tokenizer``: the turn's prefix goes as a partial assistant
message that the server continues (vLLM's ``continue_final_message``, with
``add_generation_prompt: false``) and its stop strings as ``stop``; standard OpenAI servers can
neither prefill nor report the stopping text exactly, so any other setting is refused before the
first request (``ScaffoldUnsupported``). Torch-free: it needs the ``openai`` package
(``pip install -e .[openai]``). The command line (``trainers/evaluate.py --openai-base-url``,
which also reuses the trainer's summaries) is ``trainers.integrations.openai_eval.run_cli``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.episode import Episode
from agent_gym.wrappers import ChatView

RETRY_STATUS = frozenset({408, 409, 429})
"""Statuses retried besides every 5xx."""


class RequestFailed(RuntimeError):
    """A chat request that failed for good: ``reason`` (the last error) after ``attempts`` tries."""

    def __init__(self, reason: str, attempts: int, errors: list[str]):
        super().__init__(f"{reason} (after {attempts} attempt{'s' if attempts != 1 else ''})")
        self.reason, self.attempts, self.errors = reason, attempts, errors


class ScaffoldUnsupported(ValueError):
    """A scaffolded env asked of a client that cannot prefill the assistant's turn."""


def check_scaffold_support(tool_env: Any, cfg: ClientConfig) -> None:
    """Refuse a scaffolded env unless the server is vLLM with the env's tokenizer (``same_tokenizer``)."""
    if getattr(tool_env, "scaffold", None) is not None and not cfg.same_tokenizer:
        raise ScaffoldUnsupported(
            "this env is scaffolded (env kwarg scaffold): each turn is prefilled and stopped at strings, which "
            "needs a vLLM server with the env's tokenizer (--openai-same-tokenizer: continue_final_message and stop); "
            "drop the scaffold (scaffold: null) to evaluate a server that cannot prefill"
        )


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, immediate: bool = False):
        super().__init__(reason)
        self.reason, self.retry_after, self.immediate = reason, retry_after, immediate


@dataclass
class ClientConfig:
    base_url: str
    model: str
    api_key: str | None = None
    """None: ``OPENAI_API_KEY`` from the environment, else a placeholder (local servers need none)."""
    timeout: float = 120.0
    max_retries: int = 4
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    temperature: float = 0.0
    max_tokens: int = 256
    same_tokenizer: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not str(self.base_url).startswith(("http://", "https://")):
            raise ValueError(
                f"--openai-base-url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {self.base_url!r}"
            )
        if not self.model:
            raise ValueError(
                "--openai-base-url needs --model NAME: the model name the server serves "
                "(GET BASE_URL/models lists them)"
            )
        for name in ("timeout", "backoff_base", "backoff_max"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"{name} (--request-timeout for timeout) must be positive, got {getattr(self, name)!r}"
                )
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries (--max-retries) must be a non-negative integer, got {self.max_retries!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait before retry ``attempt`` (0 = the first retry): exponential with "equal
    jitter", uniform in ``[d/2, d]`` for ``d = min(cap, base * 2**attempt)``; it grows with each
    attempt and spreads the retries of concurrent rows apart."""
    d = min(cap, base * (2.0**attempt))
    return d / 2 + rng.uniform(0, d / 2)


@dataclass
class Reply:
    text: str
    finish_reason: str | None
    attempts: int
    errors: list[str]


class ChatClient:
    """``/chat/completions`` with bounded retries, backoff and a whole-request deadline.
    Thread-safe (one connection pool shared by the worker threads)."""

    def __init__(self, cfg: ClientConfig, sleep: Callable[[float], None] = time.sleep, seed: int = 0):
        try:
            import openai  # optional: the openai client (extra openai)
        except ImportError as e:
            raise ImportError(
                f"the OpenAI-compatible policy needs the openai client ({e}); "
                "install it with `pip install -e .[openai]`"
            ) from e
        # The HTTP library the client is built on (httpx, or httpx2 in openai 3.x): its timeout
        # type and the transport errors that surface while a body is read.
        base = next(c for c in openai.DefaultHttpxClient.__mro__ if not c.__module__.startswith("openai"))
        httpx = sys.modules[base.__module__.split(".")[0]]
        self.cfg, self._sleep, self._openai, self._httpx = cfg, sleep, openai, httpx
        key = cfg.api_key if cfg.api_key is not None else os.environ.get("OPENAI_API_KEY") or "EMPTY"
        t = float(cfg.timeout)
        self.client = openai.OpenAI(
            base_url=cfg.base_url, api_key=key, max_retries=0, timeout=httpx.Timeout(t, connect=min(t, 30.0))
        )
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.seed_supported = True

    def close(self) -> None:
        self.client.close()

    def _request_body(
        self, messages, tools, stop_token_ids, seed, prefill: str = "", stop: list[str] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": messages,
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
        }
        if tools:
            body["tools"] = tools  # the template renders them as in-process; the reply stays text
            body["tool_choice"] = "none"
        if seed is not None and self.seed_supported:
            body["seed"] = int(seed)
        extra = dict(self.cfg.extra_body)
        if self.cfg.same_tokenizer:
            extra.update({"stop_token_ids": list(stop_token_ids or []), "skip_special_tokens": False})
        if prefill:  # a scaffolded turn: the server continues the env's partial assistant message
            body["messages"] = list(messages) + [{"role": "assistant", "content": prefill}]
            extra.update({"continue_final_message": True, "add_generation_prompt": False})
        if stop:
            body["stop"] = list(stop)
            extra["include_stop_str_in_output"] = True
        return {"body": body, "extra": extra}

    def _once(self, req: dict[str, Any]) -> Reply:
        openai, httpx = self._openai, self._httpx
        deadline = time.monotonic() + float(self.cfg.timeout)
        b = req["body"]
        try:
            with self.client.chat.completions.with_streaming_response.create(
                **b, extra_body=req["extra"] or None
            ) as resp:
                chunks = []
                for chunk in resp.iter_bytes():
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise _Retryable(f"timeout: the response body took over {self.cfg.timeout:g} s")
        except _Retryable:
            raise
        except openai.APITimeoutError:
            raise _Retryable(f"timeout: no response within {self.cfg.timeout:g} s") from None
        except openai.APIConnectionError as e:
            cause = e.__cause__ or e
            raise _Retryable(f"connection error: {type(cause).__name__}: {cause}") from None
        except openai.APIStatusError as e:
            msg = f"HTTP {e.status_code}: {_short(e.message)}"
            if e.status_code in RETRY_STATUS or e.status_code >= 500:
                raise _Retryable(msg, _retry_after(e.response.headers)) from None
            if e.status_code == 400 and "seed" in str(e.message).lower() and "seed" in b:
                self.seed_supported = False  # e.g. a server without the seed field: ask again without it
                raise _Retryable(msg + " (asking again without seed)", immediate=True) from None
            raise RequestFailed(msg, 1, [msg]) from None
        except httpx.TimeoutException:
            raise _Retryable(f"timeout: the response body stalled for {self.cfg.timeout:g} s") from None
        except httpx.TransportError as e:
            raise _Retryable(f"connection error while reading the body: {type(e).__name__}: {e}") from None
        raw = b"".join(chunks)
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
            content = choice["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _Retryable(
                f"bad response: not a chat completion: {_short(raw.decode('utf-8', 'replace'))!r}"
            ) from None
        return Reply("" if content is None else str(content), choice.get("finish_reason"), 1, [])

    def complete(
        self,
        messages: list[dict[str, str]],
        tools: list[dict] | None = None,
        stop_token_ids: list[int] | None = None,
        seed: int | None = None,
        prefill: str = "",
        stop: list[str] | None = None,
    ) -> Reply:
        """The assistant's reply to ``messages``; :class:`RequestFailed` once the retries are spent
        or on a status that is not worth retrying. ``prefill``: the start of the assistant's message
        for the server to continue (the reply is the continuation only); ``stop``: stop strings."""
        errors: list[str] = []
        attempt = 0
        while True:
            req = self._request_body(messages, tools, stop_token_ids, seed, prefill, stop)
            try:
                r = self._once(req)
                r.attempts, r.errors = len(errors) + 1, errors
                return r
            except RequestFailed as e:
                raise RequestFailed(e.reason, len(errors) + 1, errors + [e.reason]) from None
            except _Retryable as e:
                errors.append(e.reason)
                if len(errors) > self.cfg.max_retries:
                    raise RequestFailed(e.reason, len(errors), errors) from None
                if e.immediate:
                    continue
                with self._rng_lock:
                    delay = backoff_delay(attempt, self.cfg.backoff_base, self.cfg.backoff_max, self._rng)
                if e.retry_after is not None:  # the server's Retry-After, up to backoff_max
                    delay = max(delay, min(e.retry_after, self.cfg.backoff_max))
                attempt += 1
                self._sleep(delay)


def _short(s: str, n: int = 300) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _retry_after(headers: Any) -> float | None:
    v = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(v)) if v is not None else None
    except ValueError:
        return None


# -- episodes ----------------------------------------------------------------------------------


def play_row(env: Any, row: int, client: ChatClient, seed: int | None) -> dict[str, Any]:
    """One episode of task ``row`` on ``env`` (a :class:`~agent_gym.wrappers.ChatView`): the
    row's JSON record (``status`` ``ok`` with the ``Episode``, or ``error`` with the reason)."""
    te = env.tool_env
    rec: dict[str, Any] = {"row": row, "seed": seed, "requests": 0, "retries": 0, "retry_errors": []}
    try:
        msgs, info = env.reset(options={"task_index": row})
        rec["task_id"] = info.get("task_id")
        tools = te.renderer.tools
        check_scaffold_support(te, client.cfg)
        while True:
            try:
                reply = client.complete(msgs, tools, te.stop_token_ids, seed, te.scaffold_prefix, te.scaffold_stop)
            except RequestFailed as e:
                rec["requests"] += e.attempts
                rec["retries"] += e.attempts - 1
                rec["retry_errors"] += e.errors[:-1]
                rec.update(status="error", error=f"request of turn {te.turn + 1} failed: {e}")
                return rec
            rec["requests"] += reply.attempts
            rec["retries"] += reply.attempts - 1
            rec["retry_errors"] += reply.errors
            msgs, _, term, trunc, info = env.step(reply.text)
            if term or trunc:
                rec.update(status="ok", episode=dataclasses.asdict(info["trajectory"]))
                return rec
    except Exception as e:  # an env that raises: this row's error, the others go on
        rec.update(status="error", error=f"env error: {type(e).__name__}: {e}")
        return rec


class RowsFile:
    """``rows.jsonl``: a header line with the run's settings, then one line per finished row
    (the last line of a row wins). A line cut short by a crash is dropped on load."""

    def __init__(self, path: Path, header: dict[str, Any]):
        self.path, self.header = Path(path), header
        self.rows: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if self.path.is_file() and self.path.stat().st_size:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"header": header}) + "\n")

    def _load(self) -> None:
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):  # a line cut short by a crash: drop it
            data = data[: data.rfind(b"\n") + 1]
            self.path.write_bytes(data)
        lines = data.decode().splitlines()
        first = json.loads(lines[0]) if lines else {}
        old = first.get("header") if isinstance(first, dict) else None
        if old is None:
            raise SystemExit(
                f"error: {self.path} is not a rows file of this evaluator (no header line); "
                "pass another --out or remove it"
            )
        diff = {k: (old.get(k), v) for k, v in self.header.items() if old.get(k) != v}
        if diff:
            what = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            raise SystemExit(
                f"error: {self.path} holds rows of a run with other settings ({what}); its rows "
                "cannot be resumed under these. Pass another --out, or remove the file to start over."
            )
        for line in lines[1:]:
            rec = json.loads(line)
            self.rows[int(rec["row"])] = rec

    def finished(self) -> set[int]:
        return {k for k, r in self.rows.items() if r.get("status") == "ok"}

    def append(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec) + "\n"
        with self._lock:
            with open(self.path, "a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.rows[int(rec["row"])] = rec


def evaluate_rows(
    env_id: str,
    env_kwargs: dict[str, Any],
    rows: list[int],
    cfg: ClientConfig,
    out: Path,
    concurrency: int = 8,
    seed: int = 0,
    progress: Callable[[dict], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Run ``rows`` (task indices) with the served model as the policy, ``concurrency`` at once,
    appending each row's record to ``out/rows.jsonl`` and skipping rows it already holds as
    finished. Returns ``{"records": [...], "skipped": n}``: the final record of every row, in
    ``rows`` order."""
    if concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    # What the rows depend on (the URL is not: a server that moved serves the same rows).
    header = {
        "env": env_id,
        "env_kwargs": env_kwargs,
        "model": cfg.model,
        "temperature": cfg.temperature,
        "max_tokens": cfg.max_tokens,
        "seed": seed,
        "same_tokenizer": cfg.same_tokenizer,
        "extra_body": cfg.extra_body,
    }
    probe = gym.make(env_id, **env_kwargs)
    try:  # refused before any request or row file, not once per row
        check_scaffold_support(probe.unwrapped, cfg)
    finally:
        probe.close()
    store = RowsFile(Path(out) / "rows.jsonl", json.loads(json.dumps(header)))
    done = store.finished()
    todo = [k for k in rows if k not in done]
    client = ChatClient(cfg, sleep=sleep, seed=seed)
    local = threading.local()
    envs: list[Any] = []
    envs_lock = threading.Lock()

    def work(k: int) -> dict[str, Any]:
        env = getattr(local, "env", None)
        if env is None:
            env = local.env = ChatView(gym.make(env_id, **env_kwargs))
            with envs_lock:
                envs.append(env)
        rec = play_row(env, k, client, seed + k)
        store.append(rec)
        if progress is not None:
            progress(rec)
        return rec

    pool = ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(todo))), thread_name_prefix="openai-row")
    try:
        for fut in as_completed([pool.submit(work, k) for k in todo]):
            fut.result()  # a bug in this module surfaces here; rows' own failures are records
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        client.close()
        for e in envs:
            e.close()
    return {"records": [store.rows[k] for k in rows if k in store.rows], "skipped": len(rows) - len(todo)}


def episodes_of(records: list[dict[str, Any]]):
    """The ``Episode`` of each finished record."""
    return [Episode(**r["episode"]) for r in records if r.get("status") == "ok"]
