"""The built-in tokenizer's training corpus is generic: common English words, common
letter pairs, numbers, punctuation and the tool-call protocol's JSON keys, and no env's words (it
used to hold FactChain's relations, syllables, a sample call and the QA envs' tool arguments)."""

from __future__ import annotations

import re

from agent_gym.tokenizer import _COMMON_BIGRAMS, _COMMON_WORDS, _training_corpus

PROTOCOL = {"name", "arguments"}  # the keys of a hermes tool call: the format's, not an env's


def test_the_corpus_is_built_from_generic_pieces_only():
    common = {w.lower() for w in _COMMON_WORDS} | PROTOCOL
    pairs = re.compile("(?:" + "|".join(map(re.escape, _COMMON_BIGRAMS)) + ")+")
    words = set(re.findall(r"[A-Za-z]+", " ".join(set(_training_corpus()))))
    other = sorted(w for w in words if w.lower() not in common and not pairs.fullmatch(w.lower()))
    assert not other, other[:20]


def test_no_env_word_is_among_the_corpus_words():
    import envs.factchain as factchain

    env_words = {
        *factchain.RELATIONS,  # FactChain's relations
        *(s for s in factchain._SYLLABLES if len(s) > 2),  # its name syllables (the 2-letter ones are letter pairs)
        "lookup",
        "search",
        "python",
        "send",
        "receive",  # the built-in envs' tool names
        "entity",
        "relation",
        "query",
        "title",
        "code",  # and their argument keys
    }
    common = {w.lower() for w in _COMMON_WORDS} | PROTOCOL
    assert not env_words & common, sorted(env_words & common)
