"""Tag-parser speed: every tool-call format's ``parse`` on adversarial turns of about 8,000 tokens.

Before the fix the regex parsers were quadratic on runs of unclosed tags (7,000 ``<tool_call>``
took 13 s; 14,000 took 44 s). The target is under 10 ms for a step of 8k tokens. Each case is a
turn of 8,000 ids of the built-in tokenizer (every tag is one token there), decoded to text and
parsed; reported as the median and maximum over repeats, with the ratio of the time at 16k
tokens to the time at 8k (linear: about 2; quadratic: about 4). A call during which Python ran a
full (generation-2) garbage collection is counted apart: that pass walks every object of the
process (tens of ms with transformers loaded) and would come at some allocation in any step; the
parse is judged on the other calls (``max_ms_no_full_gc``), and the full collections are reported.

    python -m benchmarks.perf.parse_speed [--repeats 20] [--out benchmarks/results/parse_speed.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from agent_gym.formats import get_format, list_formats  # noqa: E402
from agent_gym.provenance import write_raw
from agent_gym.tokenizer import default_tokenizer  # noqa: E402
from benchmarks.perf.passage_formatter import timed  # noqa: E402

TOKENS = 8000
CASES = {
    "unclosed <tool_call>": ["<tool_call>"],
    "unclosed <search>": ["<search>"],
    "unclosed <answer>": ["<answer>"],
    "mixed open tags": ["<tool_call>", "<answer>", "<search>", "</answer>"],
    "closed calls": ["<tool_call>", '{"name": "lookup", "arguments": {"entity": "Karimel"}}', "</tool_call>"],
    "prose": ["the capital of the country where the river is located"],
}


def turn_text(pieces: list[str], n_tokens: int) -> str:
    tok = default_tokenizer()
    unit = tok.encode("".join(pieces), add_special_tokens=False)
    ids = (unit * (n_tokens // len(unit) + 1))[:n_tokens]
    return tok.decode(ids, skip_special_tokens=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/parse_speed.json")
    args = ap.parse_args()
    rows = []
    for case, pieces in CASES.items():
        small, large = turn_text(pieces, TOKENS), turn_text(pieces, 2 * TOKENS)
        for name in list_formats():
            f = get_format(name)
            t8, full8 = timed(lambda: f.parse(small), args.repeats)
            t16, _ = timed(lambda: f.parse(large), args.repeats)
            clean = [t for t, full in zip(t8, full8) if not full]
            row = {
                "case": case,
                "format": name,
                "tokens": TOKENS,
                "chars": len(small),
                "median_ms": statistics.median(t8) * 1e3,
                "max_ms": max(t8) * 1e3,
                "max_ms_no_full_gc": max(clean) * 1e3 if clean else None,
                "calls_with_full_gc": sum(full8),
                "full_gc_ms": [t * 1e3 for t, f_ in zip(t8, full8) if f_],
                "ratio_16k_to_8k": statistics.median(t16) / statistics.median(t8),
            }
            rows.append(row)
            print(
                f"{case:22s} {name:10s} {row['chars']:7d} chars  median {row['median_ms']:7.3f} ms  "
                f"max {row['max_ms']:7.3f} ms  (without a full gc {row['max_ms_no_full_gc'] or float('nan'):7.3f} ms, "
                f"{row['calls_with_full_gc']} calls with one)  16k/8k {row['ratio_16k_to_8k']:4.2f}"
            )
    worst = max(r["max_ms_no_full_gc"] or 0.0 for r in rows)
    worst_any = max(r["max_ms"] for r in rows)
    print(
        f"worst max over all cases: {worst:.3f} ms without a full gc, {worst_any:.3f} ms with "
        f"(target < 10 ms for an 8k-token step)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"rows": rows, "worst_max_ms_no_full_gc": worst, "worst_max_ms": worst_any}
    out.write_text(json.dumps(result, indent=1))
    print(f"saved {out}")
    write_raw(__file__, result, outputs=[out])


if __name__ == "__main__":
    main()
