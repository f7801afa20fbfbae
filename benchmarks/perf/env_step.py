"""Env step throughput: FactChain steps per second around 1,000-token contexts, on one core.

Each measurement resets an env, fast-forwards it (untimed) to a context of about 1,000 tokens
with valid lookups, then times single steps of valid lookups (the common case in training:
decode, parse, validate, run the tool, render the delta). Tool time is measured separately and
subtracted for the "excluding tool time" figure. Reported as medians over many steps.

    python benchmarks/perf/env_step.py [--steps 4000] [--out benchmarks/results/env_step.json]

Also reports a ``ToolVectorEnv`` of 64 (total sub-env steps per second), inline and threaded, and
the same with the delta cache disabled (every tool result rendered through the chat template).

HotpotQA (``hotpotqa_bm25_top3``): env steps per second of ``AgentR1/HotpotQA-v0`` with bm25s
top-3 over the shared 16,210-paragraph corpus (``../shared/data/hotpotqa/corpus.jsonl``, or
``$AGENT_GYM_SHARED_DATA``; skipped with a message when absent), default budget of 512 result
tokens and the built-in tokenizer. Every timed step is one ``search`` call whose query is used
once only (the 600 questions and 1,200 supporting titles of the dev sample), so neither the
chat-template delta cache nor the per-passage token counts are warm for repeated queries;
episodes are up to 4 searches long (resets untimed). Target: >= 500 steps/s on one core.
``steps_per_s_cpu_time`` is the same median from the process CPU time (all threads), which a machine shared
with other jobs inflates less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

import agent_gym  # noqa: E402,F401
from agent_gym.provenance import write_raw
from agent_gym.vector import ToolVectorEnv  # noqa: E402
from envs.factchain import FactChainEnv  # noqa: E402

TARGET_CONTEXT = 1000


class TimedTool:
    """Wraps a tool's execute to accumulate its wall time."""

    def __init__(self, tool):
        self.tool, self.total = tool, 0.0
        self._execute = tool.execute
        tool.execute = self

    def __call__(self, **kw):
        t0 = time.perf_counter()
        try:
            return self._execute(**kw)
        finally:
            self.total += time.perf_counter() - t0


def lookup_ids(env: FactChainEnv, rng: np.random.Generator) -> np.ndarray:
    e = env.entities[int(rng.integers(len(env.entities)))]
    r = env.relations[int(rng.integers(len(env.relations)))]
    text = '<tool_call>{"name": "lookup", "arguments": {"entity": "%s", "relation": "%s"}}</tool_call>' % (e, r)
    return env.encode_turn(text)


def make_env(cache: bool) -> FactChainEnv:
    env = FactChainEnv(max_turns=10_000, max_tool_calls=10_000, max_context_tokens=TARGET_CONTEXT + 400)
    if not cache:
        env.renderer._cache_size = 0
    return env


def fast_forward(env: FactChainEnv, rng: np.random.Generator, seed: int) -> None:
    obs, _ = env.reset(seed=seed)
    while len(obs["input_ids"]) < TARGET_CONTEXT - 60:
        obs, *_ = env.step(lookup_ids(env, rng))


def bench_single(steps: int, cache: bool) -> dict:
    env = make_env(cache)
    timer = TimedTool(env.tools["lookup"])
    rng = np.random.default_rng(0)
    per_step, per_step_excl, ctx = [], [], []
    seed = 0
    while len(per_step) < steps:
        fast_forward(env, rng, seed)
        seed += 1
        actions = [lookup_ids(env, rng) for _ in range(4)]
        for a in actions:  # 4 steps span roughly 940..1130 tokens of context
            tool0 = timer.total
            t0 = time.perf_counter()
            obs, *_ = env.step(a)
            dt = time.perf_counter() - t0
            per_step.append(dt)
            per_step_excl.append(dt - (timer.total - tool0))
            ctx.append(len(obs["input_ids"]))
    med, med_excl = statistics.median(per_step), statistics.median(per_step_excl)
    return {
        "steps": len(per_step),
        "median_context_tokens": statistics.median(ctx),
        "median_step_us": med * 1e6,
        "steps_per_s": 1 / med,
        "steps_per_s_excl_tool": 1 / med_excl,
    }


