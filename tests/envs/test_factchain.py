"""FactChain's question styles and its scripted demonstrators (oracle and protocol)."""

from __future__ import annotations

import re
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from trainers.sft import demo_policy, demonstrations


def _env(**kw):
    return gym.make("AgentR1/FactChain-v0", **kw).unwrapped


def test_question_styles_name_the_same_chain():
    nested, poss = _env(), _env(question_style="possessive")
    for k in range(50):
        a, b = nested.get_task(k), poss.get_task(k)
        assert (a["answer"], a["chain"], a["path"]) == (b["answer"], b["chain"], b["path"])
        start, (r1, r2) = a["path"][0], a["chain"]
        assert a["question"] == f"Who is the {r2} of the {r1} of {start}?"
        assert b["question"] == f"Who is {start}'s {r1}'s {r2}?"


def _play(env, turns):
    statuses = []
    for text in turns:
        ids = env.tokenizer.encode(text, add_special_tokens=False) + [env.eot_id]
        _, reward, term, trunc, info = env.step(np.asarray(ids, dtype=np.int64))
        statuses += [c["status"] for c in info["tool_calls"]]
        if term or trunc:
            return statuses, info
    raise AssertionError("the demonstration did not end the episode")


def test_protocol_demonstration_chains_real_results_with_random_relations():
    env = _env(num_relations=4)
    rng = np.random.default_rng(0)
    successes, relations = 0, Counter()
    for k in range(400):
        env.reset(options={"task_index": k})
        turns = env.protocol_demonstration(env.task, rng)
        assert len(turns) == 3 and turns[-1].startswith("<answer>")
        statuses, info = _play(env, turns)
        assert statuses == ["ok", "ok"]
        entities = re.findall(r'"entity": "([^"]*)"', "".join(turns))
        rels = re.findall(r'"relation": "([^"]*)"', "".join(turns))
        relations.update(rels)
        # each lookup starts where the previous one ended, and the answer is the last result
        assert entities[0] == env.task["path"][0]
        assert entities[1] == env.kb[(entities[0], rels[0])]
        assert turns[-1] == f"<answer>{env.kb[(entities[1], rels[1])]}</answer>"
        successes += info["answer_scores"]["em"] == 1.0
    # relations are drawn uniformly, so success is near 1/16 (plus chains that meet by chance)
    assert set(relations) == set(env.relations) and min(relations.values()) > 150
    assert 0.02 < successes / 400 < 0.15


def test_sft_demo_policy_lookup_and_errors():
    env = _env()
    rng = np.random.default_rng(1)
    oracle = demonstrations(env, [0, 1, 2], "oracle", rng)
    proto = demonstrations(env, [0, 1, 2], "protocol", rng)
    assert len(oracle) == len(proto) == 3
    assert all(sum(t["loss_mask"]) > 0 for t in oracle + proto)
    with pytest.raises(ValueError, match=r"demo_policy 'expert'.*available: \['oracle', 'protocol'\]"):
        demo_policy(env, "expert", rng)
