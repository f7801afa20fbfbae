"""Kind ``ray`` (agent_gym/retrievers/ray_actor.py) without a Ray cluster: argument checks, the
clear error without a Ray session, and the QA env handing it the corpus. The cluster part (two
processes sharing one actor, a restart) runs in tests/trainers/test_ray_rollout.py, on the Ray
cluster that test starts anyway."""

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401  (registers the env ids)
from agent_gym.retrievers import make_retriever

HOTPOT = str(Path(__file__).resolve().parents[1] / "fixtures" / "qa" / "hotpotqa")


def test_ray_kind_checks_its_arguments():
    with pytest.raises(ValueError, match="inner='ray' must name the retriever the shared actor builds, one of bm25"):
        make_retriever("ray", inner="ray")
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        make_retriever("ray", inner="bm25", timeout_s=0)


@pytest.mark.timeout(120)
def test_ray_kind_without_a_ray_session_says_so():
    """In a fresh process, so that no Ray session another test of this worker started is around
    (what this test sees must not depend on the order the tests ran in)."""
    code = (
        "from agent_gym.retrievers import make_retriever\n"
        "r = make_retriever('ray', inner='bm25', corpus=[{'id': 'a', 'title': 'A', 'text': 'a b c'}])\n"
        "try:\n    r.search(['a'], 1)\nexcept RuntimeError as e:\n    print('RuntimeError:', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    assert "RuntimeError: retriever 'ray' needs a running Ray session" in out.stdout, out.stdout + out.stderr


def test_qa_env_gives_the_shared_actor_its_corpus():
    env = gym.make("AgentR1/HotpotQA-v0", data_path=HOTPOT, retriever="ray", retriever_kwargs={"cache": False})
    r = env.unwrapped.retriever
    assert type(r).__name__ == "RayRetriever" and r.inner == "bm25" and r._actor is None  # nothing started yet
    titles = {row["title"] for row in r.kwargs["corpus"]}
    assert titles == {row["title"] for row in env.unwrapped._corpus_docs()} and titles
    env.close()
