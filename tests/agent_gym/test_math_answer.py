"""agent_gym.math_answer: \\boxed{} extraction, answer equivalence (math-verify after a pre-processing
step, in a worker process under a hard time limit), and Math-v0's scoring and task validation (no hangs,
no pay for wrong answers, tasks checked at reset). The hand-labelled battery is tests/agent_gym/test_math_battery.py."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym import math_answer
from agent_gym.math_answer import answers_match, as_text, check_answer, extract_answer, last_boxed, normalize, prepare
from envs.math import MathDataError


@pytest.mark.parametrize(
    "text, want",
    [
        ("so \\boxed{5}.", "5"),
        ("\\boxed{1} then \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),  # the last one, nested braces
        ("\\boxed{\\left\\{1, 2\\right\\}}", "\\left\\{1, 2\\right\\}"),
        ("\\fbox{x^{2}}", "x^{2}"),
        ("$\\boxed 7$", "7"),
        ("\\boxed{unclosed {", None),
        ("no box here", None),
        ("\\boxed", None),
    ],
)
def test_last_boxed(text, want):
    assert last_boxed(text) == want


def test_extract_answer_falls_back_to_the_text():
    assert extract_answer("  42 ") == "42"
    assert extract_answer("The answer is \\boxed{42}.") == "42"


# The reported cases, each of which the old checker got wrong.
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "pred, gold, want",
    [
        ("999999", "1000000", False),  # integers compare exactly (old: relative tolerance 1e-6)
        ("20030020", "20030010", False),
        ("10^{-7}", "0", False),
        ("3.14159", "\\pi", False),  # a decimal is the exact number it writes
        ("0.333333", "\\frac13", False),
        ("5", "\\infty", False),  # a finite number is not infinity
        ("10^{100}", "\\infty", False),
        ("-\\infty", "\\infty", False),
        ("(2,5)", "[2,5]", False),  # open and closed ends differ
        ("[2,\\infty)", "(2,\\infty)", False),
        ("(-\\infty, 3)", "(-\\infty,3]", False),
        ("5\\text{ cm}", "5", True),  # units dropped
        ("\\$5", "5", True),
        ("\\{3,1,2\\}", "\\{1,2,3\\}", True),  # sets in any order
        ("Monday", "monday", True),  # words, case-insensitively
        ("0.\\overline{3}", "\\frac13", True),  # a repeating decimal is its fraction
        ("1\\frac12", "\\frac32", True),  # a mixed number
        ("x \\in [2,5]", "[2,5]", True),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\text{Dynamo}", "\\text{Monday}", False),  # not a product of commuting letters
    ],
)
def test_reported_verifier_cases(pred, gold, want):
    ok, how = check_answer(pred, gold, timeout=30.0)  # generous: the verdict is tested here, not the speed
    assert ok is want, how
    assert how in math_answer.STATUSES


@pytest.mark.parametrize(
    "raw, want",
    [
        ("0.75", "(\\frac{3}{4})"),
        ("7.00", "7"),
        (".5", "(\\frac{1}{2})"),
        ("0.\\overline{3}", "(\\frac{1}{3})"),
        ("0.1\\bar{6}", "(\\frac{1}{6})"),
        ("-2\\frac{1}{2}", "-(\\frac{5}{2})"),
        ("1\\frac12", "(\\frac{3}{2})"),
        ("x^2\\frac{1}{2}", "x^2\\frac{1}{2}"),  # an exponent followed by a fraction is not a mixed number
        ("1.5e-3", "(\\frac{3}{2})\\times10^{-3}"),
        ("\\$1,000", "\\$1000"),
        ("(1,000)", "(1,000)"),  # a pair, not a thousands separator
        ("50\\%", "50"),
        ("12.", "12"),
        ("\\varnothing", "\\emptyset"),
    ],
)
def test_prepare_makes_numbers_exact(raw, want):
    assert prepare(raw) == want


@pytest.mark.parametrize(
    "raw, want",
    [
        ("\\text{Monday}", "monday"),
        ("no  Solution", "no solution"),
        ("odd.", "odd"),
        ("B", None),
        ("x+y", None),
        ("\\pi", None),
        ("5", None),
        ("\\text{(B)}", None),
    ],
)
def test_as_text(raw, want):
    assert as_text(raw) == want


# Each ran the old answer check for over 150 s.
@pytest.mark.timeout(180)
@pytest.mark.parametrize("pred", ["(x+1)^{10000}", "(x+y+z)^{300}", "((((x+1)^2+1)^2+1)^2+1)^{50}", "9^{9^{9^9}}"])
def test_expansions_that_hang_score_0_with_reason_timeout(pred):
    assert check_answer(pred, "x^2+1", timeout=1.0) == (False, "timeout")
    assert check_answer("\\frac{2}{4}", "0.5", timeout=30.0) == (True, "math_verify")  # a fresh worker took over


@pytest.mark.timeout(180)
def test_the_limit_holds_in_threads_where_signal_timeouts_cannot_work():
    """Env steps may run on a thread pool (agent_gym/vector.py); math-verify's own timeouts use
    signal.alarm, which only works in the main thread."""
    cases = [
        ("(x+1)^{10000}", "x^2+1", 1.0),
        ("\\frac{2}{4}", "0.5", 30.0),
        ("\\sqrt{8}", "2\\sqrt{2}", 30.0),
        ("(x+y+z)^{300}", "1", 1.0),
    ]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda c: check_answer(*c), cases))
    assert got[0] == (False, "timeout") and got[3] == (False, "timeout")
    assert [ok for ok, _ in got[1:3]] == [True, True]


@pytest.mark.timeout(120)
def test_a_worker_killed_from_outside_is_replaced():
    assert check_answer("\\frac{2}{4}", "0.5") == (True, "math_verify")
    assert math_answer._idle, "the worker went back to the pool"
    for w in list(math_answer._idle):
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
    assert check_answer("\\frac{3}{6}", "0.5") == (True, "math_verify")


@pytest.mark.timeout(120)
def test_a_forked_child_uses_workers_of_its_own():
    assert check_answer("\\frac{2}{4}", "0.5") == (True, "math_verify")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's workers are not its to use
        ok = math_answer._idle == [] and check_answer("\\frac{3}{6}", "0.5") == (True, "math_verify")
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert check_answer("\\frac{4}{8}", "0.5") == (True, "math_verify")


@pytest.mark.timeout(120)
def test_hostile_answers_are_never_evaluated_as_python(tmp_path):
    marker = tmp_path / "pwned"
    for pred in (
        f"__import__('os').system('touch {marker}')",
        "eval(1)",
        "(1).__class__",
        "1e9999999",
        "9" * 500,
        "x" * 400,
    ):
        ok, how = check_answer(pred, "1", timeout=2.0)  # 1e9999999 is 10^{9999999}: a timeout
        assert ok is False and how in math_answer.STATUSES, how
    assert not marker.exists()


def test_normalize_type_and_value_errors():
    assert normalize(" \\left( \\dfrac{1}{2} \\right) .") == "(\\frac{1}{2})"
    assert normalize("x \\le 3") == normalize("x\\leq 3") == "x\\leq3"
    with pytest.raises(TypeError, match="strings"):
        check_answer(5, "5")  # type: ignore[arg-type]
    for bad in (0, -1, True, "5"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            check_answer("5", "5", timeout=bad)  # type: ignore[arg-type]
    assert answers_match("", "1") is False and check_answer("\\boxed{}", "1") == (False, "empty")


# -- Math-v0: scoring and task validation ---------------------------------------------------------------


@pytest.fixture(scope="module")
def env():
    return gym.make("AgentR1/Math-v0", python_tool=False).unwrapped


def _answer(env, text):
    return env.step(env.encode_turn(f"<answer>{text}</answer>"))


@pytest.mark.timeout(120)
def test_math_env_scores_a_hanging_answer_0_with_timeout_in_info(env):
    quick = gym.make("AgentR1/Math-v0", python_tool=False, answer_timeout=1.0).unwrapped
    quick.reset(options={"task": {"id": "t", "question": "Expand (x+1)^2.", "answer": "x^2+2x+1"}})
    _, reward, terminated, truncated, info = _answer(quick, "\\boxed{(x+1)^{10000}}")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["answer_scores"] == {"correct": 0.0, "em": 0.0, "timeout": 1.0}
    assert info["trajectory"].answer_scores["timeout"] == 1.0 and not info["trajectory"].success
    env.reset(options={"task": {"id": "t", "question": "Expand (x+1)^2.", "answer": "x^2+2x+1"}})
    _, reward, *_, info = _answer(env, "\\boxed{(x+1)^2}")
    assert reward == 1.0 and info["answer_scores"] == {"correct": 1.0, "em": 0.0, "timeout": 0.0}


@pytest.mark.timeout(120)
def test_math_env_pays_exact_integers_only(env):
    env.reset(options={"task": {"id": "t", "question": "How many?", "answer": 20030010}})  # a number is a gold too
    assert env.task["answer"] == "20030010"
    _, reward, *_ = _answer(env, "\\boxed{20030020}")
    assert reward == 0.0


@pytest.mark.parametrize(
    "task, match",
    [
        ({"question": "q", "answer": None}, "key 'answer' must be a number or a non-empty string"),
        ({"question": "q", "answer": ""}, "key 'answer'"),
        ({"question": "q", "answer": "   "}, "key 'answer'"),
        ({"question": "q", "answer": "$ $"}, "key 'answer'"),
        ({"question": "q", "answer": "\\boxed{ }"}, "key 'answer'"),
        ({"question": "q", "answer": True}, "key 'answer'"),
        ({"question": "q", "answer": ["1"]}, "key 'answer'"),
        ({"question": "q", "solution": "no box"}, "no \\\\boxed"),
        ({"question": "q", "solution": "so \\boxed{}"}, "empty \\\\boxed"),
        ({"question": "", "answer": "1"}, "'problem' \\(or 'question'\\)"),
        ({"answer": "1"}, "'problem' \\(or 'question'\\)"),
        ({"question": "q"}, "missing key 'answer'"),
        ("not a dict", "must be a dict"),
    ],
)
def test_math_tasks_are_validated_alike_from_reset_options_and_from_files(env, tmp_path, task, match):
    with pytest.raises(MathDataError, match=match) as e:
        env.reset(options={"task": task})
    assert "options['task']" in str(e.value)
    if isinstance(task, dict):  # the file loader refuses the same row, naming the file and the line
        import json

        p = tmp_path / "bad.jsonl"
        p.write_text(json.dumps(task) + "\n")
        with pytest.raises(MathDataError, match=match) as e:
            gym.make("AgentR1/Math-v0", data_path=str(p), python_tool=False)
        assert "bad.jsonl, line 1" in str(e.value)


def test_math_task_from_reset_options_keeps_its_other_keys(env):
    env.reset(options={"task": {"id": "x7", "problem": "Compute 2+2.", "answer": " 4 ", "program": "print(4)"}})
    assert env.task["answer"] == "4" and env.task["program"] == "print(4)" and env.task["question"] == "Compute 2+2."
    with pytest.raises(ValueError, match="answer_timeout must be a positive number"):
        gym.make("AgentR1/Math-v0", python_tool=False, answer_timeout=0)


def test_math_env_without_math_verify_fails_at_construction_naming_the_fix(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "math_verify", None)  # as if it were not installed
    with pytest.raises(ImportError, match="pip install math-verify"):
        gym.make("AgentR1/Math-v0", python_tool=False)
