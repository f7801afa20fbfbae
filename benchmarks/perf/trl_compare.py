"""TRL's ``GRPOTrainer`` and the project's GRPO trainer on the same tiny task: seconds per optimizer step.

    python -m benchmarks.perf.trl_compare [--threads 1|2] [--rounds 3] [--steps 4] [--warmup 1]

Both sides train the same randomly initialised tiny Qwen2 (``trainers.tiny_model.build_tiny_qwen2``
with the built-in tokenizer, seed 0) with GRPO, single-turn, on the same prompts and the same reward
function of the completion text (the fraction of its characters that are vowels):

- TRL: ``GRPOTrainer`` with ``reward_funcs=[vowel_reward]``; its own sampling (``model.generate``,
  ``use_vllm=False``); the dataset's ``prompt`` column is the exact prompt text the project's env
  renders (chat template, system prompt and question), so both sides see the same prompts;
- project: ``trainers.trainer.Trainer`` (``algo: grpo``, HF backend) on ``ReplyRewardEnv``, a
  ``ToolEnv`` with no tools, ``max_turns=1`` and ``answer_source="reply"``: the whole reply is the
  answer, and ``score_answer`` returns the same vowel reward (docs/adding_tools_and_envs.md, "A
  reward for a turn without <answer> tags"). No private override.

Matched: prompts per step x generations (``--prompts`` x ``--generations``), the most completion
tokens (``--max-tokens``: TRL's ``max_completion_length``, the project's ``max_turn_tokens``),
temperature 1, top-p 1, a constant learning rate, one optimizer step per generation batch (TRL:
``per_device_train_batch_size`` = the whole batch; project: ``minibatch_size`` = the whole batch,
``ppo_epochs: 1``), no KL term (``beta: 0`` / ``kl_coef: 0``), torch intra-op threads
(``--threads``) and ``OMP_WAIT_POLICY=PASSIVE`` in both processes (``import trainers`` sets PASSIVE
when it is unset, TRL's process would otherwise run with OpenMP's default). Left at each side's
defaults: the loss aggregation and clipping (TRL 1.x: its default ``loss_type``; project:
``token-mean``), and the project's re-computation of the old log-probs before the update
(``recompute_logprobs: true``, one extra forward pass; TRL skips it with one step per generation).
The project's greedy evaluation is switched off for the benchmark (a subclass returns no evaluation
metrics; TRL evaluates nothing either) and checkpoints fall after the last timed step.

Timing: each side runs in its own fresh process; the parent interleaves them, project then TRL, for
``--rounds`` rounds. A process times every optimizer step (TRL: a ``TrainerCallback``'s
``on_step_end``; project: the logger's per-iteration call, i.e. rollout, scoring, update and
logging), drops the first ``--warmup`` steps, and reports the rest; start-up (imports, model and
env building) is excluded. The figure per round is the median over that process's timed steps;
the summary is the median and range over rounds, the ratio project/TRL of the medians, and the
load average before and after. Writes ``benchmarks/results/trl_compare.json``, one entry per
``--threads`` value (``threads_1``, ``threads_2``; a run replaces only its own entry).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

ENV_ID = "AgentR1/BenchReplyReward-v0"
SYSTEM = "Answer in one short sentence."
PROMPTS = [f"Name something you would find in room number {i} of a large old house." for i in range(32)]
VOWELS = set("aeiouAEIOU")


def vowel_reward_text(text: str) -> float:
    """The reward both sides use: the fraction of the completion's characters that are vowels."""
    return sum(c in VOWELS for c in text) / max(len(text), 1)


def vowel_reward(completions: list, **kwargs: Any) -> list[float]:
    """TRL's reward function (plain-text prompts: each completion is a string)."""
    return [vowel_reward_text(c if isinstance(c, str) else str(c)) for c in completions]


