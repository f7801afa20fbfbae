"""Code-env verdicts cannot be forged, and tasks given through
``reset(options={"task": ...})`` are validated like the file loaders' rows.

The answer runs in one sandbox and sends back only data (each call's result); the tests run in a
second sandbox with trusted code only and decide. With the one-process harness before it (the
answer's program, then the tests, then a printed random token), 6 of the 9 forging tricks below
scored 1.0 (print_marker, excepthook, always_equal, equal_subclass, frame_snoop, and
patched_builtins on HumanEval/33; benchmarks/verdicts/code_verdicts.py counts them); the exits and the
fake reply were already caught."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401
import envs.code as code
from agent_gym.sandbox import sandbox_available
from envs.code import BUILTIN_MBPP, CodeDataError

pytestmark = pytest.mark.skipif(
    not sandbox_available(),
    reason=("the sandbox does not run here: install bubblewrap (apt-get install -y bubblewrap; make setup does)"),
)
FAST = {"wall_s": 5, "cpu_s": 2}

# -- forging tricks: each an answer that does not solve the task ------------------------------------

# The one-process harness put a random token in the program and passed when the last line printed
# was that token: find it among the module's constants, print it, leave before the tests.
PRINT_MARKER = """
import os, sys
for c in sys._getframe().f_code.co_consts:
    if isinstance(c, str) and len(c) == 32 and set(c) <= set('0123456789abcdef'):
        print(c)
sys.stdout.flush()
os._exit(0)
"""
EXIT_0 = "import os\nos._exit(0)"
SYS_EXIT = "import sys\nsys.exit(0)"


# a failed assertion ends the program through sys.excepthook: print the token from there, exit 0
def excepthook(name: str) -> str:
    return f"""
import os, sys
_consts = sys._getframe().f_code.co_consts
def _hook(*a):
    for c in _consts:
        if isinstance(c, str) and len(c) == 32 and set(c) <= set('0123456789abcdef'):
            print(c)
    sys.stdout.flush()
    os._exit(0)
sys.excepthook = _hook
def {name}(*args, **kwargs):
    return None
"""


def always_equal(name: str) -> str:
    return f"""
class _Any:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __hash__(self): return 0
def {name}(*args, **kwargs):
    return _Any()
"""


def equal_subclass(name: str) -> str:  # a plain type's subclass whose comparisons always succeed
    return f"""
class _S(str):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
class _I(int):
    def __eq__(self, other): return True
def {name}(*args, **kwargs):
    return _S('nope') if isinstance(args[0], str) else _I(-12345)
"""


def patched_builtins(name: str) -> str:  # the tests' helpers and exceptions made harmless
    return f"""
import builtins, sys
class _Any:
    def __eq__(self, other): return True
builtins.isinstance = lambda *a: True
builtins.set = lambda *a: _Any()
builtins.sorted = lambda *a, **k: _Any()
builtins.tuple = lambda *a: _Any()
builtins.AssertionError = SystemExit
sys.exit = lambda *a: None
def {name}(*args, **kwargs):
    return None
"""


def forged_reply(name: str) -> str:  # a well-formed reply, one result per call, written to every fd
    return f"""
import os, sys
def {name}(*args, **kwargs):
    return None
f = sys._getframe(1)  # the harness's frame that runs this program, when there is one
n = len(f.f_locals.get('calls', ())) or 50
reply = ascii({{'load_error': None, 'results': [['v', True]] * n}})
for fd in range(1, 20):
    try:
        os.write(fd, reply.encode())
    except OSError:
        pass
os._exit(0)
"""


def frame_snoop(name: str) -> str:  # read the expected value out of the calling test's bytecode
    return f"""
import dis, sys
def {name}(*args, **kwargs):
    f = sys._getframe(1)
    for ins in dis.get_instructions(f.f_code):
        if ins.offset > f.f_lasti and ins.opname == 'LOAD_CONST':
            return ins.argval
    return None
