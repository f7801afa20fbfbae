"""``trainers/evaluate.py --openai-base-url URL --model NAME``: evaluation through an
OpenAI-compatible server (the client, retries and resumable rows are the torch-free
:mod:`agent_gym.integrations.openai_policy`; this is the command, which summarises with the
trainer's evaluation keys and trajectory records, so it lives in ``trainers``: docs/design.md, "Layers").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.integrations.openai_policy import ClientConfig, episodes_of, evaluate_rows
from trainers.eval_tasks import clamp_tasks


def run_cli(args: Any, ap: Any) -> int:
    """``trainers/evaluate.py --openai-base-url URL --model NAME``: evaluate, write ``summary.json``,
    ``trajectories.jsonl`` (finished rows) and ``rows.jsonl`` to ``--out``; exit status 1 if any
    row failed (a rerun retries those rows only)."""
    if args.checkpoint or args.backend != "hf" or args.decode not in ("greedy", "sample"):
        ap.error(
            "--openai-base-url runs the served model: --checkpoint, --backend and --decode "
            f"{args.decode} do not apply (use --decode greedy or sample)"
        )
    env_kwargs = yaml.safe_load(args.env_kwargs) or {}
    if not isinstance(env_kwargs, dict):
        ap.error("--env-kwargs must be a YAML mapping, e.g. '{split: test}'")
    if args.concurrency < 1:
        ap.error(f"--concurrency must be at least 1, got {args.concurrency}")
    extra = yaml.safe_load(args.openai_extra_body or "{}") or {}
    if not isinstance(extra, dict):
        ap.error("--openai-extra-body must be a YAML mapping, e.g. '{top_k: 1}'")
    temperature = 0.0 if args.decode == "greedy" else (1.0 if args.temperature is None else args.temperature)
    env_id = args.env or "AgentR1/FactChain-v0"
    try:
        cfg = ClientConfig(
            base_url=args.openai_base_url,
            model=args.model,
            timeout=args.request_timeout,
            max_retries=args.max_retries,
            temperature=temperature,
            max_tokens=args.max_turn_tokens or 256,
            same_tokenizer=args.openai_same_tokenizer,
            extra_body=extra,
        )
    except ValueError as e:
        ap.error(str(e))
    from trainers.rollout import summarize  # deferred: torch stays out of `import trainers.evaluate`
    from trainers.sources import episode_record, eval_keys  # deferred: torch stays out of `import trainers.evaluate`

    probe = gym.make(env_id, **env_kwargs).unwrapped
    try:
        rows = clamp_tasks(list(range(args.tasks)), probe)
        tok = probe.tokenizer
    finally:
        probe.close()
    out = Path(args.out)
    res = evaluate_rows(env_id, env_kwargs, rows, cfg, out, concurrency=args.concurrency, seed=args.seed)
    records = res["records"]
    episodes = episodes_of(records)
    failed = [r for r in records if r.get("status") != "ok"]
    summary: dict[str, Any] = eval_keys(summarize(episodes)) if episodes else {}
    summary.update(
        {
            "env": env_id,
            "policy": "openai",
            "model": args.model,
            "tasks": len(episodes),
            "decode": args.decode,
            "temperature": temperature,
            "seed": args.seed,
            "openai/base_url": cfg.base_url,
            "openai/concurrency": args.concurrency,
            "openai/rows": len(records),
            "openai/rows_failed": len(failed),
            "openai/failed_rows": [r["row"] for r in failed],
            "openai/rows_resumed": res["skipped"],
            "openai/requests": sum(r.get("requests", 0) for r in records),
            "openai/retries": sum(r.get("retries", 0) for r in records),
        }
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with open(out / "trajectories.jsonl", "w") as f:
        for ep in episodes:
            f.write(json.dumps(episode_record(ep, tok)) + "\n")
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items()}, indent=1))
    if failed:
        for r in failed[:10]:
            print(f"row {r['row']}: {r['error']}", file=sys.stderr)
        print(
            f"error: {len(failed)} of {len(records)} rows failed (listed in {out / 'rows.jsonl'}); "
            "the metrics are over the finished rows. Run the same command again to retry only those.",
            file=sys.stderr,
        )
        return 1
    return 0
