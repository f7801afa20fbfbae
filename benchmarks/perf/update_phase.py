"""The scoring and update phase of a SmolLM2 QA GRPO iteration, with and without ``scale.share_prefix``.

    python -m benchmarks.perf.update_phase                                    # the scaffold config, 3 rounds
    python -m benchmarks.perf.update_phase --config configs/smollm2_qa_grpo_from_sft.yaml --rounds 3

What a QA iteration spends after its rollout (docs/results.md: the update bounds it on this CPU):
the trainer's own ``score_batch``, ``compute_advantages`` and ``update`` (micro-batches, forward,
backward, optimizer), built from ``--config`` as ``trainers/train_grpo.py`` builds it (the
rollout backend switched to HF and no evaluation, since no rollout runs here), on a batch of real
episodes: the trajectories a run logged (``--trajectories``, a run's ``trajectories/`` directory;
each file's episodes are one GRPO group, the first ``group_size`` of them taken), as many groups as
the config's ``tasks_per_iter``. The rewards are the logged ones. With ``rollout.recompute_logprobs:
false`` the old log-probs are the sampler's, which the logs do not keep: they are scored once by the
policy before the rounds (as the engine's would be, up to its mismatch).

The sides, ``share_prefix`` off and on, are interleaved (off, on, off, on, ...) over ``--rounds``
rounds after a warm-up of each; each round is the whole phase once. Printed and saved
(benchmarks/results/update_phase.json and a raw copy under results/): per side the median and range
of the phase's seconds and of its parts (score, advantages, update, optimizer: ``time/*_s``), the
per-round ratio off / on, the tokens the phase trained on and the positions each side's forwards
ran, and the load average. The weights move a little every round (a real update each time); the
timing does not depend on them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from agent_gym.provenance import write_raw
from benchmarks.report import spread, write_json
from trainers import scale
from trainers.models import MIN_SHARED_PREFIX, shared_prefix_len, token_logprobs
from trainers.rollout import RolloutBatch, pad_rows

ROOT = Path(__file__).resolve().parents[2]


def load_groups(directory: Path, groups: int, group_size: int) -> list[list[dict]]:
    """The first ``group_size`` episodes of each of the last ``groups`` trajectory files that hold
    that many of one group."""
    out = []
    for f in sorted(directory.glob("iter_*.jsonl"), reverse=True):
        recs = [json.loads(x) for x in f.read_text().splitlines()]
        g = [r for r in recs if r["group"] == recs[0]["group"]][:group_size]
        if len(g) == group_size:
            out.append(g)
        if len(out) == groups:
            return out
    raise SystemExit(
        f"{directory}: found {len(out)} trajectory files with {group_size} episodes of a group, need {groups}"
    )


def build(groups: list[list[dict]], pad_id: int) -> RolloutBatch:
    recs = [r for g in groups for r in g]
    ids = pad_rows([r["token_ids"] for r in recs], pad_id, torch.long)
    attn = pad_rows([[1] * len(r["token_ids"]) for r in recs], 0, torch.long)
    mask = pad_rows([r["loss_mask"] for r in recs], 0.0, torch.float32)
    rewards = torch.zeros(mask.shape)
    for i, r in enumerate(recs):  # the episode's reward on its last agent token (an outcome reward)
        last = int(mask[i].nonzero().max())
        rewards[i, last] = float(r["reward"])
    gids = torch.tensor([k for k, g in enumerate(groups) for _ in g])
    return RolloutBatch(ids, attn, mask, rewards, torch.zeros(mask.shape), gids)


def epoch_microbatches(batch: RolloutBatch, max_tokens: int | None, share: bool, minibatch_size: int) -> list:
    """The micro-batches of one epoch: the batch cut into minibatches of ``minibatch_size`` rows in
    order (the trainer shuffles them; the cut is what counts here), each split by the token budget."""
    return [
        mb
        for idx in torch.arange(len(batch)).split(minibatch_size)
        for mb, _ in scale.microbatches(batch.select(idx), max_tokens, "token-mean", share)
    ]


def positions(microbatches: list, share: bool) -> int:
    """Token positions the forwards over ``microbatches`` run (padding included; a shared prefix once)."""
    n = 0
    for mb in microbatches:
        p = shared_prefix_len(mb.input_ids, mb.attention_mask) if share else 0
        p = p if p >= MIN_SHARED_PREFIX else 0
        n += mb.input_ids.numel() - (len(mb) - 1) * p
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "smollm2_qa_grpo_scaffold.yaml"))
    p.add_argument("--trajectories", default=str(ROOT / "runs" / "smollm2_qa_grpo_scaffold_levers" / "trajectories"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--groups", type=int, default=None, help="groups in the batch (default: the config's tasks_per_iter)"
    )
    p.add_argument("--sides", default="plain,share_prefix", help="which of plain,share_prefix to run (comma-separated)")
    p.add_argument(
        "--with-engine",
        action="store_true",
        help="keep the config's rollout backend, so a vLLM engine starts in the process as in a real run",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "update_phase.json"))
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args(argv)

    from trainers.compose import build_trainer
    from trainers.config import load_config

    cfg = load_config(
        args.config,
        [*args.overrides, *([] if args.with_engine else ["rollout.backend=hf"]), "run.tensorboard=false"]
        + ["run.progress_bar=false", "eval.tasks=1"],
    )
    cfg.run.run_dir = str(ROOT / "runs" / "bench_update_phase")
    cfg.run.overwrite = True
    tr = build_trainer(cfg)
    tr.setup()
    try:
        groups = args.groups or cfg.rollout.tasks_per_iter
        batch = build(load_groups(Path(args.trajectories), groups, cfg.rollout.group_size), tr.pad_id)
        if not cfg.rollout.recompute_logprobs:  # the sampler's log-probs stand in for the old policy's
            with torch.no_grad():
                batch.sampler_logprobs = tr._rows(
                    lambda ids, am, lm: token_logprobs(
                        tr.policy, ids, am, temperature=cfg.rollout.temperature, loss_mask=lm
                    )[0],
                    batch,
                    tr.policy,
                )
        budget = cfg.scale.max_tokens_per_microbatch

        def phase(share: bool) -> dict[str, float]:
            cfg.scale.share_prefix = share
            tr.phases.take()
            b = RolloutBatch(
                **{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
            )
            t0 = time.perf_counter()
            with tr.phases("score"):
                b = tr.score_batch(b)
            with tr.phases("advantages"):
                tr.compute_advantages(b)
            m = tr.update(b, 0)
            out = {"total_s": time.perf_counter() - t0, **tr.phases.take()}
            out["update_skipped"] = m["update/skipped"]
            print(f"{name[share]}: {out['total_s']:.1f} s (update {out['time/update_s']:.1f} s)", flush=True)
            return out

        name = {False: "plain", True: "share_prefix"}
        sides = tuple(s for s in (False, True) if name[s] in args.sides.split(","))
        for s in sides:  # warm-up: oneDNN's first call of each shape builds its kernels
            phase(s)
        runs: dict[bool, list[dict[str, float]]] = {s: [] for s in sides}
        loads = []
        for _ in range(args.rounds):
            for s in sides:
                runs[s].append(phase(s))
            loads.append(os.getloadavg()[0])
    finally:
        tr.cleanup()

    epoch = {s: epoch_microbatches(batch, budget, s, cfg.algorithm.minibatch_size) for s in sides}
    keys = ("total_s", "time/score_s", "time/advantages_s", "time/update_s", "time/optimizer_s")
    result = {
        "config": args.config,
        "with_engine": args.with_engine,
        "trajectories": args.trajectories,
        "overrides": args.overrides,
        "rows": len(batch),
        "groups": int(batch.group_ids.max()) + 1,
        "tokens": int(batch.attention_mask.sum()),
        "loss_tokens": int(batch.loss_mask.sum()),
        "prompt_tokens": [
            shared_prefix_len(batch.input_ids[batch.group_ids == g], batch.attention_mask[batch.group_ids == g])
            for g in range(int(batch.group_ids.max()) + 1)
        ],
        "max_tokens_per_microbatch": budget,
        "ppo_epochs": cfg.algorithm.ppo_epochs,
        "positions_per_epoch": {name[s]: positions(epoch[s], s) for s in sides},
        "microbatches_per_epoch": {name[s]: len(epoch[s]) for s in sides},
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "load_avg_1m": loads,
        "seconds": {name[s]: {k: spread([r[k] for r in runs[s]]) for k in keys} for s in sides},
        "ratio_plain_over_shared": (
            spread([a["total_s"] / b["total_s"] for a, b in zip(runs[False], runs[True])]) if len(sides) == 2 else None
        ),
        "skipped_updates": {name[s]: sum(r["update_skipped"] for r in runs[s]) for s in sides},
    }
    print(json.dumps(result, indent=2))
    write_json(args.out, result)
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
