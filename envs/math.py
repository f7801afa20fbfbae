"""AgentR1/Math-v0: competition math with a sandboxed Python tool; answers checked symbolically.

Card
----
Task
    A math problem (the MATH dataset's ``problem`` text, or a synthetic one). The agent may run
    Python, then answers with ``<answer>\\boxed{...}</answer>`` (the ``\\boxed{}`` is optional).
Tools
    ``python(code)``: runs the program in the sandbox of :mod:`agent_gym.sandbox` (bubblewrap: no
    network, a private temporary directory, CPU, memory, process, output and wall-clock limits;
    docs/sandbox.md) and returns what it printed. A failed program (an exception, a limit) is a
    ``tool_error`` whose message carries the error. Limits: ``sandbox={...}``
    (``SandboxLimits`` fields; default 5 s CPU, 10 s wall, 512 MiB). ``python_tool=False`` gives
    a tool-less env (a model answers directly).
Observation
    The token ids of the conversation (system prompt with the tool schema, the problem, every
    turn and tool response); ``tool_format="hermes"``.
Reward
    Outcome, on the answer turn: ``correct`` (weight 1 by default), 1.0 when the answer (its last
    ``\\boxed{}``, else the whole answer) is equivalent to the gold answer under
    :func:`agent_gym.math_answer.check_answer`: Hugging Face's math-verify after a pre-processing
    step that makes numbers exact (integers and decimals compare exactly, ``0.333333`` is not
    ``\\frac13``, ``3.14159`` is not ``\\pi``, a finite number is not ``\\infty``; open and closed
    intervals differ; sets in any order; units, ``\\$``, ``\\%`` and ``^\\circ`` dropped; word
    answers compared case-insensitively), within a hard time limit (``answer_timeout``, 5 s): a
    check that runs past it (``(x+1)^{10000}``) is killed and scores 0 with ``timeout`` 1.0.
    ``answer_scores`` (in ``info`` and the trajectory) holds ``correct``, ``em`` (normalized
    strings equal, logged) and ``timeout`` (1.0 when the check hit its limit). Success is
    ``correct``. Process components (``call_ok`` and so on) are 0 by default.
Oracle
    ``demonstration(task)``: for a synthetic task, one python call running the task's own
    program (which prints the answer), then ``<answer>\\boxed{gold}</answer>``; for a MATH task
    (which has no program), the boxed gold answer. ``benchmarks/verdicts/oracle_math_code.py`` and
    ``trainers/evaluate.py --policy oracle`` run it; it scores 1.0 on every problem.
Data
    ``data_path=None`` (default): ``num_tasks`` (500) synthetic problems built in code from
    ``seed``; task ``k`` is a pure function of ``(seed, k)``: arithmetic, linear equations
    (fractional answers), the larger root of a quadratic, lcm and gcd, modular powers, sums of
    fractions, binomial coefficients, sums of integer ranges. ``data_path=`` the MATH dataset
    (Hendrycks et al. 2021): its official directory (``MATH/`` with ``train/`` and ``test/``, or
    one split's directory, of ``<subject>/<n>.json`` files with ``problem`` and ``solution``), or a
    JSONL file of rows with ``problem`` (or ``question``) and ``answer`` (or ``solution``, whose
    last ``\\boxed{}`` is the answer). ``split`` (``"test"``) picks the official split's
    directory; ``limit`` keeps the first N problems. A bad file or row raises naming the file,
    the row and the key. A task given as ``reset(options={"task": {...}})`` passes the same
    check (:func:`validate_task`): a non-empty string ``question`` (or ``problem``) and a gold
    ``answer`` (a number or a string, or a ``solution`` with a ``\\boxed{}`` answer) that is not
    empty or blank (``None``, ``""``, ``"  "``, ``\\boxed{}`` are refused).
Parameters
    ``data_path``, ``split``, ``limit``, ``num_tasks``, ``seed``, ``sandbox``, ``python_tool``,
    ``system_prompt``, ``answer_timeout`` (5.0 seconds: the hard limit on one answer check),
    ``max_turns`` (6), ``max_context_tokens`` (4096), and every ``ToolEnv``
    argument. ``rewards`` defaults to ``{"answer_weights": {"correct": 1.0}}``.
Versions
    v0: first release. Since 2026-11-25, answers are checked by math-verify under a time limit
    (before: the project's own sympy checker, with no limit on symbolic expansion; on the
    404-pair battery of docs/envs/math.md it accepted 41 of 190 wrong answers and rejected 72 of
    214 right ones, the new checker 0 and 1).
"""

