"""Answer scoring for question answering: exact match, token F1 and (opt-in) substring match,
matching each dataset's official evaluation script.

Normalization is the one of the official SQuAD v1.1 / HotpotQA / 2WikiMultihopQA / MuSiQue
scripts (they share it): lower case, drop ASCII punctuation, drop the articles a/an/the,
collapse white space. Every scorer takes the maximum over the gold answer and its aliases.

Which script each scorer matches (re-implemented from the scripts' logic, not copied):

- ``exact_match`` ("em"): all three official scripts. 1 when the normalized prediction equals
  a normalized gold.

**A gold that normalizes to nothing never matches**, in every scorer here. The official scripts
score an empty prediction 1 against it (HotpotQA dev row ``5a8b3d795542997f31a41cc1`` has the
answer ``"!!!"``: ``hotpot_evaluate_v1.py`` gives the answer ``"the"`` or an empty one EM 1), so
as a reward it pays full marks for saying nothing. Here such a gold scores 0 against every
prediction (EM, F1, MuSiQue's F1, substring); the row's other aliases still count. This departs
from the scripts on rows whose gold has no word at all (one in HotpotQA's 7,405 dev rows).
- ``f1_score`` ("f1"): HotpotQA's ``hotpot_evaluate_v1.py`` and 2WikiMultihopQA's
  ``2wikimultihop_evaluate_v1.1.py`` (the same function). If the normalized prediction or gold
  is ``yes``, ``no`` or ``noanswer`` and the two differ, F1 is 0; otherwise token F1 of the
  normalized answers, 0 when no token is shared (so two empty answers get F1 0, EM 1).
- ``squad_f1_score`` ("f1_squad"): MuSiQue's ``metrics/answer.py`` (SQuAD 2.0's
  ``compute_f1``). No yes/no rule: ``f1("no city", ["Norway", "no"])`` is 2/3 (vs gold
  ``no``: P 1/2, R 1). A prediction without a token scores 0 (the script's 1 for two empty
  answers is the contentless-gold case above).

Each dataset's pair is in ``OFFICIAL_SCORERS`` (``official_scorers(dataset)``); the QA envs log
``em`` and ``f1`` from it, so ``f1`` in a MuSiQue env is the MuSiQue F1.

`substring_match` is the reward in Agent-R1's public code; it is offered under its own name
only, because it is easy to hack: an answer that lists many candidates contains the gold more
often than a precise answer does. It is no official metric: an empty or blank prediction, or a
gold that normalizes to nothing, never matches.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Iterable

__all__ = [
    "ANSWER_SCORERS",
    "exact_match",
    "f1_score",
    "OFFICIAL_SCORERS",
    "get_answer_scorer",
    "normalize_answer",
    "official_scorers",
    "register_answer_scorer",
    "squad_f1_score",
    "substring_match",
]

AnswerScorer = Callable[[str, "str | Iterable[str]"], float]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA normalization: lower, strip punctuation, drop articles, collapse spaces."""
    text = text.lower()
    # Same order as the official script: punctuation goes before articles, so "the," -> "the" -> "".
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Iterable[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    out = list(golds)
    if not out:
        raise ValueError("at least one gold answer string is required")
    bad = [g for g in out if not isinstance(g, str)]
    if bad:
        raise TypeError(f"gold answers must be strings, got {bad[0]!r} ({type(bad[0]).__name__})")
    return out


def exact_match(pred: str, golds: str | Iterable[str]) -> float:
    """1.0 if the normalized prediction equals a normalized gold answer or alias, else 0.0. A
    gold that normalizes to nothing (``"!!!"``) matches nothing (the module docstring)."""
    p = normalize_answer(pred)
    return float(any(g and p == g for g in map(normalize_answer, _golds(golds))))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


_YES_NO = ("yes", "no", "noanswer")


def f1_score(pred: str, golds: str | Iterable[str]) -> float:
    """Token F1 as in HotpotQA's and 2WikiMultihopQA's official scripts, max over golds.

    A yes/no/noanswer prediction or gold gets credit only for the exact same word, so "yes no"
    cannot collect half credit on a yes/no question. No shared token (two empty answers
    included) gives 0.
    """
    p = normalize_answer(pred)
    best = 0.0
    for gold in _golds(golds):
        g = normalize_answer(gold)
        if (p in _YES_NO or g in _YES_NO) and p != g:
            continue
        best = max(best, _token_f1(p.split(), g.split()))
    return best


def squad_f1_score(pred: str, golds: str | Iterable[str]) -> float:
    """Token F1 as in MuSiQue's official metric (SQuAD 2.0 ``compute_f1``), max over golds.

    No yes/no rule. When the prediction or the gold has no token, F1 is 0.0 (a contentless gold
    matches nothing, the module docstring).
    """
    p = normalize_answer(pred).split()
    best = 0.0
    for gold in _golds(golds):
        g = normalize_answer(gold).split()
        if p and g:  # a side without a token scores 0 (a contentless gold matches nothing)
            best = max(best, _token_f1(p, g))
    return best


def substring_match(pred: str, golds: str | Iterable[str]) -> float:
    """1.0 if a normalized gold occurs as a whole-word span of the normalized prediction.

    Agent-R1/Search-R1 test a plain character substring; whole words are used here so that gold
    "1990" does not match "19901".

    HACKABLE: an answer stuffed with many candidates still matches. Use it only when you mean to
    (it is Agent-R1's public reward); the default reward is EM/F1. An empty or blank prediction,
    or a gold that normalizes to nothing, never matches.
    """
    p = normalize_answer(pred)
    if not p:
        return 0.0
    padded = f" {p} "
    for gold in _golds(golds):
        g = normalize_answer(gold)
        if g and f" {g} " in padded:
            return 1.0
    return 0.0


ANSWER_SCORERS: dict[str, AnswerScorer] = {}


def register_answer_scorer(name: str) -> Callable[[AnswerScorer], AnswerScorer]:
    """Register a scorer under `name`; a second, different function under one name raises."""

    def deco(fn: AnswerScorer) -> AnswerScorer:
        old = ANSWER_SCORERS.get(name)
        if old is not None and old is not fn:
            raise ValueError(f"answer scorer {name!r} is already registered to {old!r}")
        ANSWER_SCORERS[name] = fn
        return fn

    return deco


register_answer_scorer("em")(exact_match)
register_answer_scorer("f1")(f1_score)
register_answer_scorer("substring")(substring_match)
register_answer_scorer("f1_squad")(squad_f1_score)

OFFICIAL_SCORERS: dict[str, dict[str, AnswerScorer]] = {
    "hotpotqa": {"em": exact_match, "f1": f1_score},  # hotpot_evaluate_v1.py
    "2wikimultihopqa": {"em": exact_match, "f1": f1_score},  # 2wikimultihop_evaluate_v1.1.py
    "musique": {"em": exact_match, "f1": squad_f1_score},  # musique metrics/answer.py
}
"""Dataset name -> the ``em`` and ``f1`` of its official evaluation script."""


def official_scorers(dataset: str) -> dict[str, AnswerScorer]:
    """The ``{"em": ..., "f1": ...}`` of ``dataset``'s official script; unknown names raise."""
    try:
        return OFFICIAL_SCORERS[dataset]
    except KeyError:
        raise KeyError(
            f"no official scorers for dataset {dataset!r}; known: {', '.join(sorted(OFFICIAL_SCORERS))}"
        ) from None


def get_answer_scorer(name: str) -> AnswerScorer:
    """Look up a scorer by name; an unknown name raises a KeyError listing the valid ones."""
    try:
        return ANSWER_SCORERS[name]
    except KeyError:
        valid = ", ".join(sorted(ANSWER_SCORERS))
        raise KeyError(f"unknown answer scorer {name!r}; valid names: {valid}") from None