def _env_class():
    from agent_gym import ToolEnv

    class ReplyRewardEnv(ToolEnv):
        """Single-turn, no tools: the whole reply is the answer, scored by the vowel reward."""

        def __init__(self, **kwargs: Any):
            kwargs.setdefault("rewards", {"answer_weights": {"reward": 1.0}})
            super().__init__(tools=[], system_prompt=SYSTEM, max_turns=1, answer_source="reply", **kwargs)

        def num_tasks(self) -> int:
            return len(PROMPTS)

        def get_task(self, index: int) -> dict[str, Any]:
            return {"id": f"bench{index}", "question": PROMPTS[index], "answer": ""}

        def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
            return {"reward": vowel_reward_text(answer)}

        def is_success(self, answer_scores: dict[str, float], task: dict[str, Any]) -> bool:
            return answer_scores.get("reward", 0.0) >= 0.5

    return ReplyRewardEnv


def rendered_prompts(n: int) -> list[str]:
    """The first ``n`` prompts as the env renders them (chat template, system prompt, question)."""
    env = _env_class()()
    out = []
    for k in range(n):
        obs, _ = env.reset(options={"task_index": k})
        out.append(env.tokenizer.decode(obs["input_ids"].tolist(), skip_special_tokens=False))
    env.close()
    return out


# -- the two workers (each in a fresh process) --------------------------------------------------------------


def worker_project(a: argparse.Namespace) -> tuple[list[float], dict[str, float]]:
    import gymnasium as gym

    from agent_gym.registration import register_env
    from trainers.compose import build_trainer
    from trainers.config import TrainConfig
    from trainers.trainer import Trainer

    global ReplyRewardEnv
    ReplyRewardEnv = _env_class()  # importable as __main__:ReplyRewardEnv for the vector env
    if ENV_ID not in gym.registry:
        register_env(ENV_ID, f"{__name__}:ReplyRewardEnv")
    stamps: list[float] = []
    logged: list[dict[str, float]] = []

    class BenchTrainer(Trainer):
        def evaluate(self) -> dict[str, float]:  # TRL's side evaluates nothing either
            return {}

    with tempfile.TemporaryDirectory() as tmp:
        batch = a.prompts * a.generations
        cfg = TrainConfig(
            run_dir=tmp,
            seed=0,
            algo="grpo",
            iterations=a.warmup + a.steps,
            env_id=ENV_ID,
            eval_env_kwargs={},
            model="tiny",
            torch_threads=a.threads,
            backend="hf",
            tasks_per_iter=a.prompts,
            group_size=a.generations,
            max_turn_tokens=a.max_tokens,
            temperature=1.0,
            top_p=1.0,
            ppo_epochs=1,
            minibatch_size=batch,
            lr=a.lr,
            kl_coef=0.0,
            eval_every=10**6,
            eval_tasks=1,
            checkpoint_every=10**6,
            log_trajectories=0,
            tensorboard=False,
            progress_bar=False,
        )
        tr = build_trainer(cfg, trainer_cls=BenchTrainer)
        tr.setup()
        log = tr.logger.log

        def timed_log(it: int, metrics: dict[str, float]) -> None:
            log(it, metrics)
            stamps.append(time.perf_counter())
            logged.append(metrics)

        tr.logger.log = timed_log
        stamps.append(time.perf_counter())
        try:
            tr.train()
        finally:
            tr.cleanup()
    workload = {
        "completion_tokens_mean": statistics.mean(m["rollout/agent_tokens_mean"] for m in logged),
        "reward_mean": statistics.mean(m["rollout/reward_mean"] for m in logged),
    }
    return [b - a_ for a_, b in zip(stamps, stamps[1:])], workload


def worker_trl(a: argparse.Namespace) -> tuple[list[float], dict[str, float]]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agent_gym.tokenizer import load_tokenizer
    from trainers.tiny_model import build_tiny_qwen2

    torch.set_num_threads(a.threads)
    tok = load_tokenizer(None)
    model = build_tiny_qwen2(tok, seed=0).train()
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=a.prompts * a.generations,
            num_generations=a.generations,
            max_completion_length=a.max_tokens,
            max_steps=a.warmup + a.steps,
            learning_rate=a.lr,
            lr_scheduler_type="constant",
            beta=0.0,
            temperature=1.0,
            top_p=1.0,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            seed=0,
            dataloader_num_workers=0,
            disable_tqdm=True,
            bf16=False,
            gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[vowel_reward],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": rendered_prompts(len(PROMPTS))}),
            processing_class=tok,
            callbacks=[Stamp()],
        )
        trainer.train()
    logged = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    workload = {
        "completion_tokens_mean": statistics.mean(h["completions/mean_length"] for h in logged),
        "reward_mean": statistics.mean(h["reward"] for h in logged),
    }
    return [b - a_ for a_, b in zip(stamps, stamps[1:])], workload


