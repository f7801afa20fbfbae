"""Evaluate a model, or a scripted policy, over an env's tasks.

    python trainers/evaluate.py --env AgentR1/FactChain-v0 --model runs/factchain_sft/model
    python trainers/evaluate.py --env AgentR1/FactChain-v0 --policy oracle --tasks 200
    python trainers/evaluate.py --env AgentR1/HotpotQA-NaiveRAG-v0 --model Qwen/Qwen2.5-3B-Instruct \\
        --env-kwargs '{data_path: data/hotpot_dev_distractor_v1.json}'

It reports EM, F1, success, turns, tool calls by status and the reward components, and writes
``summary.json`` and ``trajectories.jsonl`` to ``--out``. The paper's two baselines are both
runs of this script: Naive RAG is a model on a ``*-NaiveRAG-v0`` env, and the base tool-call
agent is an untrained (instruct) model on the tool env.

Policies: ``model`` (greedy decoding with ``--model``), ``oracle`` (the env's
``demonstration(task)``), ``wrong`` (calls nothing and answers "none"; a floor).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import yaml  # noqa: E402


def scripted_episodes(env_id: str, env_kwargs: dict[str, Any], tasks: list[int], policy: str):
    import gymnasium as gym

    from trainers.sft import play

    env = gym.make(env_id, **env_kwargs).unwrapped
    if policy == "oracle" and not hasattr(type(env), "demonstration"):
        raise SystemExit(f"error: {type(env).__name__} has no demonstration(task); use --policy model or wrong")
    script = env.demonstration if policy == "oracle" else (lambda task: ["<answer>none</answer>"])
    return [play(env, k, script) for k in tasks], env.tokenizer


def model_episodes(env_id: str, env_kwargs: dict[str, Any], tasks: list[int], model: str, backend: str,
                   max_turn_tokens: int):
    from trainers.backends.base import SamplingConfig
    from trainers.config import TrainConfig
    from trainers.models import load_policy, load_tokenizer_for
    from trainers.rollout import collect
    from trainers.trainer import make_backend, make_vector_env

    cfg = TrainConfig(model=model, backend=backend, eval_tasks=len(tasks))
    tok = load_tokenizer_for(cfg)
    policy = load_policy(cfg, tok).eval()
    vocab = policy.get_input_embeddings().num_embeddings
    envs = make_vector_env(env_id, len(tasks), {"tokenizer": tok, "vocab_size": vocab, **env_kwargs})
    be = make_backend(cfg, policy, tok, Path(".cache/evaluate"))
    try:
        trajs, _ = collect(envs, be, tasks, 1, SamplingConfig(max_new_tokens=max_turn_tokens, temperature=0.0), seed=0)
    finally:
        be.close()
        envs.close()
    return [t.episode for t in trajs], tok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Evaluate a model or a scripted policy on an env.")
    ap.add_argument("--env", default="AgentR1/FactChain-v0")
    ap.add_argument("--env-kwargs", default="{}", help="YAML mapping of env arguments")
    ap.add_argument("--policy", choices=["model", "oracle", "wrong"], default="model")
    ap.add_argument("--model", help="HF directory, hub name or 'tiny' (with --policy model)")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--tasks", type=int, default=100, help="evaluate tasks 0..N-1")
    ap.add_argument("--max-turn-tokens", type=int, default=256)
    ap.add_argument("--out", default="runs/eval")
    args = ap.parse_args(argv)
    import agent_gym  # noqa: F401
    from trainers.rollout import summarize
    from trainers.trainer import episode_record, eval_keys

    env_kwargs = yaml.safe_load(args.env_kwargs) or {}
    if not isinstance(env_kwargs, dict):
        ap.error("--env-kwargs must be a YAML mapping, e.g. '{split: test}'")
    tasks = list(range(args.tasks))
    if args.policy == "model":
        if not args.model:
            ap.error("--policy model needs --model")
        episodes, tok = model_episodes(args.env, env_kwargs, tasks, args.model, args.backend, args.max_turn_tokens)
    else:
        episodes, tok = scripted_episodes(args.env, env_kwargs, tasks, args.policy)
    summary = eval_keys(summarize(episodes))
    summary.update({"env": args.env, "policy": args.policy, "model": args.model, "tasks": len(episodes)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with open(out / "trajectories.jsonl", "w") as f:
        for ep in episodes:
            f.write(json.dumps(episode_record(ep, tok)) + "\n")
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
