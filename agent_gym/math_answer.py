"""Math answers: the last ``\\boxed{...}`` of a text, and whether two answers are equivalent.

- :func:`last_boxed` returns the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or
  ``\\boxed 5``), braces nested to any depth; ``None`` when there is none or it is unclosed.
- :func:`normalize` rewrites a LaTeX answer into a canonical string: spaces, ``$``, ``\\left``/
  ``\\right``, spacing commands, ``\\text{}``/``\\mbox{}`` wrappers, ``^\\circ``, ``\\%``,
  ``\\dfrac``/``\\tfrac``, a leading ``x =``, a trailing period, and ``.5`` -> ``0.5``.
- :func:`answers_match` says whether a predicted answer equals a gold one: equal normalized
  strings; else both parsed by sympy (from a LaTeX subset: ``\\frac``, ``\\sqrt``, ``\\sqrt[n]``,
  ``\\pi``, ``\\cdot``, ``\\times``, ``^``, implicit multiplication) and equal symbolically
  (``simplify(a - b) == 0``) or numerically (relative tolerance 1e-6); tuples and lists
  (``(1, 2)``, ``1, 2``) element by element, in order. When sympy cannot parse either side, or the
  expression is too large to evaluate safely (an exponent above 10,000, an integer of more than
  100 digits, a factorial above 1,000, more than 300 characters), the answer is judged by the
  normalized strings alone: a failure to parse is never an error, and never a match by itself.

:func:`check_answer` returns the verdict with the method that decided it (``string``,
``symbolic``, ``numeric``, ``no_match``, ``unparsed``), for logs and tests.
"""

from __future__ import annotations

import re
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")
MAX_SYMPY_CHARS = 300
MAX_EXPONENT = 10_000
MAX_INT_DIGITS = 100
MAX_FACTORIAL = 1_000
MAX_RESULT_DIGITS = 10_000
_FUNCTIONS = frozenset({"sqrt", "pi", "oo", "sin", "cos", "tan", "log", "ln", "exp"})


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
                return text[i + 1:j]
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
        out.append(s[j + len(command) + 1:k])
        i = k + 1


def normalize(answer: str) -> str:
    """A canonical string for a LaTeX answer (see the module docstring)."""
    s = str(answer).strip()
    for cmd in ("\\text", "\\textbf", "\\mathrm", "\\mbox", "\\mathbf", "\\boxed"):
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


# -- sympy -----------------------------------------------------------------------------------


def _replace_command(s: str, command: str, nargs: int, fmt: str) -> str:
    """Rewrite ``\\command{a}{b}`` with ``fmt.format(a, b)``, innermost arguments first."""
    while True:
        j = s.find(command + "{")
        if j < 0:
            return s
        args, k = [], j + len(command)
        for _ in range(nargs):
            if k >= len(s) or s[k] != "{":
                raise ValueError(f"{command} without {nargs} braced arguments")
            depth, start = 0, k
            while k < len(s):
                depth += {"{": 1, "}": -1}.get(s[k], 0)
                if depth == 0:
                    break
                k += 1
            if depth:
                raise ValueError("unbalanced braces")
            args.append(_replace_command(s[start + 1:k], command, nargs, fmt))
            k += 1
        s = s[:j] + fmt.format(*args) + s[k:]


def latex_to_sympy_text(s: str) -> str:
    """A normalized LaTeX answer as text for sympy's ``parse_expr`` (``ValueError`` if unsupported)."""
    s = re.sub(r"\\sqrt\[([^\]]+)\]\{", r"\\root{\1}{", s)
    s = _replace_command(s, "\\frac", 2, "(({0})/({1}))")
    s = _replace_command(s, "\\root", 2, "(({1})**(1/({0})))")
    s = _replace_command(s, "\\sqrt", 1, "sqrt({0})")
    s = re.sub(r"\\sqrt(\d+|[a-zA-Z])", r"sqrt(\1)", s)
    for a, b in (("\\cdot", "*"), ("\\times", "*"), ("\\div", "/"), ("\\pi", "pi"), ("^", "**"),
                 ("{", "("), ("}", ")"), ("\\infty", "oo")):
        s = s.replace(a, b)
    # parse_expr evaluates Python: only numbers, operators, parentheses, single-letter symbols
    # and a few function names may reach it, never an attribute, a string or a builtin.
    bad = re.search(r"[^0-9A-Za-z+\-*/().,! ]", s)
    if bad:
        raise ValueError(f"unsupported character {bad.group()!r} in {s!r}")
    if re.search(r"\d\.?[eE][+-]?\d", s):  # Python float syntax: 1e9999999 takes sympy minutes
        raise ValueError(f"scientific notation in {s!r}")
    for word in re.findall(r"[A-Za-z]{2,}", s):
        if word not in _FUNCTIONS:
            raise ValueError(f"unsupported name {word!r} in {s!r}")
    return s