def bench_vector(n: int, rounds: int, threads: int, cache: bool) -> dict:
    vec = ToolVectorEnv([lambda: make_env(cache) for _ in range(n)], num_threads=threads, info_format="list")
    timers = [TimedTool(e.tools["lookup"]) for e in vec.envs]
    rng = np.random.default_rng(1)
    times, excl = [], []
    for r in range(rounds):
        vec.reset(seed=r)
        for e in vec.envs:
            while len(e._ids) < TARGET_CONTEXT - 60:
                e.step(lookup_ids(e, rng))
        for _ in range(4):
            acts = [lookup_ids(e, rng) for e in vec.envs]
            tool0 = sum(t.total for t in timers)
            t0 = time.perf_counter()
            vec.step(acts)
            dt = time.perf_counter() - t0
            times.append(dt)
            excl.append(dt - (sum(t.total for t in timers) - tool0))
    vec.close()
    med, med_excl = statistics.median(times), statistics.median(excl)
    return {
        "num_envs": n,
        "threads": threads,
        "median_vector_step_ms": med * 1e3,
        "env_steps_per_s": n / med,
        "env_steps_per_s_excl_tool": n / med_excl,
    }


def shared_data_dir() -> Path:
    return Path(os.environ.get("AGENT_GYM_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


def bench_hotpotqa(max_steps: int) -> dict | None:
    data = shared_data_dir() / "hotpotqa"
    if not (data / "corpus.jsonl").is_file() or not (data / "dev_sample.jsonl").is_file():
        print(f"hotpotqa: skipped, shared data not found at {data} (set AGENT_GYM_SHARED_DATA)")
        return None
    from envs.hotpotqa import HotpotQAEnv

    t0 = time.perf_counter()
    env = HotpotQAEnv(
        data_path=data / "dev_sample.jsonl",
        corpus_path=data / "corpus.jsonl",
        retriever_kwargs={"cache": False},
        topk=3,
        max_turns=100,
        max_tool_calls=100,
    )
    build_s = time.perf_counter() - t0
    timer = TimedTool(env.tools["search"])
    tasks = [env.get_task(i) for i in range(env.num_tasks())]
    queries = list(dict.fromkeys([t["question"] for t in tasks] + [s for t in tasks for s in t["supporting_titles"]]))
    queries = queries[:max_steps]
    per_step, per_step_excl, ctx, cpu = [], [], [], []
    cut = 0
    for i, q in enumerate(queries):
        if i % 4 == 0:
            env.reset(options={"task_index": (i // 4) % len(tasks)})
        text = '<tool_call>{"name": "search", "arguments": %s}</tool_call>' % json.dumps({"query": q})
        action = env.encode_turn(text)
        tool0 = timer.total
        c0 = time.process_time()
        t0 = time.perf_counter()
        obs, _, term, trunc, info = env.step(action)
        dt = time.perf_counter() - t0
        cpu.append(time.process_time() - c0)
        assert info["tool_calls"][0]["status"] == "ok" and not (term or trunc), info["tool_calls"]
        per_step.append(dt)
        per_step_excl.append(dt - (timer.total - tool0))
        ctx.append(len(obs["input_ids"]))
        cut += env.messages[-1]["content"].endswith(" ...")
    med, med_excl = statistics.median(per_step), statistics.median(per_step_excl)
    return {
        "steps": len(per_step),
        "corpus_docs": len(env.retriever.docs),
        "index_build_s": build_s,
        "median_context_tokens": statistics.median(ctx),
        "results_cut_to_budget": cut / len(per_step),
        "median_step_us": med * 1e6,
        "steps_per_s": 1 / med,
        "mean_steps_per_s": len(per_step) / sum(per_step),
        "steps_per_s_cpu_time": 1 / statistics.median(cpu),
        "steps_per_s_excl_tool": 1 / med_excl,
        "median_tool_us": statistics.median(a - b for a, b in zip(per_step, per_step_excl)) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--vector-rounds", type=int, default=12)
    ap.add_argument("--hotpotqa-steps", type=int, default=1800, help="at most the 1,800 distinct queries")
    ap.add_argument("--only", choices=["factchain", "hotpotqa"], help="run one of the two benchmarks")
    ap.add_argument("--out", default="benchmarks/results/env_step.json")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    results = {}
    if args.only != "hotpotqa":
        results.update(
            {
                "single_env": bench_single(args.steps, cache=True),
                "single_env_no_delta_cache": bench_single(args.steps // 4, cache=False),
                "vector_64_inline": bench_vector(64, args.vector_rounds, 0, cache=True),
                "vector_64_threads": bench_vector(64, args.vector_rounds, 16, cache=True),
            }
        )
    if args.only != "factchain":
        hotpot = bench_hotpotqa(args.hotpotqa_steps)
        if hotpot is not None:
            results["hotpotqa_bm25_top3"] = hotpot
    for k, v in results.items():
        print(f"{k:28s} " + "  ".join(f"{a}={b:.1f}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items()))
    write_raw(__file__, results, outputs=[args.out])  # this run's figures (--out may merge in an earlier run's)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.only and out.is_file():  # keep the other benchmark's figures
        results = {**json.loads(out.read_text()), **results}
    out.write_text(json.dumps(results, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
