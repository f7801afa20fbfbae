"""Discounted return-to-go over agent tokens (GAE's and REINFORCE++'s inner scan) when
gamma * lambda != 1: the per-token Python loop it replaced, the blocked scan now in
``trainers/algos/advantages.py``, and ``scipy.signal.lfilter`` as the reference speed.

    python -m benchmarks.perf.advantages_speed                    # B=64,T=4096 and B=256,T=8192
    python -m benchmarks.perf.advantages_speed --rounds 5

The three sides are timed interleaved (loop, blocked, lfilter, loop, ...) over ``--rounds``
rounds; each round times one call of each. lfilter runs per row on the packed agent tokens
(no mask handling), so it is a floor, not an equal. Prints the median and range per side, the
ratios and the load average; results go to ``benchmarks/results/advantages_speed.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from agent_gym.provenance import write_raw
from benchmarks.report import save, spread  # noqa: E402
from trainers.algos.advantages import _discounted_cumsum_on_mask  # noqa: E402


def loop_form(x: torch.Tensor, mask: torch.Tensor, discount: float) -> torch.Tensor:
    """The form used before: one step of Python per token position."""
    T = x.shape[1]
    carry = torch.zeros_like(x[:, 0])
    out = []
    for t in reversed(range(T)):
        carry = torch.where(mask[:, t], x[:, t] + discount * carry, carry)
        out.append(carry)
    y = torch.stack(out[::-1], dim=1)
    return torch.where(mask, y, torch.zeros_like(y))


def lfilter_form(x: torch.Tensor, mask: torch.Tensor, discount: float) -> np.ndarray:
    from scipy.signal import lfilter

    xs, ms = x.numpy(), mask.numpy()
    out = np.zeros_like(xs)
    for b in range(xs.shape[0]):
        row = xs[b, ms[b]]
        out[b, ms[b]] = lfilter([1.0], [1.0, -discount], row[::-1])[::-1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="64x4096,256x8192")
    ap.add_argument("--discount", type=float, default=0.99 * 0.95)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: see docs/results.md on 2 threads on a busy 2-core machine)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    results = []
    for shape in args.shapes.split(","):
        B, T = (int(v) for v in shape.split("x"))
        g = torch.Generator().manual_seed(0)
        mask = torch.rand(B, T, generator=g) < 0.8
        x = torch.randn(B, T, generator=g)
        ref = loop_form(x, mask, args.discount)
        got = _discounted_cumsum_on_mask(x, mask, args.discount)
        max_diff = (got - ref).abs().max().item()
        sides = {
            "loop": lambda: loop_form(x, mask, args.discount),
            "blocked": lambda: _discounted_cumsum_on_mask(x, mask, args.discount),
            "lfilter": lambda: lfilter_form(x, mask, args.discount),
        }
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.rounds):
            for name, fn in sides.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        row = {
            "B": B,
            "T": T,
            "max_abs_diff_vs_loop": max_diff,
            "ms": {k: spread(v, 1e3) for k, v in times.items()},
            "loop_over_blocked": statistics.median(times["loop"]) / statistics.median(times["blocked"]),
            "blocked_over_lfilter": statistics.median(times["blocked"]) / statistics.median(times["lfilter"]),
        }
        results.append(row)
        print(
            f"B={B} T={T}: "
            + ", ".join(f"{k} {v['median']:.1f} ms [{v['min']:.1f}-{v['max']:.1f}]" for k, v in row["ms"].items())
            + f"; loop/blocked {row['loop_over_blocked']:.1f}x, blocked/lfilter "
            f"{row['blocked_over_lfilter']:.2f}x; max |blocked-loop| {max_diff:.2e}"
        )
    out = {
        "rounds": args.rounds,
        "threads": args.threads,
        "discount": args.discount,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "results": results,
    }
    print(f"load average before {load_before[0]:.2f}, after {out['load_after'][0]:.2f}")
    write_raw(__file__, out, outputs=[save("advantages_speed", out)])


if __name__ == "__main__":
    main()