from __future__ import annotations

import functools
import json
import math
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from agent_gym.cli_errors import UserError
from agent_gym.env import ToolEnv, check_env_kwargs
from agent_gym.math_answer import DEFAULT_TIMEOUT_S, check_answer, extract_answer, last_boxed, normalize
from agent_gym.math_answer import check_available as check_math_verify_available
from agent_gym.sandbox import PythonTool, check_available

SYSTEM_PROMPT = (
    "Solve the math problem. You may run Python programs with the python tool (print what you "
    "need to see). Give the final answer as <answer>\\boxed{...}</answer>, simplified, with "
    "fractions in lowest terms."
)


# -- synthetic problems --------------------------------------------------------------------------


def frac_latex(f: Fraction) -> str:
    """``Fraction(-3, 4)`` -> ``-\\frac{3}{4}``; an integer stays an integer."""
    if f.denominator == 1:
        return str(f.numerator)
    sign = "-" if f < 0 else ""
    return f"{sign}\\frac{{{abs(f.numerator)}}}{{{f.denominator}}}"


_PRINT_FRAC = "from fractions import Fraction\n"


def _arith(r: np.random.Generator) -> tuple[str, str, str]:
    a, b, c = (int(x) for x in r.integers(12, 999, size=3))
    return f"Compute ${a} \\times {b} + {c}$.", str(a * b + c), f"print({a} * {b} + {c})"


def _linear(r: np.random.Generator) -> tuple[str, str, str]:
    a = int(r.integers(2, 20)) * (1 if r.random() < 0.7 else -1)
    b, c = (int(x) for x in r.integers(-50, 50, size=2))
    x = Fraction(c - b, a)
    sb = f"+ {b}" if b >= 0 else f"- {-b}"
    return (
        f"Solve for $x$: ${a}x {sb} = {c}$. Express your answer as a fraction in lowest terms.",
        frac_latex(x),
        _PRINT_FRAC + f"print(Fraction({c} - ({b}), {a}))",
    )


def _quadratic(r: np.random.Generator) -> tuple[str, str, str]:
    p, q = (int(x) for x in r.choice(np.arange(-15, 16), size=2, replace=False))
    s, t = -(p + q), p * q
    poly = (
        "x^2"
        + (f" + {s}x" if s > 0 else f" - {-s}x" if s < 0 else "")
        + (f" + {t}" if t > 0 else f" - {-t}" if t < 0 else "")
    )
    prog = f"import math\nb, c = {s}, {t}\nr = math.isqrt(b * b - 4 * c)\nprint(max((-b + r) // 2, (-b - r) // 2))"
    return f"What is the larger root of ${poly} = 0$?", str(max(p, q)), prog


def _lcm(r: np.random.Generator) -> tuple[str, str, str]:
    a, b = (int(x) for x in r.integers(6, 400, size=2))
    if r.random() < 0.5:
        return (
            f"What is the least common multiple of {a} and {b}?",
            str(math.lcm(a, b)),
            f"import math\nprint(math.lcm({a}, {b}))",
        )
    return (
        f"What is the greatest common divisor of {a * 6} and {b * 6}?",
        str(math.gcd(a * 6, b * 6)),
        f"import math\nprint(math.gcd({a * 6}, {b * 6}))",
    )


def _modpow(r: np.random.Generator) -> tuple[str, str, str]:
    a, n, m = int(r.integers(2, 30)), int(r.integers(20, 500)), int(r.integers(3, 50))
    return (
        f"What is the remainder when ${a}^{{{n}}}$ is divided by {m}?",
        str(pow(a, n, m)),
        f"print(pow({a}, {n}, {m}))",
    )


def _fracsum(r: np.random.Generator) -> tuple[str, str, str]:
    a, c = (int(x) for x in r.integers(1, 20, size=2))
    b, d = (int(x) for x in r.integers(2, 25, size=2))
    total = Fraction(a, b) + Fraction(c, d)
    return (
        f"Compute $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$. Express your answer as a fraction in lowest terms.",
        frac_latex(total),
        _PRINT_FRAC + f"print(Fraction({a}, {b}) + Fraction({c}, {d}))",
    )


