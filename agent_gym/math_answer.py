"""Math answers: the last ``\\boxed{...}`` of a text, and whether an answer equals a gold one.

- :func:`last_boxed` returns the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or
  ``\\boxed 5``), braces nested to any depth; ``None`` when there is none or it is unclosed.
- :func:`normalize` rewrites a LaTeX answer into a canonical string (spaces, ``$``, ``\\left``,
  ``\\text{}``, ``^\\circ``, ``\\%``, ``\\dfrac``, a leading ``x =``, ...): the env's logged ``em``.
- :func:`check_answer` / :func:`answers_match` decide equivalence with Hugging Face's
  ``math-verify`` (https://github.com/huggingface/Math-Verify, built on ``latex2sympy2-extended``),
  after a small pre-processing step, under a hard time limit.

The verdict, in order (:func:`judge`):

1. ``empty``: the answer (its last ``\\boxed{}``, else the whole answer) is empty: wrong.
2. ``string``: the two strings are equal once whitespace is removed: right.
3. ``text``: the gold is a word or phrase (letters and spaces only, two letters or more, after
   ``\\text{}``-like wrappers and ``$`` are removed, e.g. ``Monday``, ``\\text{odd}``): the answer
   is right when it is the same words, case-insensitively. math-verify would read a word as a
   product of one-letter symbols, which commute (``dynamo`` = ``Monday``).
4. ``math_verify``: both sides are parsed by ``math_verify.parse`` (as ``\\boxed{...}``) and compared
   by ``math_verify.verify(gold, answer)`` (strict; a relation may be compared with an interval:
   ``x<3`` is ``(-\\infty, 3)``). Before parsing, :func:`prepare` rewrites each side so that numbers
   are exact, because math-verify rounds decimals to 6 places (it accepts ``0.333333`` for
   ``\\frac13``): a decimal is the fraction it writes (``0.75`` -> ``3/4``), a repeating decimal
   (``0.\\overline{3}``, ``0.1\\bar{6}``) the fraction it denotes, a mixed number (``2\\frac{3}{4}``)
   its improper fraction, ``1.5e3`` is ``1.5\\times10^{3}``; ``1,000`` (a whole answer) is 1000;
   ``\\%`` is dropped like a unit (``50\\%`` is ``50``), as is a full stop ending the answer;
   ``\\varnothing`` is ``\\emptyset``. When exactly one side is in degrees and the other uses
   ``\\pi``, the degrees are converted to radians (``30^\\circ`` is ``\\frac{\\pi}{6}``).
   math-verify itself compares integers exactly (``999999`` is not ``1000000``), never takes a
   finite number for ``\\infty``, tells open from closed interval ends, ignores a set's order, and
   drops units in ``\\text{}``, ``\\$`` and ``^\\circ``. ``unparsed`` when it cannot parse the gold
   (or raised): wrong.
5. ``timeout``: the whole check ran past its limit (``timeout`` seconds, :data:`DEFAULT_TIMEOUT_S`
   by default): wrong. sympy can spend minutes expanding ``(x+1)^{10000}`` or evaluating
   ``9^{9^{9^9}}``, in C code that no signal interrupts, so every check that gets past step 2
   runs in a worker process (a small persistent pool of :class:`_Worker`) that is killed when the
   limit passes. This holds in any thread (env steps may run on a thread pool, where
   math-verify's own ``signal.alarm`` timeouts cannot work). A spare worker is started in the
   background whenever the last idle one is taken, so the check after a timeout does not wait
   for a start (a start, about 1-2 s, is never counted in a check's limit). ``crashed``: the
   worker died during the check twice (killed from outside, out of memory): wrong. Each worker
   has an address-space limit (2 GiB) and a CPU-time limit per check, exits when its parent's
   pipe closes, and is killed at exit, so a killed trainer leaves no runaway check behind.

Measured on a hand-labelled battery of 404 (answer, gold) pairs (``tests/fixtures/math_battery.jsonl``,
``benchmarks/verdicts/math_verifier.py``; figures in docs/envs/math.md): the old sympy checker accepted 41 of
190 wrong answers and rejected 72 of 214 right ones, math-verify alone 5 and 19, this checker 0 and 1
(``ab`` against gold ``ba``: a run of letters is read as a word).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import re
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from fractions import Fraction

DEFAULT_TIMEOUT_S = 5.0
"""The default hard limit, in seconds, on one :func:`check_answer` (parsing and comparing both sides)."""
WORKER_START_TIMEOUT_S = 120.0
"""How long a new worker may take to import sympy and math-verify (not counted in a check's limit)."""
WORKER_CPU_GRACE_S = 5
"""A worker may use the check's limit plus this many CPU seconds per check (RLIMIT_CPU, SIGXCPU after):
a last resort that ends a runaway check whose parent died before it could kill the worker."""
WORKER_MEMORY_LIMIT = 2 << 30
"""A worker's address-space limit in bytes (RLIMIT_AS): an expansion that outgrows it fails (a wrong answer)."""
MAX_IDLE_WORKERS = 4
"""Idle workers kept for reuse; more are started when more threads check at once."""
STATUSES = ("string", "text", "math_verify", "no_match", "unparsed", "empty", "timeout", "crashed")
"""The ``how`` of :func:`check_answer`: the first three are matches, the rest are not."""

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), or ``None``."""
    if not isinstance(text, str):
        return None
    best = -1
    for cmd in _BOX_COMMANDS:
        best = max(best, text.rfind(cmd))
    if best < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, best))
    i = best + len(cmd)
    if i < len(text) and text[i] == " ":  # "\boxed 5": up to the next space or "$"
        m = re.match(r" +([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None  # unclosed


def extract_answer(text: str) -> str:
    """What an agent's answer says: the last ``\\boxed{}`` content when there is one, else the text."""
    boxed = last_boxed(text)
    return (boxed if boxed is not None else text).strip()


