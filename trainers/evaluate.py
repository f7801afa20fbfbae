"""Evaluate a model, or a scripted policy, over an env's tasks.

    python trainers/evaluate.py --env AgentR1/FactChain-v0 --model runs/factchain_sft/model
    python trainers/evaluate.py --env AgentR1/FactChain-v0 --policy oracle --tasks 200
    python trainers/evaluate.py --env AgentR1/HotpotQA-NaiveRAG-v0 --model Qwen/Qwen2.5-3B-Instruct \\
        --env-kwargs '{data_path: data/hotpot_dev_distractor_v1.json}'
    python trainers/evaluate.py --env AgentR1/HotpotQA-NaiveRAG-v0 --model smollm2-135m-instruct \\
        --env-kwargs '{answer_source: text}'
    python trainers/evaluate.py --checkpoint runs/RUN --env-kwargs '{data_path: rows.jsonl}'

``--env-kwargs`` go over a checkpoint's own env settings, so ``data_path`` points a trained agent
at any rows file in the normalized layout (``id, question, answer, aliases, ...``; see the QA
cards); ``--tasks`` beyond the file's rows evaluates them all.

It reports EM, F1, success, turns, tool calls by status and the reward components, and writes
``summary.json`` and ``trajectories.jsonl`` to ``--out``. The paper's two baselines are both
runs of this script: Naive RAG is a model on a ``*-NaiveRAG-v0`` env, and the base tool-call
agent is an untrained (instruct) model on the tool env.

Policies: ``model`` (``--model``, or ``--checkpoint``: an RL run's policy with its env settings),
``oracle`` (the ``oracle`` of the env's ``demonstrations()``: its ``demonstration(task)``), ``wrong`` (calls nothing and answers "none"; a floor).

Decoding (``--decode``, for ``--policy model``): ``greedy`` (the default), ``sample`` (one sample
per turn at ``--temperature``), ``value-guided`` (K = ``--k`` samples per turn, the one the PPO
critic values most; needs ``--checkpoint`` of a PPO run) and ``random-of-k`` (a uniformly random
one of the same K samples: the control with the same sampling cost). See ``trainers.decoding``.

    python trainers/evaluate.py --checkpoint runs/factchain_ppo --eval-set heldout --tasks 64 \\
        --decode value-guided --k 4

The summary adds ``decode/*``: tokens generated (all candidates) and run through the critic per
episode, and the wall time.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import yaml

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.cli_errors import ArgumentParser, check_env_id, command, prog_name, yaml_message
from agent_gym.env_arguments import unknown_env_argument
from agent_gym.factory import EnvFactory
from trainers import plugins
from trainers.config import ConfigDeprecationWarning, ConfigError, ModelConfig, RolloutConfig, from_dict
from trainers.eval_tasks import clamp_tasks
from trainers.integrations.openai_eval import run_cli
from trainers.sft import play

MODEL_CHOICES = (
    "a local model directory (e.g. runs/RUN/model, written by agent-gym-sft), --checkpoint RUN_DIR for an "
    "RL run's policy, tiny, smollm2-135m-instruct, or a hub name such as Qwen/Qwen2.5-3B-Instruct (online)"
)


def env_task_count_probe(env_id: str, env_kwargs: dict[str, Any], tok: Any, tasks: list[int]) -> list[int]:
    """``clamp_tasks`` on one env built with the evaluation's arguments (QA envs share their rows
    and retriever within a process, so the probe costs little)."""
    env = EnvFactory(env_id, env_kwargs, tok).make().unwrapped
    try:
        return clamp_tasks(tasks, env)
    finally:
        env.close()


def scripted_episodes(env_id: str, env_kwargs: dict[str, Any], tasks: list[int], policy: str):
    env = EnvFactory(env_id, env_kwargs).make().unwrapped
    tasks = clamp_tasks(tasks, env)
    oracle = env.demonstrations().get("oracle") if policy == "oracle" else None
    if policy == "oracle" and oracle is None:
        raise SystemExit(
            f"error: {type(env).__name__} has no demonstration(task) (its demonstrations() offers no "
            "'oracle'); use --policy model or wrong"
        )
    rng = np.random.default_rng(0)
    script = (lambda task: oracle(task, rng)) if oracle is not None else (lambda task: ["<answer>none</answer>"])
    return [play(env, k, script) for k in tasks], env.tokenizer


def load_checkpoint_models(path: str | Path):
    """An RL run's checkpoint: (config, tokenizer, policy, critic or None), in eval mode.

    ``path`` is a run directory (its latest checkpoint), a ``checkpoints/iter_*`` directory or
    its ``state.pt``. The policy is rebuilt from the run's config (``init_from`` must still exist)
    and takes the checkpoint's weights; the critic exists for runs that train one (PPO)."""
    from trainers.checkpoint import (  # deferred: torch stays out of `import trainers.evaluate`
        CheckpointError,
        latest_checkpoint,
        load_checkpoint,
    )
    from trainers.models import (  # deferred: torch stays out of `import trainers.evaluate`
        Critic,
        load_policy,
        load_tokenizer_for,
    )

    p = Path(path)
    ckpt = p.parent if p.name == "state.pt" else p if (p / "state.pt").is_file() else latest_checkpoint(p)
    if ckpt is None or not (ckpt / "state.pt").is_file():
        raise SystemExit(
            f"error: --checkpoint {path}: no checkpoint there; pass an RL run directory (with "
            "checkpoints/), a checkpoints/iter_* directory or its state.pt"
        )
    try:
        state = load_checkpoint(ckpt)
    except CheckpointError as e:  # corrupt, partial or unreadable: say which and what to do
        raise SystemExit(
            f"error: --checkpoint {path}: {e}. Pass the run directory to use its newest good "
            "checkpoint, or another checkpoints/iter_* directory"
        ) from None
    cfg = from_dict({**state["config"], "model.device": "cpu"}, str(ckpt / "state.pt"))  # flat (old) or sectioned
    tok = load_tokenizer_for(cfg.model)
    policy = load_policy(cfg.model, tok, seed=cfg.run.seed)
    critic = Critic(policy) if state.get("critic") is not None else None
    if cfg.scale.lora_r > 0:  # a LoRA run saves the adapter-wrapped modules: wrap the same way, load, merge
        from trainers.scale import add_lora  # deferred: torch stays out of `import trainers.evaluate`

        policy = add_lora(policy, cfg.scale)
        if critic is not None:
            critic.backbone = add_lora(critic.backbone, cfg.scale)
    policy.load_state_dict(state["policy"])
    if critic is not None:
        critic.load_state_dict(state["critic"])
        critic.eval()
    if cfg.scale.lora_r > 0:
        policy = policy.merge_and_unload()  # a plain model again: what generation and the backends expect
    return cfg, ckpt, tok, policy.eval(), critic


