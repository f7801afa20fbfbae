"""Does RLlib's PPO (agent_gym.integrations.rllib) learn anything on the easiest FactChain setting
within a wall-clock budget on the CPU? Runs each setting for ``--minutes`` and prints the first and
last iterations' means; writes ``benchmarks/results/rllib_learning.json``.

    nice -n 10 .venv-rllib/bin/python benchmarks/experiments/rllib_learning.py [--minutes 10] [--settings full answer]

The env: ``AgentR1/FactChain-v0`` with 1 hop, 1 relation and 4 entities (4 distinct questions,
each with one answer that a policy could even memorize without calling the tool), the short
prompt (``tools_in_prompt=False``), turns of at most 8 tokens. Settings:

- ``full``: every token id of the vocabulary is an action; reward: exact match only (the env's
  default).
- ``answer``: the actions are the ids of ``<answer>``, ``</answer>``, the entity names and the
  stop token (``vocab="answer"``, 10 actions); reward: exact match plus 0.1 for a well-formed
  ``<answer>`` (``format``), so that writing the tags at all is rewarded.

``success`` is the env's own verdict (exact match) and ``answered`` the share of episodes that
ended with an ``<answer>``, both logged by ``EpisodeStatsCallback``. RLlib's ``episode_return_mean``
and ``episode_len_mean`` (tokens per episode) are its own metrics (means over the last 100
episodes, so they lag the policy).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from agent_gym.integrations.rllib import train
from agent_gym.provenance import write_raw

ENV = {"num_hops": 1, "num_relations": 1, "num_entities": 4, "tools_in_prompt": False}
SETTINGS = {
    "full": {"vocab": "full", "env_kwargs": ENV},
    "answer": {"vocab": "answer", "env_kwargs": {**ENV, "rewards": {"format": 0.1}}},
}
KEYS = ("episode_return_mean", "episode_len_mean", "agent_gym/success", "agent_gym/answered")


def _mean(history: list[dict], key: str) -> float | None:
    vals = [h[key] for h in history if key in h]
    return statistics.fmean(vals) if vals else None


def run(name: str, minutes: float, seed: int) -> dict:
    s = SETTINGS[name]
    history = train(
        10_000,
        max_minutes=minutes,
        env_id="AgentR1/FactChain-v0",
        env_kwargs=s["env_kwargs"],
        vocab=s["vocab"],
        max_turn_tokens=8,
        num_env_runners=2,
        rollout_fragment_length=128,
        num_epochs=4,
        minibatch_size=128,
        lr=1e-3,
        entropy_coeff=0.01,
        seed=seed,
        log=lambda line: None,
    )
    first, last = history[:3], history[-3:]
    out = {
        "setting": name,
        "minutes": minutes,
        "iterations": len(history),
        "env_steps": history[-1].get("num_env_steps_sampled_lifetime"),
        "episodes": sum(h.get("num_episodes", 0) for h in history),
        "first3": {k: _mean(first, k) for k in KEYS},
        "last3": {k: _mean(last, k) for k in KEYS},
        "best_success": max((h.get("agent_gym/success", 0.0) for h in history), default=None),
        "best_return": max((h.get("episode_return_mean", float("-inf")) for h in history), default=None),
        "history": history,
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["full", "answer"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "rllib_learning.json"))
    args = p.parse_args()
    results = []
    for name in args.settings:
        r = run(name, args.minutes, args.seed)
        results.append(r)
        f, l = r["first3"], r["last3"]
        print(
            f"{name:7s} {r['iterations']:4d} it {r['env_steps']:.0f} steps {r['episodes']:.0f} episodes | "
            + " | ".join(f"{k.split('/')[-1]} {f[k]:.3f} -> {l[k]:.3f}" for k in KEYS if f[k] is not None)
            + f" | best success {r['best_success']:.3f}",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    write_raw(__file__, results, outputs=[out])


if __name__ == "__main__":
    main()