def _binom(r: np.random.Generator) -> tuple[str, str, str]:
    n = int(r.integers(5, 30))
    k = int(r.integers(1, n))
    return (
        f"In how many ways can {k} books be chosen from {n} different books?",
        str(math.comb(n, k)),
        f"import math\nprint(math.comb({n}, {k}))",
    )


def _range_sum(r: np.random.Generator) -> tuple[str, str, str]:
    a = int(r.integers(-100, 100))
    b = a + int(r.integers(5, 500))
    return (
        f"What is the sum of all integers from {a} to {b}, inclusive?",
        str(sum(range(a, b + 1))),
        f"print(sum(range({a}, {b} + 1)))",
    )


FAMILIES = {
    "arithmetic": _arith,
    "linear": _linear,
    "quadratic": _quadratic,
    "lcm_gcd": _lcm,
    "modpow": _modpow,
    "fraction_sum": _fracsum,
    "binomial": _binom,
    "range_sum": _range_sum,
}


def synthetic_task(seed: int, index: int) -> dict[str, Any]:
    """Synthetic task ``index``: family ``index % 8``, its numbers drawn from ``(seed, index)``."""
    names = list(FAMILIES)
    family = names[index % len(names)]
    question, answer, program = FAMILIES[family](np.random.default_rng([int(seed), 4099, int(index)]))
    return {
        "id": f"math-synth-{seed}-{index}",
        "question": question,
        "answer": answer,
        "type": family,
        "level": "synthetic",
        "program": program,
    }


# -- MATH data -----------------------------------------------------------------------------------


class MathDataError(UserError, ValueError):
    """A MATH file or row that cannot be read; the message names the file, the row and the key."""


def validate_task(row: Any, where: str, default_id: str) -> dict[str, Any]:
    """A task from a data row or from ``reset(options={"task": ...})``: the one check for both routes
    (see the card); ``MathDataError`` naming ``where`` and the key otherwise."""
    if not isinstance(row, dict):
        raise MathDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    question = row.get("problem", row.get("question"))
    if not isinstance(question, str) or not question.strip():
        raise MathDataError(f"{where}: missing or empty key 'problem' (or 'question'); keys are {sorted(row)}")
    if "answer" in row:
        answer = row["answer"]
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not _blank_free(answer):
            raise MathDataError(
                f"{where}: key 'answer' must be a number or a non-empty string (the gold answer), got {row['answer']!r}"
            )
    elif "solution" in row:
        answer = last_boxed(row["solution"]) if isinstance(row["solution"], str) else None
        if answer is None:
            raise MathDataError(f"{where}: key 'solution' has no \\boxed{{...}} answer")
        if not _blank_free(answer):
            raise MathDataError(f"{where}: key 'solution' has an empty \\boxed{{}} answer")
    else:
        raise MathDataError(
            f"{where}: missing key 'answer' (or 'solution' with a \\boxed{{}} answer); keys are {sorted(row)}"
        )
    return {
        "id": str(row.get("id", row.get("unique_id", default_id))),
        "question": question,
        "answer": answer.strip(),
        "type": str(row.get("type", row.get("subject", ""))),
        "level": str(row.get("level", "")),
    }


def _blank_free(answer: str) -> bool:
    """Whether a gold answer says something: not empty once ``$``, spaces and a ``\\boxed{}`` are removed
    (an empty gold could only ever be matched by an empty answer)."""
    return bool(extract_answer(answer).strip("$ \t\n"))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MathDataError(f"{path}: not valid JSON ({e})") from None