# -- the parent: interleaved fresh processes ----------------------------------------------------------------


def run_side(side: str, a: argparse.Namespace) -> tuple[list[float], dict[str, float]]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        side,
        "--threads",
        str(a.threads),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--prompts",
        str(a.prompts),
        "--generations",
        str(a.generations),
        "--max-tokens",
        str(a.max_tokens),
        "--lr",
        str(a.lr),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("STEP_SECONDS "):
            secs, workload = json.loads(line.split(" ", 1)[1])
            if len(secs) != a.warmup + a.steps:
                raise RuntimeError(f"{side}: expected {a.warmup + a.steps} steps, timed {len(secs)}")
            return secs[a.warmup :], workload
    raise RuntimeError(f"{side} worker failed (exit {out.returncode}): {out.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, choices=(1, 2), default=1, help="torch intra-op threads, both sides")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="timed optimizer steps per process")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first steps per process")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--generations", type=int, default=4, help="completions per prompt (GRPO group size)")
    ap.add_argument("--max-tokens", type=int, default=32, help="the most completion tokens")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per worker process")
    ap.add_argument("--worker", choices=("project", "trl"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    for name in ("rounds", "steps", "prompts", "max_tokens"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.warmup < 0 or a.generations < 2:
        ap.error("--warmup must be >= 0 and --generations >= 2 (GRPO compares completions within a group)")
    if a.prompts > len(PROMPTS):
        ap.error(f"--prompts must be at most {len(PROMPTS)}")
    if a.worker:
        result = worker_project(a) if a.worker == "project" else worker_trl(a)
        print("STEP_SECONDS " + json.dumps(result), flush=True)
        return

    from benchmarks.report import RESULTS, save, spread

    load_before = os.getloadavg()
    per_round: dict[str, list[float]] = {"project": [], "trl": []}
    steps: dict[str, list[list[float]]] = {"project": [], "trl": []}
    workloads: dict[str, list[dict[str, float]]] = {"project": [], "trl": []}
    for r in range(a.rounds):
        for side in ("project", "trl"):
            s, w = run_side(side, a)
            steps[side].append(s)
            workloads[side].append(w)
            per_round[side].append(statistics.median(s))
            print(
                f"round {r}: {side} {per_round[side][-1]:.3f} s per step (median of {len(s)}; "
                f"{min(s):.3f}-{max(s):.3f}); {w['completion_tokens_mean']:.1f} completion tokens, reward "
                f"{w['reward_mean']:.3f}; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    load_after = os.getloadavg()
    import trl

    out = {
        "threads": a.threads,
        "omp_wait_policy": "PASSIVE",
        "rounds": a.rounds,
        "timed_steps": a.steps,
        "warmup_steps": a.warmup,
        "prompts": a.prompts,
        "generations": a.generations,
        "max_completion_tokens": a.max_tokens,
        "lr": a.lr,
        "trl_version": trl.__version__,
        "load_before": load_before,
        "load_after": load_after,
        "seconds_per_step": {k: {**spread(v), "per_round": v, "all_steps": steps[k]} for k, v in per_round.items()},
        "workload_per_round": workloads,
        "ratio_project_to_trl": statistics.median(per_round["project"]) / statistics.median(per_round["trl"]),
        "ratio_per_round": [p / t for p, t in zip(per_round["project"], per_round["trl"])],
    }
    for k, v in out["seconds_per_step"].items():
        print(f"{k}: {v['median']:.3f} s per step [{v['min']:.3f}-{v['max']:.3f}] over {a.rounds} rounds")
    rr = out["ratio_per_round"]
    print(
        f"project/TRL: {out['ratio_project_to_trl']:.2f}x (per round {min(rr):.2f}-{max(rr):.2f}); threads "
        f"{a.threads}, OMP_WAIT_POLICY=PASSIVE both; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    path = RESULTS / "trl_compare.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    saved = save("trl_compare", {**previous, f"threads_{a.threads}": out})
    write_raw(__file__, out, outputs=[saved])  # this run's entry only


if __name__ == "__main__":
    main()
