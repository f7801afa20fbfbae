"""FactChain's question styles, its tokenization and its scripted demonstrators (oracle, protocol,
reversed), and SFT's demonstration mixes and learning-rate schedule."""

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
        assert a["question"] == f'Who is the {r2} of the {r1} of "{start}"?'
        assert b["question"] == f"Who is \"{start}\"'s {r1}'s {r2}?"


def test_names_tokenize_alike_in_question_call_and_result():
    """Copying a name from the question into a call is token-for-token (entities are quoted in
    both places). A relation (unquoted in the question) differs in its first token only, the one
    that carries the space (" rival": `Ġri v al`, "rival": `ri v al`): the default tokenizer has no
    env's words (since 2026-11-25), so relations are no longer single tokens."""
    env = _env(num_relations=6)
    tok = env.tokenizer
    inner = lambda text: tok.tokenize(text)[1:-1]  # noqa: E731  (drop the delimiters)
    for k in range(100):
        task = env.get_task(k)
        q = tok.tokenize(task["question"])
        for entity in task["path"]:
            call = inner(f'"{entity}"')
            assert call == inner(f"\n{entity}\n")  # a tool result
            assert call == tok.tokenize(f"<answer>{entity}</answer>")[1:-1]
        start = inner(f'"{task["path"][0]}"')
        assert any(q[i : i + len(start)] == start for i in range(len(q)))
    for r in env.relations:
        question, call = tok.tokenize(" " + r), inner(f'"{r}"')
        assert question[1:] == call[1:] and question[0] == "\u0120" + call[0]  # Ġ: the space


def _play(env, turns):
    statuses = []
    for text in turns:
        _, reward, term, trunc, info = env.step(env.encode_turn(text))
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


def test_reversed_demonstration_looks_up_outermost_first():
    env = _env(num_relations=4)
    successes = same = 0
    for k in range(400):
        env.reset(options={"task_index": k})
        turns = env.reversed_demonstration(env.task, None)
        statuses, info = _play(env, turns)
        assert statuses == ["ok", "ok"]
        rels = re.findall(r'"relation": "([^"]*)"', "".join(turns))
        assert rels == env.task["chain"][::-1]
        ok = info["answer_scores"]["em"] == 1.0
        successes += ok
        same += env.task["chain"][0] == env.task["chain"][1]
        if env.task["chain"][0] == env.task["chain"][1]:
            assert ok  # reversing a chain of one repeated relation changes nothing
    # it fails whenever the two relations differ, except when both orders meet by chance
    assert same <= successes <= same + 0.1 * 400 and 0.15 < same / 400 < 0.35


def test_sft_demo_mix_draws_each_policy_by_weight():
    env = _env()
    demos = demonstrations(env, list(range(300)), {"oracle": 0.3, "reversed": 0.7}, np.random.default_rng(0))
    reversed_order = 0
    for k, text in enumerate(env.tokenizer.decode(d.token_ids) for d in demos):
        chain = env.get_task(k)["chain"]
        rels = re.findall(r'"relation": "([^"]*)"', text)
        assert rels in (chain, chain[::-1])
        reversed_order += chain[0] != chain[1] and rels == chain[::-1]
    differ = sum(env.get_task(k)["chain"][0] != env.get_task(k)["chain"][1] for k in range(300))
    assert 0.6 < reversed_order / differ < 0.8, (reversed_order, differ)


def test_sft_config_checks_mix_and_schedule():
    from trainers.config import ConfigError
    from trainers.sft import SFTConfig, lr_factor

    env_id = "AgentR1/FactChain-v0"

    with pytest.raises(ConfigError, match="demo_policy"):
        SFTConfig(env_id=env_id, demo_policy={"oracle": -1.0, "reversed": 0.5})
    with pytest.raises(ConfigError, match="warmup_steps"):
        SFTConfig(env_id=env_id, steps=10, warmup_steps=11)
    with pytest.raises(ConfigError, match="lr_schedule"):
        SFTConfig(env_id=env_id, lr_schedule="linear")
    cfg = SFTConfig(env_id=env_id, steps=100, warmup_steps=10, lr_schedule="cosine")
    assert [lr_factor(cfg, s) for s in (0, 4, 9, 10)] == pytest.approx([0.1, 0.5, 1.0, 1.0])
    assert lr_factor(cfg, 55) == pytest.approx(0.5) and lr_factor(cfg, 100) == pytest.approx(0.0)
    assert lr_factor(SFTConfig(env_id=env_id, steps=100, warmup_steps=10), 99) == 1.0


