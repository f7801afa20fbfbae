"""Answer scoring: hand-worked expected values, and the anti-hacking cases."""

import pytest

from agent_gym.scoring import (
    ANSWER_SCORERS,
    OFFICIAL_SCORERS,
    exact_match,
    f1_score,
    get_answer_scorer,
    normalize_answer,
    official_scorers,
    register_answer_scorer,
    squad_f1_score,
    substring_match,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),  # lower, punctuation, article
        ("  a   cat,  an apple ", "cat apple"),  # articles and white space
        ("Theatre of the Absurd", "theatre of absurd"),  # "the" inside "Theatre" stays
        ("U.S.A.", "usa"),
        ("the", ""),
        ("Beyoncé's", "beyoncés"),  # non-ASCII letters kept, apostrophe dropped
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_takes_max_over_aliases():
    assert exact_match("the Big Apple", ["New York City", "Big Apple"]) == 1.0
    assert exact_match("New York", ["New York City", "Big Apple"]) == 0.0
    assert exact_match("Paris.", "paris") == 1.0


def test_f1_hand_worked():
    # pred "new york city hall" (4 tokens) vs gold "new york city" (3): 3 common.
    # P = 3/4, R = 3/3, F1 = 2 * 0.75 * 1 / 1.75 = 6/7.
    assert f1_score("New York City Hall", "New York City") == pytest.approx(6 / 7)
    # Max over golds: vs "NYC" -> 0, vs "city" -> P = 1/4, R = 1, F1 = 0.4; max = 6/7.
    assert f1_score("New York City Hall", ["NYC", "city", "New York City"]) == pytest.approx(6 / 7)
    # Repeated tokens count with multiplicity: pred "a b b" -> tokens [b, b] after dropping "a";
    # gold "b c" -> common = min(2,1) = 1; P = 1/2, R = 1/2, F1 = 1/2.
    assert f1_score("a b b", "b c") == pytest.approx(0.5)


def test_f1_yes_no_only_exact():
    assert f1_score("yes", "yes") == 1.0
    assert f1_score("yes no", "yes") == 0.0  # no partial credit on a yes/no gold
    assert f1_score("no", ["yes"]) == 0.0


@pytest.mark.parametrize("name", sorted(ANSWER_SCORERS))
@pytest.mark.parametrize("pred", ["", "   ", "\n\t", "the", "a an the", "!!!"])
def test_empty_prediction_scores_zero_against_real_golds(name, pred):
    scorer = get_answer_scorer(name)
    assert scorer(pred, ["Paris", "London"]) == 0.0
    assert scorer(pred, "Paris") == 0.0


@pytest.mark.parametrize("name", sorted(ANSWER_SCORERS))
@pytest.mark.parametrize("pred", ["", "the", "!!!", "a", "Paris"])
def test_a_gold_that_normalizes_to_nothing_matches_nothing(name, pred):
    """HotpotQA dev row 5a8b3d795542997f31a41cc1 has the gold "!!!": the official scripts give an
    empty answer (or "the") EM 1 against it; as a reward that pays for saying nothing."""
    scorer = get_answer_scorer(name)
    assert scorer(pred, ["!!!"]) == 0.0 and scorer(pred, "  the ") == 0.0
    assert scorer("Paris", ["!!!", "Paris"]) == 1.0  # the row's real aliases still count


# Figures from the official scripts' logic (hotpot_evaluate_v1.py, 2wikimultihop_evaluate_v1.1.py,
# MuSiQue metrics/answer.py), except for a gold that normalizes to nothing (above). The first rows
# are the cases that were found broken (before 2026-11-22).
@pytest.mark.parametrize(
    ("pred", "golds", "em", "hotpot_f1", "musique_f1"),
    [
        ("!!!", ["!!!"], 0.0, 0.0, 0.0),  # HotpotQA dev row 5a8b3d795542997f31a41cc1: gold "!!!" (scripts: EM 1)
        ("", ["!!!"], 0.0, 0.0, 0.0),  # empty prediction vs a gold that normalizes to "" (scripts: EM 1)
        ("the", ["!!!"], 0.0, 0.0, 0.0),
        ("Paris", ["!!!"], 0.0, 0.0, 0.0),
        ("", ["Paris"], 0.0, 0.0, 0.0),
        ("no city", ["Norway", "no"], 0.0, 0.0, 2 / 3),  # MuSiQue has no yes/no rule
        ("yes no", ["yes"], 0.0, 0.0, 2 / 3),
        ("no", ["no"], 1.0, 1.0, 1.0),
        ("noanswer here", ["noanswer"], 0.0, 0.0, 2 / 3),
        ("New York City Hall", ["New York City"], 0.0, 6 / 7, 6 / 7),
    ],
)
def test_official_scripts(pred, golds, em, hotpot_f1, musique_f1):
    for ds in ("hotpotqa", "2wikimultihopqa"):
        sc = official_scorers(ds)
        assert sc["em"](pred, golds) == em
        assert sc["f1"](pred, golds) == pytest.approx(hotpot_f1)
    sc = official_scorers("musique")
    assert sc["em"](pred, golds) == em
    assert sc["f1"](pred, golds) == pytest.approx(musique_f1)
    assert squad_f1_score(pred, golds) == pytest.approx(musique_f1)


def test_official_scorers_registry():
    assert set(OFFICIAL_SCORERS) == {"hotpotqa", "2wikimultihopqa", "musique"}
    assert official_scorers("musique")["f1"] is squad_f1_score
    assert official_scorers("hotpotqa")["f1"] is f1_score
    with pytest.raises(KeyError, match="known: 2wikimultihopqa, hotpotqa, musique"):
        official_scorers("squad")


def test_non_string_gold_is_an_error():
    with pytest.raises(TypeError, match="gold answers must be strings, got None"):
        exact_match("None", ["Paris", None])
    with pytest.raises(TypeError, match="got \\['Paris'\\]"):
        f1_score("Paris", [["Paris"]])


def test_stuffed_answer_gets_no_em_but_substring_is_hackable():
    stuffed = "Paris London Berlin Rome Madrid Quillhaven Tokyo yes no 1990"
    assert exact_match(stuffed, "Quillhaven") == 0.0
    # F1 is diluted: 10 tokens, 1 common; P = 1/10, R = 1, F1 = 2 * (1/10) / (11/10) = 2/11.
    assert f1_score(stuffed, "Quillhaven") == pytest.approx(2 / 11)
    # The documented hack: substring match rewards the catch-all answer.
    assert substring_match(stuffed, "Quillhaven") == 1.0


def test_substring_match_whole_words():
    assert substring_match("born in the city of Paris, France", "Paris") == 1.0
    assert substring_match("in 19901", "1990") == 0.0
    assert substring_match("Parisian", "Paris") == 0.0
    assert substring_match("anything", "the") == 0.0  # a gold that normalizes to "" never matches


def test_registry_names_and_errors():
    assert set(ANSWER_SCORERS) == {"em", "f1", "f1_squad", "substring"}
    assert get_answer_scorer("em") is exact_match
    with pytest.raises(KeyError, match="valid names: em, f1, f1_squad, substring"):
        get_answer_scorer("rouge")
    register_answer_scorer("em")(exact_match)  # same entry again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_answer_scorer("em")(f1_score)


def test_no_gold_is_an_error():
    with pytest.raises(ValueError):
        exact_match("x", [])