def model_episodes(
    env_id: str,
    env_kwargs: dict[str, Any],
    tasks: list[int],
    policy: Any,
    tok: Any,
    backend: str,
    max_turn_tokens: int,
    decode: str = "greedy",
    k: int = 1,
    temperature: float = 1.0,
    critic: Any = None,
    seed: int = 0,
    device: str = "cpu",
):
    """Episodes of ``policy`` (on ``device``) on ``tasks``, decoded by ``decode`` (greedy, sample,
    value-guided, random-of-k: see ``trainers.decoding``). Returns the episodes, the tokenizer and
    the cost (``decode/*``: tokens generated and run through the critic per episode, seconds)."""
    from trainers.backends.base import SamplingConfig  # deferred: torch stays out of `import trainers.evaluate`
    from trainers.decoding import BestOfK  # deferred: torch stays out of `import trainers.evaluate`
    from trainers.rollout import collect  # deferred: torch stays out of `import trainers.evaluate`
    from trainers.sources import make_backend  # deferred: torch stays out of `import trainers.evaluate`

    rollout = RolloutConfig(env_id=env_id, env_kwargs=env_kwargs, backend=backend, max_turn_tokens=max_turn_tokens)
    factory = EnvFactory(env_id, env_kwargs, tok, vocab_size=policy.get_input_embeddings().num_embeddings)
    envs = factory.make_vector(len(tasks))
    be = make_backend(rollout, policy, tok, Path(".cache/evaluate"), device=device, seed=seed, lone=True)
    wrapped = (
        BestOfK(be, k, decode, critic, pad_token_id=factory.pad_id) if decode in ("value-guided", "random-of-k") else be
    )
    sampling = SamplingConfig(max_new_tokens=max_turn_tokens, temperature=0.0 if decode == "greedy" else temperature)
    try:
        t0 = time.perf_counter()
        trajs, rt = collect(envs, wrapped, tasks, 1, sampling, seed=seed)
        wall = time.perf_counter() - t0
    finally:
        wrapped.close()
        envs.close()
    n = len(trajs)
    cost = getattr(wrapped, "cost", None)
    gen_tokens = cost.generated_tokens if cost is not None else rt.generated_tokens
    cost_keys = {
        "decode/generated_tokens_per_episode": gen_tokens / n,
        "decode/action_tokens_per_episode": rt.generated_tokens / n,
        "decode/critic_tokens_per_episode": (cost.critic_tokens if cost is not None else 0) / n,
        "decode/wall_s": wall,
        "decode/generate_s": cost.generate_s if cost is not None else rt.generate_s,
        "decode/critic_s": cost.critic_s if cost is not None else 0.0,
        "decode/env_s": rt.env_s,
    }
    return [t.episode for t in trajs], tok, cost_keys