def _unwrap(s: str, command: str) -> str:
    """``\\command{X}`` -> ``X`` everywhere (nested braces kept)."""
    out, i = [], 0
    while True:
        j = s.find(command + "{", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:j])
        depth, k = 0, j + len(command)
        while k < len(s):
            depth += {"{": 1, "}": -1}.get(s[k], 0)
            if depth == 0:
                break
            k += 1
        out.append(s[j + len(command) + 1 : k])
        i = k + 1


_TEXT_WRAPPERS = ("\\text", "\\textbf", "\\textit", "\\mathrm", "\\mbox", "\\mathbf", "\\boxed")


def normalize(answer: str) -> str:
    """A canonical string for a LaTeX answer (the env's ``em``; not used for ``correct``)."""
    s = str(answer).strip()
    for cmd in _TEXT_WRAPPERS:
        s = _unwrap(s, cmd)
    s = s.replace("\\left", "").replace("\\right", "")
    for sp in ("\\!", "\\,", "\\;", "\\:", "\\quad", "\\qquad", "~", "$"):
        s = s.replace(sp, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\degree", "")
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\\(le|ge)(q|qq)?(?![a-zA-Z])", r"\\\1q", s)  # \le, \leqq -> \leq
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^[a-zA-Z]=", "", s)  # "x=5" -> "5"
    s = s.rstrip(".")
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)  # ".5" -> "0.5"
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # "\frac12" -> "\frac{1}{2}"
    s = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", s) if re.fullmatch(r"[\d,]+(\.\d+)?", s) else s  # 1,000
    return s


# -- the verdict (runs in a worker process) -----------------------------------------------------


def as_text(answer: str) -> str | None:
    """A word or phrase answer (``\\text{Monday}``, ``no solution``) lower-cased with single spaces;
    ``None`` for anything else (digits, operators, LaTeX commands, a single letter)."""
    s = answer
    for cmd in _TEXT_WRAPPERS:
        s = _unwrap(s, cmd)
    s = s.replace("$", "").strip().rstrip(".").strip()
    if re.fullmatch(r"[A-Za-z]+(?: +[A-Za-z]+)*", s) and sum(c.isalpha() for c in s) >= 2:
        return " ".join(s.lower().split())
    return None


