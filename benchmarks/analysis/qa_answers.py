"""What a QA agent's greedy answers are made of: from ``trainers/evaluate.py --out DIR`` trajectories
and the rows file they were evaluated on, count the right answers, the yes/no questions and
answers among them, how often the gold answer appeared in the retrieved passages at all (and was
then extracted), how often the answer is a span of the question itself or the title of a passage it retrieved
(``(Title: X)`` in a tool response) or holds a tool call (``answer_holds_call``: the episode
record's own verdict where it has one, else ``agent_gym.formats.CALL_IN_TEXT``: a call written into
the answer slot, which F1 pays where the call's query shares words with the gold), and the right
answers by the row's question type (HotpotQA's bridge/comparison, 2Wiki's four types, MuSiQue's hop
count; ``rows[T]`` and ``right[T]``, ``untyped`` where a row has none). On the search side: the
episodes that repeat a call of theirs word for word (``query_repeated``: a second hop never asked)
and, of the rows that name supporting paragraphs, the episodes that retrieved all of them
(``supporting_all_retrieved``) or at least one (``supporting_some_retrieved``), matched by title.

    python benchmarks/analysis/qa_answers.py runs/eval_grpo_2wiki/trajectories.jsonl runs/qa_split/2wikimultihopqa_heldout.jsonl [...]

Pairs of (trajectories, rows) may repeat. "Right" is the official exact match after
``agent_gym.scoring.normalize_answer`` against the answer and its aliases; "retrieved" means the
normalized gold occurs in the normalized text of the episode's tool responses.
"""

from __future__ import annotations

import json
import re
import sys

from agent_gym.formats import CALL_IN_TEXT
from agent_gym.provenance import write_raw
from agent_gym.scoring import normalize_answer


def answer_counts(traj_path: str, rows_path: str) -> dict[str, int]:
    rows = [json.loads(line) for line in open(rows_path, encoding="utf-8") if line.strip()]
    eps = [json.loads(line) for line in open(traj_path, encoding="utf-8") if line.strip()]
    out = dict(
        episodes=len(eps),
        answered=0,
        right=0,
        yes_no_questions=0,
        right_yes_no=0,
        answered_yes=0,
        answered_no=0,
        gold_retrieved=0,
        right_when_retrieved=0,
        answer_from_question=0,
        answer_is_retrieved_title=0,
        answer_holds_call=0,
        query_repeated=0,
        rows_with_supporting=0,
        supporting_all_retrieved=0,
        supporting_some_retrieved=0,
    )
    for ep in eps:
        row = rows[ep["task_index"]]
        golds = [normalize_answer(g) for g in [row["answer"], *(row.get("aliases") or [])]]
        golds = [g for g in golds if g]
        yes_no = normalize_answer(row["answer"]) in ("yes", "no")
        responses = normalize_answer(" ".join(re.findall(r"<tool_response>(.*?)</tool_response>", ep["text"], re.S)))
        retrieved = any(g in responses for g in golds)
        titles = {normalize_answer(t) for t in re.findall(r"\(Title: ((?:[^()]|\([^()]*\))*)\)", ep["text"])}
        kind = row.get("type") or "untyped"
        out[f"rows[{kind}]"] = out.get(f"rows[{kind}]", 0) + 1
        out.setdefault(f"right[{kind}]", 0)
        out["yes_no_questions"] += yes_no
        out["gold_retrieved"] += retrieved
        calls = [c for step in ep.get("step_calls") or () for c in step]
        out["query_repeated"] += len(set(calls)) < len(calls)
        supporting = {normalize_answer(t) for t in row.get("supporting_titles") or ()}
        if supporting:
            out["rows_with_supporting"] += 1
            out["supporting_all_retrieved"] += supporting <= titles
            out["supporting_some_retrieved"] += bool(supporting & titles)
        if ep.get("answer") is None:
            continue
        ans = normalize_answer(ep["answer"])
        right = ans in golds
        out[f"right[{kind}]"] += right
        out["answer_from_question"] += bool(ans) and f" {ans} " in f" {normalize_answer(row.get('question', ''))} "
        out["answer_is_retrieved_title"] += bool(ans) and ans in titles
        out["answer_holds_call"] += bool(ep.get("answer_holds_call")) or bool(CALL_IN_TEXT.search(ep["answer"]))
        out["answered"] += 1
        out["answered_yes"] += ans == "yes"
        out["answered_no"] += ans == "no"
        out["right"] += right
        out["right_yes_no"] += right and yes_no
        out["right_when_retrieved"] += right and retrieved
    return out


USAGE = "usage: python benchmarks/analysis/qa_answers.py TRAJECTORIES.jsonl ROWS.jsonl [TRAJECTORIES ROWS ...]"


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if not argv or len(argv) % 2:
        raise SystemExit(USAGE)
    counts = []
    for traj, rows in zip(argv[::2], argv[1::2]):
        counts.append({"trajectories": traj, "rows": rows, **answer_counts(traj, rows)})
        print(json.dumps(counts[-1]))
    write_raw(__file__, counts, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