@command  # without argv (the command line): one line and exit 2 on a bad input (agent_gym/cli_errors.py)
def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(
        prog=prog_name("evaluate.py", argv), description="Evaluate a model or a scripted policy on an env."
    )
    ap.add_argument("--env", help="env id (required, unless --checkpoint: then the run's env_id)")
    ap.add_argument("--env-kwargs", default="{}", help="YAML mapping of env arguments (over the checkpoint's)")
    ap.add_argument("--policy", choices=["model", "oracle", "wrong"], default="model")
    ap.add_argument(
        "--model",
        help="HF directory, hub name, 'tiny' or a named model such as smollm2-135m-instruct "
        "(with --policy model; docs/models/smollm2.md)",
    )
    ap.add_argument(
        "--checkpoint",
        help="an RL run directory, checkpoints/iter_* directory or state.pt: its policy "
        "(and critic), env_id and env_kwargs",
    )
    ap.add_argument(
        "--eval-set", help="with --checkpoint: apply the run's eval_sets[NAME] env overrides (e.g. heldout)"
    )
    ap.add_argument(
        "--decode",
        choices=["greedy", "sample", "value-guided", "random-of-k"],
        default="greedy",
        help="greedy; sample (one sample per turn); value-guided (best of --k samples by the critic's "
        "value, needs a PPO checkpoint); random-of-k (a uniformly random one of the same --k samples)",
    )
    ap.add_argument("--k", type=int, default=4, help="candidates per turn for value-guided and random-of-k")
    ap.add_argument("--temperature", type=float, help="sampling temperature (default: the checkpoint's, else 1.0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--tasks", type=int, default=100, help="evaluate tasks 0..N-1")
    ap.add_argument("--max-turn-tokens", type=int, help="default: the checkpoint's max_turn_tokens, else 256")
    ap.add_argument("--out", default="runs/eval")
    plugins.add_argument(ap)
    oa = ap.add_argument_group("OpenAI-compatible server as the policy (agent_gym/integrations/openai_policy.py)")
    oa.add_argument(
        "--openai-base-url",
        help="e.g. http://127.0.0.1:8000/v1: --model names the served model; "
        "the API key is read from OPENAI_API_KEY (none needed locally)",
    )
    oa.add_argument("--concurrency", type=int, default=8, help="episodes at once")
    oa.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    oa.add_argument("--max-retries", type=int, default=4, help="retries of a request (429, 5xx, connection, timeout)")
    oa.add_argument(
        "--openai-same-tokenizer",
        action="store_true",
        help="the server's model uses the env's tokenizer (vLLM): send its stop_token_ids, keep special tokens",
    )
    oa.add_argument("--openai-extra-body", help="YAML mapping of extra request fields for the server")
    args = ap.parse_args(argv)
    warnings.simplefilter("default", ConfigDeprecationWarning)  # an old checkpoint's flat keys: say so
    try:
        plugins.load(args.plugin, "--plugin")  # before any env id or config is looked at
    except ConfigError as e:
        ap.error(str(e))
    if args.env is None and not args.checkpoint:
        ap.error(
            "--env is required (no env is assumed), e.g. --env AgentR1/FactChain-v0; or pass --checkpoint "
            "to use the run's env"
        )
    if args.openai_base_url:
        return run_cli(args, ap)
    from trainers.rollout import summarize  # deferred: torch stays out of `import trainers.evaluate`
    from trainers.sources import episode_record, eval_keys  # deferred: torch stays out of `import trainers.evaluate`

    try:
        env_kwargs = yaml.safe_load(args.env_kwargs) or {}
    except yaml.YAMLError as e:
        ap.error(yaml_message(e, f"--env-kwargs {args.env_kwargs!r}"))
    if not isinstance(env_kwargs, dict):
        ap.error("--env-kwargs must be a YAML mapping, e.g. '{split: test}'")
    if args.k < 1:
        ap.error(f"--k must be at least 1, got {args.k}")
    if args.checkpoint and args.model:
        ap.error("pass --model or --checkpoint, not both")
    if args.eval_set and not args.checkpoint:
        ap.error("--eval-set names one of a run's eval_sets; it needs --checkpoint")
    if args.policy != "model" and (args.checkpoint or args.decode != "greedy"):
        ap.error(f"--policy {args.policy} is scripted: --checkpoint and --decode apply to --policy model")
    if args.env is not None:
        check_env_id(args.env, "--env")  # before a model is loaded for it
        if (why := unknown_env_argument(args.env, env_kwargs)) is not None:
            ap.error(f"--env-kwargs: {why}")
    tasks = list(range(args.tasks))
    summary_extra: dict[str, Any] = {}
    if args.policy == "model":
        critic, env_id, temperature, max_turn = None, args.env, args.temperature, args.max_turn_tokens
        if args.checkpoint:
            cfg, ckpt, tok, policy, critic = load_checkpoint_models(args.checkpoint)
            if args.eval_set is not None and args.eval_set not in cfg.eval.sets:
                ap.error(f"--eval-set {args.eval_set!r}: the run's eval.sets are {sorted(cfg.eval.sets)}")
            env_kwargs = {
                **cfg.rollout.env_kwargs,
                **(cfg.eval.sets[args.eval_set] if args.eval_set else {}),
                **env_kwargs,
            }
            env_id = env_id or cfg.rollout.env_id
            if (why := unknown_env_argument(env_id, env_kwargs)) is not None:
                ap.error(f"the run's env_kwargs with --env-kwargs and --eval-set: {why}")
            temperature = cfg.rollout.temperature if temperature is None else temperature
            max_turn = max_turn or cfg.rollout.max_turn_tokens
            summary_extra = {"checkpoint": str(ckpt), "checkpoint_algo": cfg.algorithm.algo, "eval_set": args.eval_set}
            if args.decode == "value-guided" and critic is None:
                raise SystemExit(
                    f"error: --decode value-guided needs a critic, and the checkpoint {ckpt} has none (its run's "
                    f"adv_estimator {cfg.algorithm.adv_estimator!r} trains no value head; GRPO, RLOO and REINFORCE++ runs "
                    "and SFT models have none). Pass the checkpoint of a PPO run (algo: ppo), or use --decode "
                    "random-of-k or sample with this one."
                )
        elif args.model:
            if args.decode == "value-guided":
                raise SystemExit(
                    f"error: --decode value-guided needs a critic, and --model {args.model} is a policy only (an HF "
                    "model has no value head). Pass --checkpoint with a PPO run directory (its checkpoints/iter_*/"
                    "state.pt holds the critic), or use --decode random-of-k or sample."
                )
            from trainers.models import (  # deferred: torch stays out of `import trainers.evaluate`
                check_model_source,
                load_policy,
                load_tokenizer_for,
            )

            check_model_source(args.model, "--model", choices=MODEL_CHOICES)  # before transformers tries the hub
            mcfg = ModelConfig(name=args.model)
            tok = load_tokenizer_for(mcfg)
            policy = load_policy(mcfg, tok, seed=args.seed).eval()
        else:
            ap.error("--policy model needs --model or --checkpoint")
        temperature = 1.0 if temperature is None else temperature
        if args.decode in ("value-guided", "random-of-k") and args.k > 1 and temperature <= 0:
            ap.error(
                f"--decode {args.decode} with --k {args.k} needs --temperature > 0 (K greedy candidates are the same)"
            )
        k = args.k if args.decode in ("value-guided", "random-of-k") else 1
        tasks = env_task_count_probe(env_id, env_kwargs, tok, tasks)
        episodes, tok, cost = model_episodes(
            env_id,
            env_kwargs,
            tasks,
            policy,
            tok,
            args.backend,
            max_turn or 256,
            args.decode,
            k,
            temperature,
            critic,
            args.seed,
        )
        summary_extra.update(
            {
                "decode": args.decode,
                "k": k,
                "temperature": 0.0 if args.decode == "greedy" else temperature,
                "seed": args.seed,
                **cost,
            }
        )
    else:
        env_id = args.env
        episodes, tok = scripted_episodes(env_id, env_kwargs, tasks, args.policy)
    summary = eval_keys(summarize(episodes))
    summary.update({"env": env_id, "policy": args.policy, "model": args.model, "tasks": len(episodes), **summary_extra})
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