def _exact(value: Fraction) -> str:
    """An exact number as LaTeX: an integer, or a parenthesised ``\\frac`` (math-verify reads a bare
    ``{...}`` group as a set)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"(\\frac{{{value.numerator}}}{{{value.denominator}}})"


def _decimal(whole: str, frac: str, repeat: str = "") -> str:
    """``whole.frac`` followed by ``repeat`` repeated forever, as an exact number."""
    value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    if repeat:
        value += Fraction(int(repeat), (10 ** len(repeat) - 1) * 10 ** len(frac))
    return _exact(value)


_REPEATING = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\(?:overline|bar)\{?(\d+)\}?")
_SCIENTIFIC = re.compile(r"(?<![\w\\.])(\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")
_DECIMAL = re.compile(r"(?<![\d.])(\d*)\.(\d+)(?![\d.])")
_MIXED = re.compile(r"(?<![\w.^_{}\\])(\d+)\s*\\[dt]?frac(?:(\d)(\d)|\{(\d+)\}\{(\d+)\})")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|\\degree")
_THOUSANDS = re.compile(r"[\\$\s]*\d{1,3}(,\d{3})+(\.\d+)?")


def _mixed(m: re.Match) -> str:
    whole, num, den = int(m.group(1)), int(m.group(2) or m.group(4)), int(m.group(3) or m.group(5))
    return _exact(whole + Fraction(num, den)) if den else m.group(0)


def prepare(answer: str) -> str:
    """The pre-processing step before math-verify (see the module docstring): numbers exact."""
    s = re.sub(r"(?<=[\w})\]])\s*\.\s*$", "", answer.strip())  # a full stop ending the answer
    s = s.replace("\\varnothing", "\\emptyset").replace("\\%", "").replace("%", "")
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s) if _THOUSANDS.fullmatch(s) else s
    s = _REPEATING.sub(lambda m: _decimal(m.group(1), m.group(2), m.group(3)), s)
    s = _SCIENTIFIC.sub(lambda m: f"{m.group(1)}\\times10^{{{m.group(2)}}}", s)
    s = _DECIMAL.sub(lambda m: _decimal(m.group(1), m.group(2)), s)
    return _MIXED.sub(_mixed, s)


def _degrees_to_radians(answer: str) -> str:
    """``30^\\circ`` -> ``(30)\\cdot\\frac{\\pi}{180}``: used when the other side is in radians."""
    return re.sub(r"([\d.]+|\([^()]*\))\s*(?:\^\s*\{?\\circ\}?|\\degree)", r"(\1)\\cdot\\frac{\\pi}{180}", answer)


def _mv_parse(answer: str) -> list:
    from math_verify import parse  # optional: math-verify (extra code), imported by the worker only

    return parse("\\boxed{" + answer + "}", parsing_timeout=None)  # the worker's deadline bounds it


def _quick_verdict(p: str, g: str) -> tuple[bool, str] | None:
    """Steps 1 and 2 of the verdict (no sympy): ``empty`` and ``string``; ``None`` to go on."""
    if not p:
        return False, "empty"
    if re.sub(r"\s+", "", p) == re.sub(r"\s+", "", g):
        return True, "string"
    return None


def judge(predicted: str, gold: str) -> tuple[bool, str]:
    """The verdict without a time limit (the worker's function; call :func:`check_answer`)."""
    p, g = extract_answer(predicted), gold.strip()
    quick = _quick_verdict(p, g)
    if quick is not None:
        return quick
    gold_text = as_text(g)
    if gold_text is not None:
        same = as_text(p) == gold_text
        return same, ("text" if same else "no_match")
    in_degrees = bool(_DEGREES.search(g)), bool(_DEGREES.search(p))
    if in_degrees == (True, False) and "\\pi" in p:
        g = _degrees_to_radians(g)
    elif in_degrees == (False, True) and "\\pi" in g:
        p = _degrees_to_radians(p)
    from math_verify import verify  # optional: math-verify (extra code), imported by the worker only

    gold_parsed = _mv_parse(prepare(g))
    if not gold_parsed:
        return False, "unparsed"
    ok = verify(gold_parsed, _mv_parse(prepare(p)), strict=True, allow_set_relation_comp=True, timeout_seconds=None)
    return bool(ok), ("math_verify" if ok else "no_match")


_WARM_UP = (
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("(x+1)^2", "x^2+2x+1"),
    ("[1,2)", "(1,2]"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("y=2x+1", "2x+1"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\3\\end{pmatrix}"),
)


def _serve() -> None:
    """A worker's loop: one JSON request a line on stdin (``[predicted, gold, timeout]``), one reply a
    line on stdout (``[ok, how]``; first ``{"ready": true}``, or ``{"error": ...}`` when it cannot start)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it ends the workers
    try:
        _serve_loop()
    except BrokenPipeError:  # the parent is gone
        pass


def _serve_loop() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the replies
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    try:  # import and warm up sympy, latex2sympy and math-verify (a cold first simplify takes ~1 s)
        for predicted, gold in _WARM_UP:
            judge(predicted, gold)
    except ImportError as e:
        out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        return
    out.write(json.dumps({"ready": True}) + "\n")
    _, hard_as = resource.getrlimit(resource.RLIMIT_AS)
    if hard_as == resource.RLIM_INFINITY or WORKER_MEMORY_LIMIT < hard_as:
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT, hard_as))  # a huge expansion: MemoryError
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    for line in sys.stdin:  # an idle worker whose parent is gone sees the end of stdin and exits
        predicted, gold, timeout = json.loads(line)
        usage = resource.getrusage(resource.RUSAGE_SELF)  # a busy one ends by its CPU limit (SIGXCPU)
        soft = int(usage.ru_utime + usage.ru_stime + timeout) + WORKER_CPU_GRACE_S
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        try:
            ok, how = judge(predicted, gold)
        except Exception:  # noqa: BLE001  a parser bug is a wrong answer, not a crashed step
            ok, how = False, "unparsed"
        out.write(json.dumps([ok, how]) + "\n")


# -- the worker pool (parent side) -----------------------------------------------------------------


_WORKER_CMD = (
    "import importlib.util as u, sys; s = u.spec_from_file_location('_agent_gym_math_worker', sys.argv[1]); "
    "m = u.module_from_spec(s); s.loader.exec_module(m); m._serve()"
)


class _WorkerDied(Exception):
    """A worker process exited (killed from outside, out of memory, a crash)."""


class _Worker:
    """One worker process: the module file run on its own (no ``agent_gym`` package import)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CMD, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self._buf = b""
        try:
            reply = self.read_line(time.monotonic() + WORKER_START_TIMEOUT_S)
        except _WorkerDied as e:
            reply, died = None, str(e)
        else:
            died = f"it did not start within {WORKER_START_TIMEOUT_S:.0f} s"
        if reply is None or "error" in json.loads(reply):
            self.kill()
            why = json.loads(reply)["error"] if reply else died
            raise RuntimeError(
                f"the math answer checker's worker process failed ({why}); it needs math-verify: "
                f"pip install math-verify (the 'code' extra: pip install -e '.[code]')"
            )

    def read_line(self, deadline: float) -> str | None:
        """One line from the worker, or ``None`` when the deadline passes; ``_WorkerDied`` if it exits."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _WorkerDied(f"the worker exited with code {self.proc.wait()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def check(self, predicted: str, gold: str, timeout: float) -> tuple[bool, str] | None:
        """The worker's verdict, or ``None`` if it ran past ``timeout`` seconds; ``_WorkerDied``."""
        deadline = time.monotonic() + timeout
        try:
            self.proc.stdin.write((json.dumps([predicted, gold, timeout]) + "\n").encode())
        except OSError as e:
            raise _WorkerDied(f"the worker's pipe is closed ({e})") from None
        reply = self.read_line(deadline)
        if reply is None:
            return None
        ok, how = json.loads(reply)
        return bool(ok), str(how)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


_idle: list[_Worker] = []
_idle_lock = threading.Condition()  # guards _idle and _starting; notified when a background start ends
_starting = 0  # workers being started in the background
_owner_pid = os.getpid()


def _forget_after_fork() -> None:
    """A forked child must not share its parent's workers: it closes its copies of their pipes (so
    that they still see their parent's exit) and starts its own."""
    global _idle, _idle_lock, _owner_pid, _starting
    for w in _idle:
        for f in (w.proc.stdin, w.proc.stdout):
            f.close()
    _idle, _idle_lock, _owner_pid, _starting = [], threading.Condition(), os.getpid(), 0


def _take_worker() -> _Worker:
    """A live idle worker; else the one being started in the background, if any; else a new one.
    When it takes the last one, a spare is started in the background, so that the check after a
    timeout (which kills its worker) finds one ready rather than waiting for a start."""
    while True:
        with _idle_lock:
            while not _idle and _starting:
                _idle_lock.wait()
            worker = _idle.pop() if _idle else None
            need_spare = not _idle and not _starting
        if need_spare:
            _start_idle_worker()
        if worker is None:
            return _Worker()
        if worker.proc.poll() is None:
            return worker
        worker.kill()  # died while idle (killed from outside): reap it and take the next


def _give_back(worker: _Worker) -> None:
    with _idle_lock:
        keep = len(_idle) < MAX_IDLE_WORKERS and _owner_pid == os.getpid()
        if keep:
            _idle.append(worker)
            _idle_lock.notify()
    if not keep:
        worker.kill()


os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def shutdown_workers() -> None:
    """End the idle workers (at exit, or to free their memory)."""
    with _idle_lock:
        workers, _idle[:] = list(_idle), []
    for w in workers:
        if _owner_pid == os.getpid():
            w.kill()


def _start_idle_worker() -> None:
    """Start a worker for the pool in the background (after one was killed)."""
    global _starting

    def start() -> None:
        global _starting
        try:
            _give_back(_Worker())
        except Exception:  # noqa: BLE001  the next check starts one itself and reports the error
            pass
        finally:
            with _idle_lock:
                _starting -= 1
                _idle_lock.notify_all()

    with _idle_lock:
        _starting += 1
    threading.Thread(target=start, daemon=True, name="math-answer-worker-start").start()


def check_answer(predicted: str, gold: str, timeout: float | None = None) -> tuple[bool, str]:
    """(equivalent?, how it was decided: one of :data:`STATUSES`) within
    ``timeout`` seconds (:data:`DEFAULT_TIMEOUT_S` when ``None``); see the module docstring."""
    if not isinstance(predicted, str) or not isinstance(gold, str):
        raise TypeError(f"answers must be strings, got {type(predicted).__name__} and {type(gold).__name__}")
    timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    quick = _quick_verdict(extract_answer(predicted), gold.strip())
    if quick is not None:
        return quick  # the common exact case, without a round trip to a worker
    spent = 0.0  # seconds of the limit used by checks (a worker's start-up is not counted)
    for attempt in (1, 2):  # a worker found dead is replaced once; dying twice on one answer is its verdict
        worker = _take_worker() if attempt == 1 else _Worker()
        t0 = time.monotonic()
        try:
            verdict = worker.check(predicted, gold, max(float(timeout) - spent, 1e-3))
            break
        except _WorkerDied:
            spent += time.monotonic() - t0
            worker.kill()
            if attempt == 2:
                return False, "crashed"
        except BaseException:  # KeyboardInterrupt while waiting: the check is abandoned, so is its worker
            worker.kill()
            raise
    if verdict is None:
        worker.kill()
        return False, "timeout"
    _give_back(worker)
    return verdict


def answers_match(predicted: str, gold: str, timeout: float | None = None) -> bool:
    """Whether ``predicted`` (its last ``\\boxed{}``, if any) is equivalent to ``gold``."""
    return check_answer(predicted, gold, timeout)[0]


def check_available() -> None:
    """``ImportError`` naming the fix when math-verify is not installed (checked when an env is made)."""
    if importlib.util.find_spec("math_verify") is None:
        raise ImportError(
            "AgentR1/Math-v0 checks answers with math-verify, which is not installed: "
            "pip install math-verify (or the project's 'code' extra: pip install -e '.[code]')"
        )


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "STATUSES",
    "answers_match",
    "as_text",
    "check_answer",
    "check_available",
    "extract_answer",
    "judge",
    "last_boxed",
    "normalize",
    "prepare",
    "shutdown_workers",
]
