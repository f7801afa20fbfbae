"""Envs built in several threads at once, first thing in a fresh process (what the OpenAI-compatible
evaluation's worker threads do): transformers' lazy module is not thread-safe, and before
``agent_gym.tokenizer.IMPORT_LOCK`` 1 to 3 of 4 threads failed with ``ImportError: cannot import
name 'PreTrainedTokenizerFast'`` (3 runs of 3 here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""\
    import threading
    import gymnasium as gym
    import agent_gym  # noqa: F401
    barrier, errors, made = threading.Barrier(6), [], []

    def build():
        barrier.wait()
        try:
            made.append(gym.make("AgentR1/FactChain-v0").unwrapped.tokenizer)
        except Exception as e:  # the failure under test
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=build) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(made) == 6 and all(t is made[0] for t in made), len(made)  # one default tokenizer
    print("ok")
    """)


@pytest.mark.timeout(300)
def test_envs_built_in_threads_first_thing_in_a_process():
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=240)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