"""


TRICKS = {
    "print_marker": lambda n: PRINT_MARKER,
    "os_exit_0": lambda n: EXIT_0,
    "sys_exit_0": lambda n: SYS_EXIT,
    "excepthook": excepthook,
    "always_equal": always_equal,
    "equal_subclass": equal_subclass,
    "patched_builtins": patched_builtins,
    "forged_reply": forged_reply,
    "frame_snoop": frame_snoop,
}


@pytest.fixture(scope="module")
def mbpp():
    return gym.make("AgentR1/MBPP-v0", test_sandbox=FAST).unwrapped


@pytest.fixture(scope="module")
def humaneval():
    return gym.make("AgentR1/HumanEval-v0", test_sandbox=FAST).unwrapped


@pytest.mark.timeout(300)
@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_forging_tricks_score_zero_on_mbpp(mbpp, trick):
    """Every built-in MBPP problem whose tests the trick could have fooled (all of them, for the
    marker and exit tricks): 0."""
    tasks = [mbpp.get_task(k) for k in (0, 3, 7)]  # str results, bool results, a list of tuples
    for t in tasks:
        name = t["test_list"][0].split("assert ", 1)[1].split("(", 1)[0].strip()
        v = mbpp.verdict(TRICKS[trick](name), t)
        assert not v.passed and v.reason, (trick, t["id"], v)
        assert mbpp.score_answer(TRICKS[trick](name), t) == {"pass": 0.0}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_forging_tricks_score_zero_on_humaneval(humaneval, trick):
    for k in (0, 33):  # 33's tests call tuple() on the results: patched builtins fooled them
        t = humaneval.get_task(k)
        v = humaneval.verdict(TRICKS[trick](t["entry_point"]), t)
        assert not v.passed and v.reason, (trick, t["id"], v)


@pytest.mark.timeout(120)
def test_the_answer_never_sees_a_test_or_an_expected_value(mbpp):
    """The answer's sandbox receives the calls' arguments only: an answer that dumps every string
    it can reach (its frames' constants and locals, every object the collector tracks) finds no
    expected value of the hidden tests and no assert."""
    t = mbpp.get_task(11)  # to_roman: the expected values are long, unmistakable strings
    dump = """
import gc, sys
def to_roman(n):
    out = []
    for o in gc.get_objects():
        out.append(repr(o)[:100000])
    f = sys._getframe()
    while f is not None:
        out.append(repr(f.f_code.co_consts)); out.append(repr(f.f_locals)[:100000]); f = f.f_back
    sys.stderr.write('\\n'.join(out)[-60000:])
    return 'X'
"""
    v = mbpp.verdict(dump, t)
    assert not v.passed
    seen = v.answer_run.stderr
    assert "1994" in seen  # the dump works: an argument of the calls is there
    for expected in ("MCMXCIV", "MMMDCCCLXXXVIII", "assert"):
        assert expected not in seen


# -- canonical solutions still pass --------------------------------------------------------------


@pytest.mark.timeout(300)
def test_every_builtin_mbpp_solution_passes_and_wrong_answers_fail(mbpp):
    for k in range(len(BUILTIN_MBPP)):
        t = mbpp.get_task(k)
        v = mbpp.verdict(t["answer"], t)
        assert v.passed, (t["id"], v.reason)
    t = mbpp.get_task(0)
    for wrong in (
        "def reverse_words(s):\n    return s",
        "def reverse_words(s):\n    return 1/0",
        "def reverse_words(s):\n    while True: pass",
        "reverse_words = 3",
    ):
        v = mbpp.verdict(wrong, t)
        assert not v.passed and v.reason


# Problems whose tests are not a flat list of asserts: loops over random inputs (32: seeded, 38, 50,
# 53: unseeded), float tolerances (2, 4, 32), the entry point called by name in the tests (33), a
# dict result (111), None results (12, 136), a prompt helper used by the tests (10, 38, 50).
HE_SUBSET = (0, 2, 4, 10, 12, 32, 33, 38, 50, 53, 111, 136, 151, 163)


@pytest.mark.timeout(300)
def test_canonical_humaneval_solutions_pass_on_a_varied_subset(humaneval):
    """All 164 run in benchmarks/verdicts/code_verdicts.py (and in tests/envs/test_math_code.py)."""
    tasks = [humaneval.get_task(k) for k in HE_SUBSET]
    with ThreadPoolExecutor(2) as pool:
        verdicts = list(pool.map(lambda t: humaneval.verdict(t["answer"], t), tasks))
    assert [(t["id"], v.reason) for t, v in zip(tasks, verdicts) if not v.passed] == []


@pytest.mark.timeout(300)
def test_a_correct_answer_that_differs_from_the_reference_is_judged_by_the_tests(humaneval):
    """Results that differ from the reference's but satisfy the tests (a float tolerance, another
    root) pass: the tests decide, not equality with the reference. Wrong ones fail."""
    t = humaneval.get_task(32)  # find_zero: any root within 1e-4 passes
    bisect = (
        "def find_zero(xs):\n    f = lambda x: sum(c * x ** i for i, c in enumerate(xs))\n"
        "    lo, hi = -1.0, 1.0\n    while f(lo) * f(hi) > 0:\n        lo, hi = lo * 3, hi * 3\n"
        "    while hi - lo > 1e-12:\n        mid = (lo + hi) / 2\n"
        "        lo, hi = (mid, hi) if f(mid) * f(lo) > 0 else (lo, mid)\n    return (lo + hi) / 2\n"
    )
    v = humaneval.verdict(bisect, t)
    assert v.passed and v.tests_run is not None, v.reason  # not the reference's floats
    assert not humaneval.verdict("def find_zero(xs):\n    return 0.5\n", t).passed
    t4 = humaneval.get_task(4)  # mean_absolute_deviation: abs(candidate(xs) - y) < 1e-6
    mad = (
        "def mean_absolute_deviation(xs):\n    m = sum(xs) / len(xs)\n    return sum(abs(x - m) for x in xs) / len(xs)"
    )
    v = humaneval.verdict(mad + " + 1e-9\n", t4)
    assert v.passed and v.tests_run is not None, v.reason
    assert not humaneval.verdict(mad + " + 1e-3\n", t4).passed


@pytest.mark.timeout(120)
def test_results_cross_as_data_with_their_types():
    """Tuple against list, int against float, a set, a generator, a dict subclass, a namedtuple:
    the tests see the plain value the answer returned (a list is not equal to a tuple)."""
    env = gym.make("AgentR1/MBPP-v0", test_sandbox=FAST).unwrapped
    task = {
        "question": "q",
        "answer": "def f(x):\n    return (x, x)\n",
        "test_list": ["assert f(1) == (1, 1)", "assert f(2) != [2, 2]", "assert f(0.5) == (0.5, 0.5)"],
    }
    env.reset(options={"task": task})
    assert env.verdict(task["answer"], task).passed
    assert not env.verdict("def f(x):\n    return [x, x]\n", task).passed
    gen = "import collections\ndef f(x):\n    P = collections.namedtuple('P', 'a b')\n    return P(x, x)\n"
    assert env.verdict(gen, task).passed  # a namedtuple is a tuple
    t2 = {
        "question": "q",
        "answer": "def g(n):\n    return {i: i * i for i in range(n)}\n",
        "test_list": [
            "assert g(3) == {0: 0, 1: 1, 2: 4}",
            "assert list(h(3)) == [0, 1, 2]",
            "assert set(h(2)) == {0, 1}",
        ],
        "challenge_test_list": [],
    }
    t2["answer"] += "def h(n):\n    return list(range(n))\n"
    assert env.verdict(t2["answer"], t2).passed
    lazy = (
        "import collections\ndef g(n):\n    return collections.OrderedDict((i, i * i) for i in range(n))\n"
        "def h(n):\n    return (i for i in range(n))\n"
    )
    assert env.verdict(lazy, t2).passed  # a dict subclass and a generator arrive as data


@pytest.mark.timeout(120)
def test_non_data_results_only_go_back_to_the_answer():
    """A test that builds the answer's objects and passes them to its function (MBPP 601 does,
    with a Pair class) works; comparing a non-data result fails instead of trusting its __eq__."""
    env = gym.make("AgentR1/MBPP-v0", test_sandbox=FAST).unwrapped
    ref = (
        "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
        "def longest(pairs):\n    return max(p.b - p.a for p in pairs)\n"
    )
    task = {
        "question": "q",
        "answer": ref,
        "test_list": ["assert longest([Pair(1, 5), Pair(2, 3)]) == 4", "assert longest([Pair(0, 1)]) == 1"],
    }
    env.reset(options={"task": task})
    assert env.verdict(ref, task).passed
    assert not env.verdict(ref.replace("p.b - p.a", "p.a - p.b"), task).passed
    t2 = {"question": "q", "answer": ref, "test_list": ["assert Pair(1, 2) == Pair(1, 2)"]}
    v = env.verdict(ref + "Pair.__eq__ = lambda s, o: True\n", t2)
    assert not v.passed and "not data" in v.reason


# -- one validation for reset(options=...) and the file loaders ----------------------------------


def _mbpp(**kw):
    task = {
        "question": "Add one.",
        "answer": "def add_one(x):\n    return x + 1\n",
        "test_list": ["assert add_one(1) == 2", "assert add_one(-1) == 0"],
    }
    task.update(kw)
    return task


BAD_MBPP = [
    (dict(test_list=[]), "'test_list' must be a non-empty list"),
    (dict(test_list="assert add_one(1) == 2"), "'test_list' must be a non-empty list"),
    (dict(test_list=[3]), "'test_list' must be a non-empty list of assertion strings"),
    (dict(test_list=["assert add_one(1) =="]), r"test_list\[0\] is not valid Python"),
    (dict(test_list=["add_one(1)"]), r"test_list\[0\] has no assert"),
    (dict(test_list=["assert True"]), r"test_list\[0\] calls none of the functions"),
    (dict(answer="def add_two(x):\n    return x + 2\n"), r"test_list\[0\] calls none of the functions"),
    (dict(answer=""), "'(answer|code)'.*defines no function"),
    (dict(answer=None), "key '(answer|code)' must be a str"),
    (dict(answer="def add_one(x) return"), "'(answer|code)'.*is not valid Python"),
    (dict(challenge_test_list="x"), "'challenge_test_list' must be a list"),
    (dict(test_setup_code=5), "'test_setup_code' must be a string"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("change,match", BAD_MBPP, ids=[m for _, m in BAD_MBPP])
def test_bad_mbpp_tasks_are_refused_by_reset_and_by_the_loader(tmp_path, mbpp, change, match):
    with pytest.raises(ValueError, match=match):
        mbpp.reset(options={"task": _mbpp(**change)})
    row = {
        "task_id": 11,
        "text": "Add one.",
        "code": _mbpp()["answer"],
        "test_list": _mbpp()["test_list"],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
    row.update({"code" if k == "answer" else k: v for k, v in change.items()})
    p = tmp_path / "mbpp.jsonl"
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(CodeDataError, match=match):
        gym.make("AgentR1/MBPP-v0", data_path=str(p), split="all")


@pytest.mark.timeout(120)
def test_empty_mbpp_test_list_no_longer_pays_for_pass(mbpp):
    """Before: reset accepted test_list [] and the answer `pass` scored 1.0."""
    with pytest.raises(ValueError, match="non-empty"):
        mbpp.reset(options={"task": _mbpp(test_list=[])})
    mbpp.reset(options={"task": _mbpp()})
    *_, info = mbpp.step(mbpp.encode_turn("<answer>pass</answer>"))
    assert info["answer_scores"] == {"pass": 0.0}
    mbpp.reset(options={"task": _mbpp()})
    *_, info = mbpp.step(mbpp.encode_turn("<answer>def add_one(x):\n    return x + 1</answer>"))
    assert info["answer_scores"] == {"pass": 1.0}


BAD_HUMANEVAL = [
    (dict(entry_point="not a name"), "'entry_point' must be a Python identifier"),
    (dict(entry_point=None), "key 'entry_point' must be a str"),
    (dict(test="def test(candidate):\n    assert candidate(1) == 2\n"), "'test' defines no check"),
    (dict(test="def check(candidate):\n    assert candidate(1) ==\n"), "'test' is not valid Python"),
    (dict(test="def check():\n    assert True\n"), "check.*must take the candidate"),
    (dict(answer="def other(x):\n    return x\n"), "'answer'.*does not define the entry point 'add_one'"),
    (dict(prompt=3), "key 'prompt' must be a str"),
]


def _he(**kw):
    task = {
        "question": "def add_one(x):\n",
        "prompt": 'def add_one(x):\n    """x + 1"""\n',
        "answer": "def add_one(x):\n    return x + 1\n",
        "entry_point": "add_one",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n",
    }
    task.update(kw)
    return task


@pytest.mark.timeout(120)
@pytest.mark.parametrize("change,match", BAD_HUMANEVAL, ids=[m for _, m in BAD_HUMANEVAL])
def test_bad_humaneval_tasks_are_refused_by_reset_and_by_the_loader(tmp_path, humaneval, change, match):
    with pytest.raises(ValueError, match=match):
        humaneval.reset(options={"task": _he(**change)})
    task = _he(**change)
    row = {
        "task_id": "X/0",
        "prompt": task["prompt"],
        "entry_point": task["entry_point"],
        "test": task["test"],
        "canonical_solution": "    return x + 1\n" if "answer" not in change else "\n" + task["answer"],
    }
    if "answer" in change:
        row["prompt"] = ""
    p = tmp_path / "he.jsonl"
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(CodeDataError, match=match):
        gym.make("AgentR1/HumanEval-v0", data_path=str(p))


@pytest.mark.timeout(120)
def test_a_valid_humaneval_task_through_reset_is_scored_by_its_tests(humaneval):
    humaneval.reset(options={"task": _he()})
    *_, info = humaneval.step(humaneval.encode_turn("<answer>def add_one(x):\n    return x + 1</answer>"))
    assert info["answer_scores"] == {"pass": 1.0}
    assert humaneval.verdict("    return x + 1\n", _he()).passed  # a completion of the prompt
    humaneval.reset(options={"task": _he()})  # the env strips the answer: the completion loses its indent
    *_, info = humaneval.step(humaneval.encode_turn("<answer>    y = x + 1\n    return y\n</answer>"))
    assert humaneval.answer.startswith("y = ") and info["answer_scores"] == {"pass": 1.0}
    humaneval.reset(options={"task": _he()})
    *_, info = humaneval.step(humaneval.encode_turn("<answer>def add_one(x):\n    return 2</answer>"))
    assert info["answer_scores"] == {"pass": 0.0}
    never = _he(test="def check(candidate):\n    if False:\n        candidate(1)\n")
    humaneval.reset(options={"task": never})  # statically fine; the verdict finds no call
    v = humaneval.verdict("def add_one(x):\n    return x + 1\n", never)
    assert not v.passed and "never call" in v.reason


@pytest.mark.timeout(120)
def test_mbpp_tests_keep_using_the_modules_the_answer_imported(mbpp):
    """MBPP tests such as `assert math.isclose(f(1), 3.14, rel_tol=1e-3)` used the answer's own
    `import math`: the tests' namespace imports the module itself; the tolerance still decides."""
    task = {
        "question": "q",
        "answer": "def area(r):\n    import math\n    return math.pi * r * r\n",
        "test_list": ["assert math.isclose(area(1), 3.14159, rel_tol=1e-3)", "assert area(0) == 0"],
    }
    mbpp.reset(options={"task": task})
    assert mbpp.verdict("def area(r):\n    return 3.1416 * r * r\n", task).passed
    assert not mbpp.verdict("def area(r):\n    return 3 * r * r\n", task).passed


