"""The OpenEnv server under abuse (malformed frames, stateless steps, closes, many sessions): ``python -m agent_gym.serve`` as a real process.

- ``POST /step`` (openenv-core's stateless step: a fresh env, never reset) is a 409 naming the
  WebSocket session to use, not a 500;
- a frame that is no message (a binary frame, JSON that is not an object, JSON nested too deeply)
  costs one ``INVALID_JSON`` reply and the session goes on, its episode intact;
- a client's normal close (and a dropped connection) logs no traceback and no ERROR line;
- sessions opened and closed return the session table to 0 (benchmarks/faults/serve_soak.py, 50 sessions);
- ``--help`` and an unknown env id answer before openenv-core is imported.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip(
    "openenv.core.env_server", reason="openenv-core is not installed (pip install -e '.[openenv]'; make setup does)"
)

from tests.integrations.serve_server import free_port, session_table, start_server, stop_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV_KWARGS = {"max_turns": 4}
RECV_S = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve_abuse") / "server.log"
    port = free_port()
    proc = start_server(port, ENV_KWARGS, log)  # waits for /health (deadline 180 s)
    url = f"http://127.0.0.1:{port}"
    yield url, proc, log
    stop_server(proc)


def _post(url: str, body: bytes, timeout_s: float = 30.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait_empty(url: str, deadline_s: float = 20.0) -> dict:
    import time

    end = time.monotonic() + deadline_s
    while (table := session_table(url))["open_envs"] and time.monotonic() < end:
        time.sleep(0.05)
    return table


@pytest.mark.timeout(120)
def test_a_stateless_http_step_is_a_409_naming_the_websocket_session(server):
    url, _, log = server
    for body in (
        json.dumps({"action": {"text": "<answer>Paris</answer>"}}).encode(),
        json.dumps({"action": {"token_ids": [1, 2, 3]}}).encode(),
        b"{}",
        b"not json",
    ):
        status, payload = _post(url + "/step", body)
        assert status == 409, (body, payload)
        assert payload["code"] == "NO_EPISODE"
        assert "/ws" in payload["detail"] and "reset" in payload["detail"] and "\n" not in payload["detail"]
    with urllib.request.urlopen(url + "/openapi.json", timeout=30) as r:  # the schema (and /docs) still build
        assert list(json.load(r)["paths"]["/step"]["post"]["responses"]) == ["409"]
    # The stateless reset keeps openenv-core's meaning: a throwaway env, reset, answered, closed.
    status, payload = _post(url + "/reset", json.dumps({"seed": 3}).encode())
    assert status == 200 and payload["observation"]["token_ids"] and payload["done"] is False
    table = _wait_empty(url)
    assert table["open_envs"] == 0 and table["sessions"] == 0
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]


BAD_FRAMES = [
    ("[1,2,3]", "got an array"),
    ('"str"', "got a string"),
    ("42", "got a number"),
    ("null", "got null"),
    ("true", "got a boolean"),
    (b"\x00\x01binary", "a binary frame (8 bytes)"),
    (b'{"type": "reset", "data": {}}', "a binary frame"),  # JSON, but not in a text frame
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    ("not json", "Invalid JSON"),  # openenv-core's own reply
    ("", "Invalid JSON"),
]


@pytest.mark.timeout(120)
def test_a_malformed_frame_costs_one_error_reply_never_the_session(server):
    from websockets.sync.client import connect

    url, _, log = server
    with connect(url.replace("http", "ws", 1) + "/ws", open_timeout=RECV_S, max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        prompt = json.loads(ws.recv(timeout=RECV_S))
        assert prompt["type"] == "observation"
        for frame, message in BAD_FRAMES:
            ws.send(frame)
            reply = json.loads(ws.recv(timeout=RECV_S))
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", (frame[:40], reply)
            assert message in reply["data"]["message"], (frame[:40], reply)
            with pytest.raises(TimeoutError):  # one reply, not two
                ws.recv(timeout=0.2)
        # The session and its episode are intact: still turn 0 of the same prompt, and a step works.
        ws.send(json.dumps({"type": "state"}))
        state = json.loads(ws.recv(timeout=RECV_S))
        assert state["type"] == "state" and state["data"]["turn"] == 0
        assert state["data"]["num_tokens"] == prompt["data"]["observation"]["num_tokens"]
        ws.send(json.dumps({"type": "step", "data": {"text": "<answer>no idea</answer>"}}))
        step = json.loads(ws.recv(timeout=RECV_S))
        assert step["type"] == "observation" and step["data"]["done"] is True
    assert _wait_empty(url)["open_envs"] == 0
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]


@pytest.mark.timeout(120)
def test_a_normal_close_or_a_dropped_client_logs_no_traceback(server):
    from websockets.sync.client import connect

    from agent_gym.env_client import RemoteToolEnv

    url, _, log = server
    before = log.read_text(errors="replace")
    for i in range(5):  # the project's client, closed normally
        with RemoteToolEnv(url) as remote:
            remote.reset(seed=i)
    for i in range(5):  # a bare websocket, closed normally after a reset
        with connect(url.replace("http", "ws", 1) + "/ws", open_timeout=RECV_S) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": i}}))
            assert json.loads(ws.recv(timeout=RECV_S))["type"] == "observation"
    with connect(url.replace("http", "ws", 1) + "/ws", open_timeout=RECV_S) as ws:  # a client that vanishes
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=RECV_S))["type"] == "observation"
        ws.socket.shutdown(socket.SHUT_RDWR)
        ws.socket.close()
    with connect(url.replace("http", "ws", 1) + "/ws", open_timeout=RECV_S) as ws:  # closes while a step is served
        ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        ws.recv(timeout=RECV_S)
        ws.send(json.dumps({"type": "step", "data": {"text": "<answer>x</answer>"}}))
    with connect(url.replace("http", "ws", 1) + "/mcp", open_timeout=RECV_S) as ws:  # openenv-core's MCP socket
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}))
        assert json.loads(ws.recv(timeout=RECV_S))["id"] == 1
    table = _wait_empty(url)
    assert table["open_envs"] == 0 and table["sessions"] == 0
    added = log.read_text(errors="replace")[len(before) :]
    assert "Traceback" not in added and "ERROR" not in added and "Exception" not in added, added[-3000:]


@pytest.mark.timeout(300)
def test_soak_50_sessions_leaves_no_session_and_no_traceback(tmp_path):
    """benchmarks/faults/serve_soak.py end to end, run by path as users run it (its own server): 50
    sessions, 5 at a time; the session table and the open envs are back to 0, the server's threads
    back to its idle count, nothing logged."""
    env = {**os.environ, "AGENT_GYM_RESULTS_DIR": str(tmp_path)}
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "faults" / "serve_soak.py"),
            "--sessions",
            "50",
            "--every",
            "10",
            "--concurrency",
            "5",
            "--label",
            "test",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    [path] = (tmp_path / "serve_soak").glob("*.json")
    res = json.loads(path.read_text())["result"]
    assert res["sessions"] == 50 and [p["sessions"] for p in res["curve"]] == [0, 10, 20, 30, 40, 50]
    assert all(p["open_envs"] <= 5 and p["session_table"] <= 5 for p in res["curve"])
    assert res["settled"]["open_envs"] == 0 and res["settled"]["session_table"] == 0
    assert res["settled"]["threads"] <= res["curve"][0]["threads"] + 2  # per-session threads are gone
    assert res["tracebacks"] == 0 and res["error_lines"] == 0
    assert res["end_rss_mib"] < res["start_rss_mib"] + 64  # loose: the 5,000-session figure is in docs


@pytest.mark.timeout(120)
def test_help_and_an_unknown_id_answer_before_openenv_is_imported():
    probe = (
        "import sys\n"
        "from agent_gym import serve\n"
        "for argv in (['--help'], ['AgentR1/Nope-v0']):\n"
        "    try:\n"
        "        serve.main(argv)\n"
        "    except SystemExit as e:\n"
        "        print(repr(e.code)[:60])\n"
        "print(sorted(m for m in ('openenv', 'gradio', 'uvicorn', 'fastapi', 'pydantic') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[-3] == "0" and "unknown env id 'AgentR1/Nope-v0'" in lines[-2] and lines[-1] == "[]", r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "agent_gym.serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=90
    )
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m agent_gym.serve") and not r.stderr
    # The server's and clients' names live in their own modules; agent_gym.serve is the command line only.
    from agent_gym import env_client, serve

    assert env_client.RemoteToolEnv.__name__ == "RemoteToolEnv" and "AgentGymClient" in dir(env_client)
    for name in ("RemoteToolEnv", "AgentGymClient", "nope"):
        with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
            getattr(serve, name)


@pytest.mark.timeout(60)
def test_frame_problem_and_trim_heap():
    from agent_gym.env_server import frame_problem, trim_heap

    assert frame_problem({"type": "websocket.receive", "text": '{"type": "reset"}'}) is None
    assert frame_problem({"type": "websocket.receive", "text": "{not json"}) is None  # openenv-core's reply
    assert "got an array" in frame_problem({"type": "websocket.receive", "text": " [1]"})
    assert "binary frame (3 bytes)" in frame_problem({"type": "websocket.receive", "bytes": b"abc"})
    import platform

    assert trim_heap() is (platform.libc_ver()[0] == "glibc")  # glibc: trimmed; elsewhere: nothing to do
