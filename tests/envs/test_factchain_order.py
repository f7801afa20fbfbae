"""envs/factchain_order.py (behind benchmarks/analysis/factchain_order.py): classing a FactChain
episode by the order of its lookups, on the env's own questions (a change of the question's wording
fails here, not silently in the docs' figures), and the paired before/after comparison."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401  (registers the envs)
from agent_gym.stats import sign_test
from envs import factchain_order as m

EXAMPLE = (
    'Example:\nQuestion: Who is the mentor of the rival of "Karimel"?\nYou: <tool_call>[{"name": "lookup", '
    '"arguments": {"entity": "Karimel", "relation": "rival"}}]</tool_call>\n'
)


def _text(task: dict, relations: list[str]) -> str:
    calls = "".join(
        f'<tool_call>[{{"name": "lookup", "arguments": {{"entity": "{task["path"][0]}", '
        f'"relation": "{r}"}}}}]</tool_call>\n<tool_response>\nX\n</tool_response>\n'
        for r in relations
    )
    return f"system\n{EXAMPLE}user\n{task['question']}\nassistant\n{calls}<answer>X</answer>"


def _tasks(num_hops: int, n: int) -> list[dict]:
    env = gym.make("AgentR1/FactChain-v0", num_hops=num_hops)
    out = []
    for seed in range(n):
        env.reset(seed=seed)
        out.append(dict(env.unwrapped.task))
    env.close()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_hops", [2, 3])
def test_episodes_are_classed_by_their_first_lookup_on_the_envs_questions(num_hops):
    seen = set()
    for task in _tasks(num_hops, 24):
        chain = task["chain"]  # lookup order: innermost first
        right = m.classify(_text(task, chain))
        wrong = m.classify(_text(task, chain[::-1]))
        assert right[1] == wrong[1] == task["path"][0]  # the question's start entity, not the example's
        if chain[0] == chain[-1]:  # the first lookup cannot tell the order
            assert right[0] == wrong[0] == "same"
        else:
            assert right[0] == "inner_first"
            assert wrong[0] == "outer_first"
        seen.add(right[0])
        assert m.classify(_text(task, []))[0] in ("same", "other")  # no lookup at all
    assert "inner_first" in seen


def test_no_question_is_an_error():
    with pytest.raises(ValueError, match="no nested FactChain question"):
        m.classify("user\nWhat is 2 + 2?\nassistant\n<answer>4</answer>")


def _write(path: Path, tasks: list[dict], successes: list[bool], order: str) -> str:
    with open(path, "w") as f:
        for i, (task, ok) in enumerate(zip(tasks, successes)):
            rel = task["chain"] if order == "right" else task["chain"][::-1]
            f.write(json.dumps({"task_index": i, "success": ok, "text": _text(task, rel)}) + "\n")
    return str(path)


@pytest.mark.timeout(120)
def test_paired_comparison_counts_flips_and_gives_the_exact_sign_test(tmp_path):
    tasks = [t for t in _tasks(2, 40) if len(set(t["chain"])) == 2][:8]
    before = _write(tmp_path / "b.jsonl", tasks, [False] * 7 + [True], "wrong")
    after = _write(tmp_path / "a.jsonl", tasks, [True] * 7 + [False], "right")
    r = m.compare(m.load(before), m.load(after))
    assert (r["questions"], r["right_before"], r["right_after"]) == (8, 1, 7)
    assert (r["fail_to_success"], r["success_to_fail"]) == (7, 1)
    assert r["sign_test_p"] == pytest.approx(2 * 9 / 256)  # P(>= 7 of 8 flips one way) both sides
    assert r["before"]["outer_first"] == {"episodes": 8, "right": 1}
    assert r["after"]["inner_first"] == {"episodes": 8, "right": 7}
    assert sign_test(7, 0) == pytest.approx(1 / 64) and sign_test(0, 0) == 1.0 and sign_test(3, 3) == 1.0
    # different questions under one task index: refused, not compared
    shuffled = _write(tmp_path / "s.jsonl", tasks[1:] + tasks[:1], [True] * 8, "right")
    with pytest.raises(ValueError, match="asks about"):
        m.compare(m.load(before), m.load(shuffled))
    with pytest.raises(ValueError, match="different tasks"):
        m.compare(m.load(before), m.load(_write(tmp_path / "f.jsonl", tasks[:5], [True] * 5, "right")))