@pytest.mark.timeout(120)
def test_exceptions_cross_by_name_and_cannot_end_a_tests_iteration(mbpp):
    """The answer's exception is raised in the tests by its built-in type (a test may expect it);
    StopIteration, which would quietly end a test's map() or next(), arrives as RuntimeError."""
    task = {
        "question": "q",
        "answer": "def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return x\n",
        "test_list": [
            "assert list(map(f, [1, 2])) == [1, 2]",
            "try:\n    f(-1)\n    assert False\nexcept ValueError:\n    pass",
        ],
    }
    mbpp.reset(options={"task": task})
    assert mbpp.verdict(task["answer"], task).passed
    assert not mbpp.verdict("def f(x):\n    raise TypeError(x)\n", task).passed
    t2 = {**task, "test_list": ["assert list(map(f, [1, 2])) == []"]}
    mbpp.reset(options={"task": t2})
    v = mbpp.verdict("def f(x):\n    raise StopIteration\n", t2)
    assert not v.passed and "RuntimeError" in v.reason


def test_ast_work_is_serialized_and_a_spurious_recursion_depth_error_is_retried(monkeypatch):
    """CPython 3.11's AST constructor keeps its recursion counter per interpreter, so two threads
    building trees at once can fail with a SystemError on valid input (seen on this suite's
    threaded HumanEval verdicts). envs.code runs its own ast calls one at a time and retries that
    error once; any other SystemError still raises."""
    inside, most, seen = [0], [0], threading.Lock()

    def slow_parse(src):
        with seen:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        with seen:
            inside[0] -= 1
        return src

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda s: code._ast(slow_parse, s), "abcdefgh")) == list("abcdefgh")
    assert most[0] == 1

    calls = []

    def flaky(src):
        calls.append(src)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=33, after=28)")
        return {"ok": src}

    assert code._ast(flaky, "x") == {"ok": "x"} and calls == ["x", "x"]

    def broken(src):
        raise SystemError("something else")

    with pytest.raises(SystemError, match="something else"):
        code._ast(broken, "x")
    reply, why = code._reply(
        code.SandboxResult(status="ok", exit_code=0, stdout="{'a': [1, 2]}", stderr="", wall_s=0.0), "p", literal=True
    )
    assert reply == {"a": [1, 2]} and why == ""