def _check_size(expr: Any) -> None:
    """Refuse an unevaluated expression whose evaluation could take long: each exponent and factorial
    argument is estimated in floating point (``evalf``, cheap even for ``10**10**10``) first."""
    import math

    import sympy

    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Integer) and len(str(abs(int(node)))) > MAX_INT_DIGITS:
            raise ValueError("integer too large")
        if isinstance(node, sympy.Pow) and node.exp.is_number:
            e = abs(complex(sympy.N(node.exp, 15)))
            if not e <= MAX_EXPONENT:
                raise ValueError("exponent too large")
            if node.base.is_number:
                b = abs(complex(sympy.N(node.base, 15)))
                if b > 1 and e * math.log10(b) > MAX_RESULT_DIGITS:
                    raise ValueError("power too large")
        if isinstance(node, sympy.factorial) and node.args[0].is_number:
            if not abs(complex(sympy.N(node.args[0], 15))) <= MAX_FACTORIAL:
                raise ValueError("factorial too large")


def to_sympy(answer: str) -> Any:
    """The normalized answer as a sympy expression (unevaluated parse, size-checked, then
    evaluated); ``ValueError`` when it cannot be parsed or is too large to evaluate safely."""
    import sympy
    from sympy.parsing.sympy_parser import (convert_xor, implicit_multiplication_application, parse_expr,
                                            standard_transformations)

    s = normalize(answer)
    if not s or len(s) > MAX_SYMPY_CHARS:
        raise ValueError("empty or too long")
    text = latex_to_sympy_text(s)
    try:
        expr = parse_expr(text, transformations=standard_transformations + (implicit_multiplication_application,
                                                                            convert_xor), evaluate=False)
    except Exception as e:  # sympy raises many kinds (SyntaxError, TokenError, TypeError, ...)
        raise ValueError(f"sympy could not parse {text!r}: {type(e).__name__}") from None
    if not isinstance(expr, sympy.Basic):
        raise ValueError(f"not an expression: {type(expr).__name__}")
    _check_size(expr)
    return sympy.sympify(expr)  # evaluate, now that it is known to be small


def _split_top_level(s: str) -> list[str]:
    """``(1,2)`` / ``[1,2]`` / ``1,2`` -> ``["1", "2"]``; anything else -> ``[s]``."""
    body = s[1:-1] if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" else s
    parts, depth, cur = [], 0, []
    for ch in body:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return [s]
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts if len(parts) > 1 else [s]


def _sympy_equal(a: str, b: str) -> str | None:
    """``"symbolic"``/``"numeric"`` when equal, ``"no_match"`` when both parse and differ, ``None`` when
    either side cannot be parsed."""
    import sympy

    try:
        ea, eb = to_sympy(a), to_sympy(b)
    except (ValueError, RecursionError, OverflowError, MemoryError):
        return None
    try:
        if sympy.simplify(ea - eb) == 0:
            return "symbolic"
        na, nb = complex(sympy.N(ea)), complex(sympy.N(eb))
        if abs(na - nb) <= 1e-6 * max(1.0, abs(nb)):
            return "numeric"
    except (TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError, RecursionError):
        pass
    return "no_match"


def check_answer(predicted: str, gold: str) -> tuple[bool, str]:
    """(equivalent?, the method that decided): see the module docstring."""
    if not isinstance(predicted, str) or not isinstance(gold, str):
        raise TypeError("answers must be strings")
    p, g = normalize(extract_answer(predicted)), normalize(gold)
    if p == g:
        return True, "string"
    if not p:
        return False, "no_match"
    ps, gs = _split_top_level(p), _split_top_level(g)
    if len(ps) != len(gs):
        return False, "no_match"
    if len(gs) > 1:
        verdicts = [check_answer(x, y) for x, y in zip(ps, gs)]
        ok = all(v for v, _ in verdicts)
        return ok, ("symbolic" if ok else "no_match")
    how = _sympy_equal(p, g)
    if how is None:
        return False, "unparsed"
    return how != "no_match", how


def answers_match(predicted: str, gold: str) -> bool:
    """Whether ``predicted`` (its last ``\\boxed{}``, if any) is equivalent to ``gold``."""
    return check_answer(predicted, gold)[0]


__all__ = ["answers_match", "check_answer", "extract_answer", "last_boxed", "normalize", "to_sympy"]
