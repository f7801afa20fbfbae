"""Supervised warm start on scripted demonstrations.

A policy that has never seen the tool-call format almost never emits a well-formed call, so RL
from a random tiny model gets no reward to learn from. A short SFT on demonstrations from
scripted policies teaches the format: the env's scripted policies by name, from its
``demonstrations()`` hook (``ToolEnv``: ``oracle``, the env's ``demonstration(task)``, e.g.
FactChain's ``oracle_turns``; FactChain adds ``protocol`` and ``reversed``), or a weighted mix of them. The CPU demo mixes the oracle with a
demonstrator that makes one systematic mistake (FactChain's ``reversed``), so the warm start
knows the protocol and both behaviours but succeeds well below the RL target, and RL has to
learn which behaviour is rewarded.

The demonstrations go through the env itself, so their tokens, masks and chat-template deltas
are exactly what the policy sees during RL. The loss is the cross-entropy on the agent's tokens
(the env's loss mask).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import yaml

from agent_gym.env_arguments import unknown_env_argument_in
from agent_gym.episode import Episode
from agent_gym.factory import EnvFactory
from trainers.config import ConfigError, EvalConfig, ModelConfig, ScaleConfig, Sectioned, TrainConfig, to_dict
from trainers.logger import RunLogger, claim_run_dir
from trainers.memory_budget import check_fits, host_step_estimate, peak_rss_gib
from trainers.stop_signals import GracefulStop

if TYPE_CHECKING:  # torch loads with the functions that use it: checking an SFTConfig does not import it
    import torch


@dataclass(init=False)
class SFTConfig(Sectioned):
    """The SFT warm start's config: the RL config's ``model`` and ``eval`` sections (``eval.every``
    0: only at the end) and SFT's own keys. Flat model and eval keys (``model: tiny``,
    ``eval_tasks: 64``) still load, with a ``ConfigDeprecationWarning`` (``trainers.config``)."""

    model: ModelConfig
    eval: EvalConfig = field(metadata={"defaults": {"every": 0}})
    scale: ScaleConfig
    """The RL config's memory keys that full fine-tuning uses: ``scale.gradient_checkpointing``,
    ``scale.max_tokens_per_microbatch`` (a batch's gradient accumulated over micro-batches of at most
    that many padded tokens, weighted by their loss tokens: the same step up to float rounding) and
    ``scale.mixed_precision``. ``lora_r`` and ``fsdp`` are refused (SFT fine-tunes every weight in one
    process)."""
    plugins: list[str] = field(default_factory=list)
    """Modules imported before the config is checked (they may register the env)."""
    run_dir: str = "runs/sft"
    overwrite: bool = False
    """As the RL trainer's ``run.overwrite``: a run_dir that already holds a run (its metrics, model
    or final.json) is refused unless this is true, which removes that run's files first."""
    seed: int = 0
    env_id: str | None = None
    """Required: the env whose demonstrations are played (no env is assumed)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    num_demos: int = 2000
    steps: int = 100
    batch_size: int = 32
    lr: float = 3e-3
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """``cosine`` decays the learning rate from ``lr`` to 0 over ``steps`` (after the warmup)."""
    warmup_steps: int = 0
    """Linear warmup from 0 to ``lr`` over this many steps."""
    max_turn_tokens: int = 64
    demo_policy: str | dict[str, float] = "oracle"
    """Which scripted policy writes the demonstrations: a name in the env's ``demonstrations()``
    (``ToolEnv``: ``oracle``, the env's ``demonstration(task)``; FactChain also offers ``protocol``,
    correct calls with random relations, and ``reversed``, the relations looked up in reverse
    order). A mapping ``{name: weight}`` mixes policies: each demonstration's policy is drawn with
    those weights (e.g. ``{oracle: 0.3, reversed: 0.7}``, an imperfect demonstrator)."""

    RENAMED: ClassVar[dict[str, tuple[str, str]]] = TrainConfig.RENAMED

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scale.lora_r or self.scale.fsdp:
            raise ConfigError(
                "SFT fine-tunes every weight in one process: scale.lora_r and scale.fsdp are RL keys; remove them "
                "(scale.gradient_checkpointing, scale.max_tokens_per_microbatch and scale.mixed_precision apply)"
            )
        if not self.env_id:
            raise ConfigError("env_id is required (no env is assumed): a Gymnasium id such as AgentR1/FactChain-v0")
        for name in ("num_demos", "steps", "batch_size", "max_turn_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ConfigError(f"warmup_steps must be in 0..steps ({self.steps}), got {self.warmup_steps}")
        if isinstance(self.demo_policy, dict) and (
            not self.demo_policy or any(w < 0 for w in self.demo_policy.values()) or sum(self.demo_policy.values()) <= 0
        ):
            raise ConfigError(
                f"demo_policy: a mix needs non-negative weights with a positive sum, got {self.demo_policy!r}"
            )


def lr_factor(cfg: SFTConfig, step: int) -> float:
    """The multiplier of ``cfg.lr`` at optimizer step ``step`` (0-based): linear warmup, then
    constant or cosine decay to 0 at ``cfg.steps`` (``trainers.trainer.lr_multiplier``)."""
    from trainers.trainer import lr_multiplier  # deferred: torch stays out of `import trainers.sft`

    return lr_multiplier(step, cfg.warmup_steps, cfg.lr_schedule, cfg.steps)


def demo_policy(env: Any, name: str, rng: np.random.Generator):
    """The scripted policy ``name`` of ``env`` (from its ``demonstrations()``) as a function
    ``task -> assistant turns``."""
    policies = env.demonstrations()
    if name not in policies:
        if not policies:
            raise ValueError(
                f"{type(env).__name__} offers no scripted policy (its demonstrations() is empty: define "
                "demonstration(task), or override demonstrations()); SFT needs one"
            )
        raise ValueError(
            f"demo_policy {name!r}: {type(env).__name__}.demonstrations() has no {name!r}; "
            f"available: {sorted(policies)}"
        )
    policy = policies[name]
    return lambda task: policy(task, rng)


def play(env: Any, task_index: int, script: Any) -> Episode:
    """Play task ``task_index`` of ``env`` with a scripted policy (``task -> assistant turns``,
    each turn's text encoded and closed with the end-of-turn token); return the env's ``Episode``."""
    env.reset(options={"task_index": int(task_index)})
    for text in script(env.task):
        *_, terminated, truncated, info = env.step(env.encode_turn(text))
        if terminated or truncated:
            return info["trajectory"]
    raise ValueError(f"the scripted policy ended task {task_index} of {type(env).__name__} before the episode ended")


def demonstrations(
    env: Any, task_indices: list[int], policy: str | dict[str, float] = "oracle", rng: np.random.Generator | None = None
) -> list[Episode]:
    """Run a scripted policy on each task; return the env's episodes (ids + loss masks).

    ``policy`` is one policy's name, or a mix ``{name: weight}``: each task's policy is then
    drawn from ``rng`` with those weights (normalized)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    mix = policy if isinstance(policy, dict) else {policy: 1.0}
    names = sorted(mix)
    demos = [demo_policy(env, n, rng) for n in names]
    weights = np.asarray([mix[n] for n in names], dtype=float)
    picks = (
        rng.choice(len(names), size=len(task_indices), p=weights / weights.sum())
        if len(names) > 1
        else np.zeros(len(task_indices), dtype=int)
    )  # one policy: leave rng's stream as it was
    return [play(env, k, demos[pick]) for k, pick in zip(task_indices, picks)]


def sft_loss(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the tokens under ``mask`` (B, T), predicted from their prefixes."""
    from trainers.models import token_logprobs  # deferred: torch stays out of `import trainers.sft`

    lp, _ = token_logprobs(model, ids, attn, loss_mask=mask)  # (B, T), scored under the mask only
    return -(lp * mask).sum() / mask.sum().clamp(min=1)


def episodes_loss(model: torch.nn.Module, rows: list[Episode], pad_id: int) -> torch.Tensor:
    """``sft_loss`` of a batch of episodes (right-padded): each one's agent tokens, under its loss mask."""
    import torch  # deferred: torch stays out of `import trainers.sft`

    from trainers.rollout import pad_rows  # deferred: torch stays out of `import trainers.sft`

    ids = pad_rows([r.token_ids for r in rows], pad_id, torch.long)  # (B, T)
    attn = pad_rows([[1] * len(r.token_ids) for r in rows], 0, torch.long)  # (B, T)
    mask = pad_rows([r.loss_mask for r in rows], 0.0, torch.float32)  # (B, T)
    return sft_loss(model, ids, attn, mask)


def episodes_backward(
    model: torch.nn.Module, rows: list[Episode], pad_id: int, scale: ScaleConfig, device: str = "cpu"
) -> float:
    """Accumulate the gradient of ``episodes_loss(rows)`` in micro-batches of at most
    ``scale.max_tokens_per_microbatch`` padded tokens (``trainers.scale.pack_by_tokens``), each
    weighted by its share of the batch's loss tokens, under ``scale.mixed_precision``; returns the
    batch's loss. One micro-batch (no budget) is the plain ``episodes_loss(rows).backward()``."""
    from trainers.scale import autocast, pack_by_tokens  # deferred: torch stays out of `import trainers.sft`

    groups = pack_by_tokens([len(r.token_ids) for r in rows], scale.max_tokens_per_microbatch)
    total = sum(sum(r.loss_mask) for r in rows)
    loss_sum = 0.0
    for g in groups:
        part = [rows[i] for i in g]
        weight = sum(sum(r.loss_mask) for r in part) / total if total > 0 else 1.0 / len(groups)
        with autocast(scale.mixed_precision, device):
            loss = episodes_loss(model, part, pad_id)
        (loss * weight).backward()
        loss_sum += float(loss.detach()) * weight
    return loss_sum


def sft_memory_estimate(model: torch.nn.Module, demos: list[Episode], cfg: SFTConfig) -> dict[str, float]:
    """``host_step_estimate`` of the worst step: a batch of the ``batch_size`` longest
    demonstrations, its largest micro-batch (``scale.max_tokens_per_microbatch``)."""
    from trainers.scale import pack_by_tokens  # deferred: torch stays out of `import trainers.sft`

    longest = sorted(demos, key=lambda d: -len(d.token_ids))[: cfg.batch_size]
    groups = pack_by_tokens([len(d.token_ids) for d in longest], cfg.scale.max_tokens_per_microbatch)
    padded = lambda g: len(g) * len(longest[g[0]].token_ids)  # noqa: E731  # a group's first row is its longest
    worst = max(groups, key=padded)
    tokens = padded(worst)
    scored = int(sum(sum(longest[i].loss_mask) for i in worst))
    return host_step_estimate(model, tokens, scored, cfg.scale.gradient_checkpointing)


def check_env_arguments(cfg: SFTConfig) -> None:
    """``ConfigError`` naming the first key of ``env_kwargs``, ``eval.env_kwargs`` or an ``eval.sets``
    entry that the built-in env does not take (``agent_gym.env_arguments.unknown_env_argument``),
    before any demonstration is made or model loaded."""
    places = {"env_kwargs": cfg.env_kwargs, "eval.env_kwargs": cfg.eval.env_kwargs}
    places |= {f"eval.sets.{name}": kw for name, kw in cfg.eval.sets.items()}
    why = unknown_env_argument_in(cfg.env_id, places)
    if why is not None:
        raise ConfigError(why)


def run_sft(cfg: SFTConfig) -> dict[str, float]:
    import torch  # deferred: torch stays out of `import trainers.sft`

    from trainers.backends.base import SamplingConfig  # deferred: torch stays out of `import trainers.sft`
    from trainers.backends.hf_backend import HFBackend  # deferred: torch stays out of `import trainers.sft`
    from trainers.models import (  # deferred: torch stays out of `import trainers.sft`
        load_policy,
        load_tokenizer_for,
        save_policy,
    )
    from trainers.scale import prepare_process  # deferred: torch stays out of `import trainers.sft`
    from trainers.sources import evaluate_greedy  # deferred: torch stays out of `import trainers.sft`

    torch.manual_seed(cfg.seed)
    prepare_process(cfg.model, cfg.scale)  # model.torch_threads was ignored by SFT before
    run_dir = Path(cfg.run_dir)
    claim_run_dir(run_dir, overwrite=cfg.overwrite, key="overwrite", resumable=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    tok = load_tokenizer_for(cfg.model)
    model = load_policy(cfg.model, tok, seed=cfg.seed)
    if cfg.scale.gradient_checkpointing:
        from trainers.scale import enable_checkpointing  # deferred: torch stays out of `import trainers.sft`

        enable_checkpointing(model)
    envs = EnvFactory(cfg.env_id, cfg.env_kwargs, tok, vocab_size=model.get_input_embeddings().num_embeddings)
    env = envs.make().unwrapped
    rng = np.random.default_rng(cfg.seed)
    demos = demonstrations(
        env, rng.choice(env.num_tasks(), size=cfg.num_demos, replace=False).tolist(), cfg.demo_policy, rng
    )
    estimate = sft_memory_estimate(model, demos, cfg)
    if cfg.scale.memory_check and str(cfg.model.device) == "cpu":
        check_fits(
            estimate,
            f"SFT of {cfg.model.name} at batch_size {cfg.batch_size}",
            "scale.gradient_checkpointing=true, scale.max_tokens_per_microbatch (e.g. 2048) or a smaller batch_size",
        )
    eval_envs = envs.make_vector(cfg.eval.tasks, **cfg.eval.env_kwargs)
    eval_sets = {name: envs.make_vector(cfg.eval.tasks, **kw) for name, kw in cfg.eval.sets.items()}
    pad_id = envs.pad_id
    backend = HFBackend(model, pad_token_id=pad_id, tokenizer=tok)
    logger = RunLogger(run_dir, cfg.steps, tensorboard=False, progress_bar=False)
    greedy = SamplingConfig(max_new_tokens=cfg.max_turn_tokens, temperature=0.0)

    def evaluate() -> dict[str, float]:
        model.eval()
        model.zero_grad(set_to_none=True)  # the next step starts from none anyway: no gradients beside the KV cache
        return evaluate_greedy(eval_envs, eval_sets, backend, greedy, cfg.eval.tasks, cfg.seed)

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(cfg, step))
    t0 = time.perf_counter()
    stop = GracefulStop("finishing this step, then the final evaluation, and saving the model").install()
    steps_done = 0
    try:
        for step in range(cfg.steps):
            if stop.requested:
                break
            model.train()
            opt.zero_grad(set_to_none=True)
            batch = [demos[i] for i in rng.choice(len(demos), size=cfg.batch_size)]
            loss = episodes_backward(model, batch, pad_id, cfg.scale, cfg.model.device)
            opt.step()
            metrics = {
                "sft/loss": loss,
                "memory/peak_rss_gib": peak_rss_gib(),
                "memory/estimate_gib": estimate["total"],
                "sft/lr": sched.get_last_lr()[0],
                "time/elapsed_min": (time.perf_counter() - t0) / 60,
            }
            sched.step()
            if cfg.eval.every and step % cfg.eval.every == 0:
                metrics.update(evaluate())
                print(f"step {step}: loss {loss:.3f} eval success {metrics['eval/success_rate']:.3f}", flush=True)
            logger.log(step, metrics)
            steps_done = step + 1
    finally:
        stop.restore()  # a signal during the final evaluation and the saving quits at once, as before
    if stop.requested and steps_done == 0:
        logger.close()
        raise KeyboardInterrupt("stopped before the first step: no model to save")
    train_peak = peak_rss_gib()
    # The optimizer's moments (twice the weights under full fine-tuning) are not needed past the
    # last step and are not saved: freed before the final evaluation, whose KV cache would otherwise
    # sit on top of them and make the run's peak (3.66 GiB against 2.92 for the steps, QA SFT).
    del opt, sched
    final = {"sft/loss": loss, **evaluate(), "time/elapsed_min": (time.perf_counter() - t0) / 60}
    eval_peak = peak_rss_gib()
    save_policy(model, tok, run_dir / "model")
    final.update(
        {
            "memory/peak_rss_gib": peak_rss_gib(),  # the whole run's, evaluation and saving included
            "memory/train_peak_rss_gib": train_peak,
            "memory/eval_peak_rss_gib": eval_peak,
            "memory/estimate_gib": estimate["total"],
            "sft/steps_done": steps_done,  # below cfg.steps when stopped by Ctrl-C or SIGTERM
        }
    )
    logger.log(steps_done, final)
    (run_dir / "final.json").write_text(json.dumps(final, indent=2))
    logger.close()
    for envs in [eval_envs, *eval_sets.values()]:
        envs.close()
    return final