@functools.lru_cache(maxsize=8)
def _load_math_cached(path: str, split: str, mtime: float) -> tuple[dict[str, Any], ...]:
    p = Path(path)
    if p.is_dir():
        root = p / split if (p / split).is_dir() else p
        files = sorted(root.rglob("*.json"))
        if not files:
            raise MathDataError(
                f"{p}: no .json problem files under {root} (expected the MATH layout "
                f"<split>/<subject>/<n>.json, or pass a JSONL file)"
            )
        return tuple(validate_task(_read_json(f), str(f), f"{f.parent.name}/{f.stem}") for f in files)
    rows = []
    with open(p, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise MathDataError(f"{p}, line {n}: not valid JSON ({e})") from None
            rows.append(validate_task(row, f"{p}, line {n}", f"{p.stem}-{n}"))
    if not rows:
        raise MathDataError(f"{p}: no problems in the file")
    return tuple(rows)


def load_math(data_path: str | os.PathLike, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
    """MATH problems from the official directory or a JSONL file (see the card); cached per process."""
    p = Path(data_path)
    if not p.exists():
        raise FileNotFoundError(
            f"MATH data not found at {p}: pass data_path= the MATH directory or a JSONL file "
            "(or leave data_path unset for the built-in synthetic problems)"
        )
    tasks = list(_load_math_cached(str(p.resolve()), split, p.stat().st_mtime))
    return tasks[:limit] if limit is not None else tasks


# -- the env -------------------------------------------------------------------------------------


class MathEnv(ToolEnv):
    uses_sandbox = True
    """Runs agent code in :mod:`agent_gym.sandbox` (the conformance suite fuzzes it on a reduced budget)."""

    def __init__(
        self,
        data_path: str | None = None,
        split: str = "test",
        limit: int | None = None,
        num_tasks: int = 500,
        seed: int = 0,
        sandbox: dict | None = None,
        python_tool: bool = True,
        system_prompt: str | None = None,
        answer_timeout: float = DEFAULT_TIMEOUT_S,
        max_turns: int = 6,
        max_context_tokens: int = 4096,
        rewards: Any = None,
        **kwargs: Any,
    ):
        check_env_kwargs(type(self), {**kwargs, "max_turns": max_turns, "max_context_tokens": max_context_tokens})
        if limit is not None and (not isinstance(limit, int) or limit <= 0):
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
        if not isinstance(num_tasks, int) or isinstance(num_tasks, bool) or num_tasks <= 0:
            raise ValueError(f"num_tasks must be a positive integer, got {num_tasks!r}")
        if isinstance(answer_timeout, bool) or not isinstance(answer_timeout, (int, float)) or not answer_timeout > 0:
            raise ValueError(f"answer_timeout must be a positive number of seconds, got {answer_timeout!r}")
        check_math_verify_available()  # fail here, naming the fix, rather than at the first answer
        self.answer_timeout = float(answer_timeout)
        self.data_path, self.split, self.seed = data_path, split, int(seed)
        self.tasks = load_math(data_path, split, limit) if data_path is not None else None
        self._num_tasks = len(self.tasks) if self.tasks is not None else num_tasks
        tools = []
        if python_tool:
            tool = PythonTool(sandbox)
            check_available(tool.python)  # fail here, naming the fix, rather than at the first call
            tools.append(tool)
        super().__init__(
            tools=tools,
            system_prompt=system_prompt or SYSTEM_PROMPT,
            max_turns=max_turns,
            max_context_tokens=max_context_tokens,
            rewards=rewards if rewards is not None else {"answer_weights": {"correct": 1.0}},
            **kwargs,
        )

    def num_tasks(self) -> int:
        return self._num_tasks

    def get_task(self, index: int) -> dict[str, Any]:
        if self.tasks is not None:
            return dict(self.tasks[index])
        return synthetic_task(self.seed, index)

    def check_task(self, task: Any) -> dict[str, Any]:
        """A task given as ``reset(options={"task": ...})``: the loader's check (:func:`validate_task`);
        keys it does not know (``program``, ...) are kept."""
        if not isinstance(task, dict):
            raise MathDataError(f"options['task'] must be a dict, got {type(task).__name__}")
        return {**task, **validate_task(task, "options['task']", "task")}

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        """``correct``, ``em`` and ``timeout`` (see the card)."""
        gold = str(task["answer"])
        ok, how = check_answer(answer, gold, self.answer_timeout)
        return {
            "correct": float(ok),
            "em": float(normalize(extract_answer(answer)) == normalize(gold)),
            "timeout": float(how == "timeout"),
        }

    def is_success(self, answer_scores: dict[str, float], task: dict[str, Any]) -> bool:
        """Success is a correct answer (symbolic equivalence), not string equality."""
        return answer_scores.get("correct", 0.0) >= 1.0

    def demonstration(self, task: dict[str, Any]) -> list[str]:
        """The oracle: the task's program through the python tool (synthetic tasks, when the env has
        the tool), then the boxed gold answer."""
        turns = []
        if task.get("program") and "python" in self.tools:
            turns.append(self.format.call_text("python", {"code": task["program"]}))
        return turns + [f"<answer>\\boxed{{{task['answer']}}}</answer>"]