def test_sft_demo_policy_lookup_and_errors():
    env = _env()
    rng = np.random.default_rng(1)
    oracle = demonstrations(env, [0, 1, 2], "oracle", rng)
    proto = demonstrations(env, [0, 1, 2], "protocol", rng)
    assert len(oracle) == len(proto) == 3
    assert all(sum(t.loss_mask) > 0 for t in oracle + proto)
    assert all(t.success for t in oracle) and all(t.answered for t in proto)
    with pytest.raises(ValueError, match=r"demo_policy 'expert'.*available: \['oracle', 'protocol', 'reversed'\]"):
        demo_policy(env, "expert", rng)


def test_heldout_test_split_excludes_the_training_pool():
    """Without exclude_train_tasks the test split repeats some questions of a 64-question training
    pool (6 of the first 64 with the defaults); with it, none, and the answers still follow the KB."""

    def key(t):
        return t["path"][0], tuple(t["chain"])

    pool = {key(_env(num_tasks=64).get_task(k)) for k in range(64)}
    plain, held = _env(split="test"), _env(split="test", exclude_train_tasks=64)
    assert sum(key(plain.get_task(k)) in pool for k in range(64)) > 0
    for k in range(200):
        t = held.get_task(k)
        assert key(t) not in pool
        e = t["path"][0]
        for r in t["chain"]:
            e = held.kb[(e, r)]
        assert t["answer"] == e
        if key(plain.get_task(k)) not in pool:  # only colliding questions are redrawn
            assert t == plain.get_task(k)
    with pytest.raises(ValueError, match="applies to split='test' only"):
        _env(exclude_train_tasks=64)
    with pytest.raises(ValueError, match="must be a non-negative integer"):
        _env(split="test", exclude_train_tasks=-1)
    with pytest.raises(ValueError, match="nothing is held out"):
        _env(split="test", num_entities=2, num_relations=1, num_hops=1, exclude_train_tasks=50)


def test_several_kbs_each_task_asked_and_looked_up_in_its_own():
    from trainers.sft import play

    env = _env(num_kbs=3, num_tasks=30)
    one = _env()
    assert [one.get_task(k) for k in range(0, 30, 3)] == [
        {**env.get_task(k), "kb": 0} for k in range(0, 30, 3)
    ]  # KB 0's tasks are the single-KB env's
    names = [set(env.kb_at(i)[0]) for i in range(3)]
    assert env.kb_at(0)[1] != env.kb_at(1)[1] and len(names[0] & names[1]) < 8
    for k in range(30):
        t = env.get_task(k)
        assert t["kb"] == k % 3 and t["path"][0] in names[k % 3]
        ep = play(env, k, env.demonstration)  # the oracle's lookups are answered from the task's KB
        assert ep.success and ep.call_statuses == {"ok": 2}
    env.reset(options={"task_index": 1})
    only_kb0 = sorted(names[0] - names[1])[0]
    _, _, _, _, info = env.step(
        env.encode_turn(
            '<tool_call>{"name": "lookup", "arguments": {"entity": "%s", "relation": "rival"}}</tool_call>' % only_kb0
        )
    )
    assert info["tool_calls"][0]["status"] == "tool_error"  # KB 0's entity is unknown in KB 1
    with pytest.raises(ValueError, match="num_kbs must be a positive integer"):
        _env(num_kbs=0)
    with pytest.raises(IndexError, match="num_kbs=3"):
        env.kb_at(3)


@pytest.mark.timeout(60)
def test_many_kbs_are_built_lazily_and_agree_with_make_kb():
    """An env over 100,000 KBs builds only the KBs its tasks use, a process keeps at most KB_CACHE_SIZE
    of them (shared by its envs), and each is make_kb of its seed (the same as an env built with that
    kb_seed alone)."""
    import pickle
    import time

    from envs.factchain import KB_CACHE_SIZE, make_kb, shared_kb

    shared_kb.cache_clear()
    t0 = time.perf_counter()
    env = _env(num_kbs=100_000, num_tasks=1_000_000, kb_seed=5)
    assert time.perf_counter() - t0 < 5.0  # eager construction took ~60 s at 0.6 ms per KB
    assert shared_kb.cache_info().misses == 1
    for k in (0, 1, 99_999, 123_457, 999_999):
        t = env.get_task(k)
        names, facts = make_kb(32, 4, 5 + k % 100_000)
        assert t["kb"] == k % 100_000 and env.facts(t) == facts and t["path"][0] in names
        assert t == {**_env(kb_seed=5 + k % 100_000, num_tasks=1_000_000).get_task(k), "kb": k % 100_000}
    other = _env(num_kbs=100_000, num_tasks=1_000_000, kb_seed=5)
    misses = shared_kb.cache_info().misses
    assert other.get_task(1) == env.get_task(1) and shared_kb.cache_info().misses == misses  # shared, not rebuilt
    assert other.kb_at(1) is env.kb_at(1)
    for k in range(KB_CACHE_SIZE + 100):
        env.get_task(k)
    assert shared_kb.cache_info().currsize == KB_CACHE_SIZE
    assert env.get_task(3) == pickle.loads(pickle.dumps(env)).get_task(3)


