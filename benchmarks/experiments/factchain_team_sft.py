"""Can one tiny shared policy learn FactChainTeam's message protocol from the scripted team?

Plays :class:`envs.factchain_team.TeamOracle` on ``--demos`` training tasks, takes every agent's
``Episode`` as one SFT example (its own context, its own loss mask: the same per-agent
trajectories the multi-agent trainer uses), trains the tiny model with ``trainers.sft.episodes_loss``,
and measures the greedy *team* success of the shared policy on ``--eval-tasks`` test-split tasks
of the same KB (``trainers.multiagent.collect_multiagent``) before and after. Prints and saves a JSON.

    python benchmarks/experiments/factchain_team_sft.py [--demos 1000] [--steps 400] [--eval-tasks 64]

Measured figures (300 and 800 steps): docs/multiagent.md, "Training with the project's trainer".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from agent_gym.provenance import write_raw

REPO = Path(__file__).resolve().parents[2]

ENV_KWARGS = {"tools_in_prompt": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demos", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/factchain_team_sft.json")
    args = ap.parse_args()

    import numpy as np
    import torch

    import agent_gym
    from envs.factchain_team import TeamOracle, play_parallel
    from trainers.backends.base import SamplingConfig
    from trainers.backends.hf_backend import HFBackend
    from trainers.config import ModelConfig
    from trainers.models import load_policy, load_tokenizer_for
    from trainers.multiagent import TeamEnvs, collect_multiagent
    from trainers.rollout import summarize
    from trainers.sft import episodes_loss

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    mcfg = ModelConfig(name="tiny")
    tok = load_tokenizer_for(mcfg)
    model = load_policy(mcfg, tok, seed=args.seed)
    kw = {"tokenizer": tok, "vocab_size": model.get_input_embeddings().num_embeddings, **ENV_KWARGS}
    env = agent_gym.make_multiagent("AgentR1/FactChainTeam-v0", parallel=True, **kw)
    oracle = TeamOracle(env)
    rng = np.random.default_rng(args.seed)
    demos = []
    for k in rng.choice(env.num_tasks(), size=args.demos, replace=False).tolist():
        oracle.reset()
        demos.extend(play_parallel(env, lambda a, obs: oracle.act(a), k)["episodes"].values())
    t_demos = time.perf_counter() - t_start

    teams = TeamEnvs("AgentR1/FactChainTeam-v0", args.eval_tasks, {**kw, "split": "test"})
    backend = HFBackend(model, pad_token_id=tok.pad_token_id)
    greedy = SamplingConfig(max_new_tokens=48, temperature=0.0)

    def evaluate() -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            trajs, _, stats = collect_multiagent(teams, backend, list(range(args.eval_tasks)), 1, greedy, args.seed)
        m = summarize(trajs)
        return {
            **stats.metrics(),
            "agent_answered_rate": m["rollout/answered_rate"],
            "ok_calls_per_agent": m.get("tools/ok_per_episode", 0.0),
        }

    before = evaluate()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    t0 = time.perf_counter()
    losses = []
    for step in range(args.steps):
        model.train()
        loss = episodes_loss(model, [demos[i] for i in rng.choice(len(demos), size=args.batch_size)], tok.pad_token_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step % 100 == 0:
            print(f"step {step}: loss {losses[-1]:.3f}", flush=True)
    t_train = time.perf_counter() - t0
    after = evaluate()
    result = {
        "demos_agent_episodes": len(demos),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "eval_tasks": args.eval_tasks,
        "final_loss": losses[-1],
        "before": before,
        "after": after,
        "demos_s": round(t_demos, 1),
        "train_s": round(t_train, 1),
        "total_s": round(time.perf_counter() - t_start, 1),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    write_raw(__file__, result, outputs=[out])


if __name__ == "__main__":
    main()
