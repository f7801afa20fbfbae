"""PassageFormatter cost on huge passages: a search result that returns one very long passage.

    python benchmarks/perf/passage_formatter.py                 # 20 MB passage, built-in tokenizer
    python benchmarks/perf/passage_formatter.py --mb 2 --repeats 5

A QA env's search result is cut to ``max_result_tokens`` (512). A passage far longer than that
must cost about what a 512-token passage costs, on the first search that returns it and on every
later one. This times ``PassageFormatter.format`` on ``[huge, small, small]`` (the huge one
first, so it is cut) and on ``[small, small, huge]`` (cut as the last one shown), for the first
call (nothing cached) and for repeated calls (cached), and a whole env step through a bm25s
search tool that returns the huge passage.

Results go to ``benchmarks/results/passage_formatter.json`` (git-ignored) and are printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from agent_gym.retrievers import Passage  # noqa: E402
from agent_gym.tokenizer import load_tokenizer  # noqa: E402
from envs.qa import PassageFormatter  # noqa: E402

WORDS = (
    "the quillhaven lighthouse was built in 1884 on the harbour wall and painted white "
    "by the keepers who lived in the town "
).split()


def huge_text(mb: float) -> str:
    n = int(mb * 1_000_000)
    out, size, i = [], 0, 0
    while size < n:
        w = WORDS[i % len(WORDS)]
        out.append(w)
        size += len(w) + 1
        i += 1
    return " ".join(out)


def timed(fn, repeats: int) -> tuple[list[float], list[bool]]:
    """Seconds per call, and for each call whether a full garbage collection ran during it."""
    full = [False]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info.get("generation") == 2:
            full[0] = True

    times, fulls = [], []
    gc.callbacks.append(on_gc)
    try:
        for _ in range(repeats):
            full[0] = False
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            fulls.append(full[0])
    finally:
        gc.callbacks.remove(on_gc)
    return times, fulls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20.0, help="size of the huge passage in MB")
    ap.add_argument("--repeats", type=int, default=5, help="cached calls to time")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "passage_formatter.json"))
    args = ap.parse_args(argv)

    tok = load_tokenizer(None)
    big = Passage(title="Quillhaven", text=huge_text(args.mb), score=1.0, id="big")
    small = [Passage(title=f"Small {i}", text=" ".join(WORDS * 2), score=0.5, id=f"s{i}") for i in range(2)]
    results: dict[str, object] = {
        "mb": args.mb,
        "chars": len(big.text),
        "max_tokens": args.max_tokens,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    for name, passages in (("huge_first", [big, *small]), ("huge_last", [*small, big])):
        fmt = PassageFormatter(tok, args.max_tokens)
        first = timed(lambda: fmt.format(passages), 1)[0][0]
        again, _ = timed(lambda: fmt.format(passages), args.repeats)
        text, titles = fmt.format(passages)
        n = len(tok.encode(text, add_special_tokens=False))
        results[name] = {
            "first_s": first,
            "cached_median_s": statistics.median(again),
            "cached_max_s": max(again),
            "result_tokens": n,
            "titles": titles,
        }
        print(
            f"{name:11s} first call {first * 1e3:10.2f} ms   cached median {statistics.median(again) * 1e3:9.3f} ms"
            f"   max {max(again) * 1e3:9.3f} ms   result {n} tokens, titles {titles}"
        )

    # A whole env step: a bm25s search tool that returns the huge passage first.
    import gymnasium as gym

    import agent_gym  # noqa: F401
    from agent_gym.datasets import load_qa

    fixtures = ROOT / "tests" / "fixtures" / "qa"
    tasks = load_qa("hotpotqa", data_path=fixtures / "hotpotqa")
    docs = [{"id": "big", "title": big.title, "text": big.text}]
    docs += [
        {"id": f"d{i}", "title": p["title"], "text": p["text"]} for i, t in enumerate(tasks) for p in t.context[:1]
    ]
    env = gym.make(
        "AgentR1/HotpotQA-v0",
        data_path=str(fixtures / "hotpotqa"),
        retriever="bm25",
        retriever_kwargs={"corpus": docs, "cache": False},
        max_context_tokens=4096,
        max_turns=50,
    )
    u = env.unwrapped
    call = '<tool_call>{"name": "search", "arguments": {"query": "quillhaven lighthouse keepers"}}</tool_call>'
    ids = u.encode_turn(call)
    steps = []
    for _ in range(1 + args.repeats):  # a fresh episode each time; the env's caches stay warm
        env.reset(options={"task_index": 0})
        steps += timed(lambda: env.step(ids), 1)[0]
        assert "Quillhaven" in u.messages[-1]["content"] and len(u.messages[-1]["content"]) < 10_000
    results["env_step"] = {"first_s": steps[0], "later_median_s": statistics.median(steps[1:])}
    print(
        f"env step    first       {steps[0] * 1e3:10.2f} ms   later median  {statistics.median(steps[1:]) * 1e3:9.3f} ms"
    )

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"saved {out}")
    write_raw(__file__, results, argv=argv, outputs=[out])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