def test_a_step_interrupted_after_a_correct_hop_is_rolled_back_with_the_hops_found(monkeypatch):
    """``_hops_found`` is changed in ``process_components``; before the fix
    a KeyboardInterrupt later in that step left the hop marked as paid, so the retried step paid
    no hop reward."""
    from unittest.mock import Mock

    from envs.factchain import lookup_turn

    env = gym.make("AgentR1/FactChain-v0", rewards={"extra": {"hop": 0.5}})
    u = env.unwrapped
    obs, _ = env.reset(options={"task_index": 0})
    task = u.task
    action = u.encode_turn(lookup_turn(task["path"][0], task["chain"][0]))
    before = (obs["input_ids"].copy(), set(u._hops_found))
    with monkeypatch.context() as m:  # the step is interrupted after its hop was paid
        m.setattr(u, "_append_delta", Mock(side_effect=KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            env.step(action)
        assert u._append_delta.called
    assert np.array_equal(u._obs()["input_ids"], before[0]) and u._hops_found == before[1] == set()
    obs, r, term, trunc, info = env.step(action)
    assert (r, term, trunc) == (0.5, False, False) and info["reward_components"]["hop"] == 0.5
    assert u._hops_found == {0} and u.turn == 1
    # The rest of the episode as without the interrupt: the second hop pays, the answer scores.
    _, r, *_ = env.step(u.encode_turn(lookup_turn(task["path"][1], task["chain"][1])))
    _, r2, term, _, info = env.step(u.encode_turn(f"<answer>{task['answer']}</answer>"))
    assert (r, r2, term) == (0.5, 1.0, True) and info["trajectory"].step_rewards == [0.5, 0.5, 1.0]


def _bad_tasks(env):
    good = env.get_task(3)
    other = next(e for e in env.entities if e != good["path"][1])
    return good, {
        "answer None": ({"answer": None}, r"'answer' must be the entity at the end of the path"),
        "answer wrong": ({"answer": other}, r"'answer' must be the entity at the end of the path"),
        "answer blank": ({"answer": "  "}, r"'answer' must be the entity"),
        "question blank": ({"question": " "}, r"'question' must be a non-blank string"),
        "chain empty": ({"chain": []}, r"'chain' must be a non-empty list of relations"),
        "chain unknown relation": ({"chain": ["cousin", "rival"]}, r"'chain' must be a non-empty list"),
        "chain string": ({"chain": "rival"}, r"'chain' must be a non-empty list"),
        "path short": ({"path": good["path"][:-1]}, r"'path' must be a list of 3 entity names"),
        "path None": ({"path": None}, r"'path' must be a list of 3 entity names"),
        "path unknown start": (
            {"path": ["Nobody"] + good["path"][1:]},
            r"'path' starts from 'Nobody', which is no entity",
        ),
        "path off the KB": (
            {"path": [good["path"][0], other, good["path"][2]]},
            rf"'path' says the {good['chain'][0]} of '{good['path'][0]}' is '{other}'",
        ),
        "kb out of range": ({"kb": 5}, r"'kb' must be a KB index in \[0, 1\)"),
        "kb bool": ({"kb": True}, r"'kb' must be a KB index"),
    }


def test_reset_task_is_validated_like_generated_tasks():
    """Before the fix a task given through reset(options={"task": ...}) was checked only for its
    keys: ``answer: None`` made the answer step raise (TypeError in exact_match). Such tasks now fail
    at reset, naming the key, with the env unchanged; every generated task passes the same check."""
    env = gym.make("AgentR1/FactChain-v0").unwrapped
    good, cases = _bad_tasks(env)
    env.reset(options={"task_index": 0})
    before = (env.task, list(env._ids))
    for name, (change, message) in cases.items():
        with pytest.raises(ValueError, match=r"FactChain options\['task'\]: " + message):
            env.reset(options={"task": {**good, **change}})
        assert (env.task, list(env._ids)) == before, name
    env.reset(options={"task": {k: v for k, v in good.items() if k != "kb"}})  # kb defaults to 0
    _, r, term, _, _ = env.step(env.encode_turn(f"<answer>{good['answer']}</answer>"))
    assert term and r == 1.0


def test_generated_tasks_pass_the_task_check_on_every_kb():
    env = gym.make("AgentR1/FactChain-v0", num_kbs=7, num_hops=3).unwrapped
    for k in range(200):
        task = env.get_task(k)
        assert env.check_task(task) == task
    with pytest.raises(ValueError, match=r"FactChain task 5: 'path'"):  # the generator's route, same check
        env.validate_task({**env.get_task(5), "path": ["x"] * 4}, "task 5")
