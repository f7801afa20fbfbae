"""The RL trainer: ``rollout -> score -> advantages -> update -> log -> checkpoint``.

One loop serves PPO (GAE with a critic), GRPO, RLOO and REINFORCE++: the algorithm is the
advantage estimator's name (a registry in ``trainers.algos``), and whether a critic exists
follows from it. There is no per-algorithm branch inside the loop.

The loop is given its parts instead of being subclassed (``trainers.compose`` picks them from the
config and builds the trainer; this module imports none of them):

- a *rollout source* (``trainers.sources.RolloutSource``): where trajectories come from and where
  the greedy evaluation runs. ``LocalRollout``: the lockstep rollout in this process;
  ``trainers.ray_rollout.RayRollout``: Ray actors (``rollout.workers: N``);
  ``trainers.rollout_async.AsyncRollout``: ``rollout.mode: async``;
  ``trainers.multiagent.TeamRollout``: a multi-agent id's team envs;
- a *parallelism strategy* (``trainers.parallel.Parallelism``): ``SingleProcess``, or
  ``trainers.distributed.FSDP`` under torchrun (``scale.fsdp: true``): sharding, this process's share of
  the tasks and rows, gathering, metric reduction, full-parameter contexts, the main process;
- an *overlap* part, or none: ``trainers.sources.Prefetching`` (``rollout.max_staleness: 1``) wraps
  the source, so that the next iteration's rollout runs while this one trains; the loop is the same.

Determinism: everything random in iteration ``i`` (the tasks, the sampling seeds, the minibatch
order) is derived from ``(seed, i)``, so a run resumed from a checkpoint repeats exactly what
the uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import yaml

import agent_gym  # noqa: F401  (registers the env ids)
from agent_gym.factory import EnvFactory
from trainers import algos, scale
from trainers.backends.base import SamplingConfig
from trainers.checkpoint import CheckpointError, load_latest_checkpoint, save_checkpoint, set_rng_state
from trainers.config import TrainConfig, to_dict
from trainers.gc_stats import GcStats
from trainers.logger import NullLogger, RunLogger, claim_run_dir
from trainers.memory_budget import (
    MemoryBudgetError,
    MemoryBudgetWarning,
    check_fits,
    peak_rss_gib,
    resident_metrics,
    rl_step_estimate,
)
from trainers.models import Critic, load_policy, load_tokenizer_for, token_logprobs, trains_with_shared_prefix
from trainers.parallel import Parallelism
from trainers.phases import PhaseTimes
from trainers.rollout import LENGTH_CUTS, EngineRestarts, RolloutBatch, Trajectory, build_batch, summarize
from trainers.sources import RolloutSource, derive_seed, episode_record, make_backend
from trainers.stop_signals import GracefulStop


class NonFiniteLossError(RuntimeError):
    pass


def env_factory(cfg: TrainConfig, tokenizer: Any, vocab_size: int) -> EnvFactory:
    """The run's one env factory: its env id and kwargs, the policy's tokenizer and vocabulary, and
    ``env_server`` (remote rollout envs) when set."""
    r = cfg.rollout
    return EnvFactory(
        r.env_id,
        r.env_kwargs,
        tokenizer,
        vocab_size=vocab_size,
        num_threads=r.num_envs_threads,
        server=r.env_server,
        server_reconnect_s=r.env_server_reconnect_s,
    )


def with_advantages(
    records: list[dict[str, Any]],
    logged: Sequence[Trajectory],
    trained: Sequence[Trajectory],
    batch: RolloutBatch | None,
) -> list[dict[str, Any]]:
    """``records`` (of the trajectories ``logged``) with ``advantages``: each token's advantage in the
    update, on the agent's tokens (0 elsewhere), for the viewer's colours (docs/viewer.md). A
    trajectory the update did not train on (a group dynamic sampling dropped) gets none."""
    if batch is None or batch.advantages is None:
        return records
    row = {id(t): i for i, t in enumerate(trained)}
    for rec, t in zip(records, logged):
        i = row.get(id(t))
        if i is not None:
            n = len(t.episode.token_ids)
            adv = (batch.advantages[i, :n] * batch.loss_mask[i, :n]).tolist()
            rec["advantages"] = [round(float(a), 6) for a in adv]
    return records


class Trainer:
    """The loop (the module docstring), given its parts: ``rollout``, a ``RolloutSource`` class (built
    in ``setup``); ``parallel``, a ``Parallelism`` instance; ``overlap``, a wrapper of the built source
    (``trainers.sources.Prefetching``) or None. ``trainers.compose.build_trainer(cfg)`` picks them from
    the config and refuses the combinations no parts run."""

    def __init__(
        self, cfg: TrainConfig, resume: bool = False, *, rollout: Any, parallel: Parallelism, overlap: Any = None
    ):
        self.cfg = cfg
        self.rollout_cls = rollout
        self.parallel: Parallelism = parallel
        self.overlap = overlap
        self.run_dir = Path(cfg.run.run_dir)
        self.resume = resume
        self.start_iteration = 0
        self._stop = False
        self._iteration = 0
        """The iteration whose rollout was asked for last (``rollout``)."""
        self._kl_reward_metrics: dict[str, Any] = {}
        self._is_metrics: dict[str, float] = {}
        self._mismatch_parts: list[torch.Tensor] = []  # old_from_update: |old - sampler| on agent tokens
        self._overlong_metrics: dict[str, float] = {}
        self._overlong_rows = torch.zeros(0, dtype=torch.bool)
        self.gc_stats: GcStats | None = None
        self.memory_estimate: float | None = None  # GiB, set up by _check_memory (CPU runs)
        self.phases = PhaseTimes()  # time/<phase>_s, taken once per iteration
        self.version = 0
        """The learner's weight version: the number of updates made (the start iteration after --resume)."""

    # -- setup ---------------------------------------------------------------------------------

    def _check_memory(self) -> float | None:
        """The estimated peak (GiB) of an update on the CPU at its worst (``rl_step_estimate``); None
        on a GPU or where the env's context bound is unknown. With ``scale.memory_check``, when it
        exceeds the memory available: refused at start where ``scale.max_tokens_per_microbatch``
        bounds the micro-batch; without a budget the micro-batch is the whole minibatch, whose size
        depends on how long the episodes turn out (most end far below the context bound), so the
        worst case is a warning that names the budget key instead."""
        cfg = self.cfg
        if str(cfg.model.device) != "cpu" or cfg.scale.fsdp:
            return None
        critic = self.critic.backbone if self.critic is not None else None
        est = rl_step_estimate(cfg, self.policy, critic, reference_copy=self.ref is not None and cfg.scale.lora_r == 0)
        if est is None:
            return None
        if cfg.scale.memory_check:
            what = f"an update of {cfg.model.name} ({cfg.algorithm.minibatch_size} episodes a minibatch)"
            keys = (
                "scale.max_tokens_per_microbatch (e.g. 4096), scale.gradient_checkpointing=true, scale.lora_r, "
                "a smaller algorithm.minibatch_size or the env's max_context_tokens"
            )
            try:
                check_fits(est, what, keys)
            except MemoryBudgetError as e:
                if cfg.scale.max_tokens_per_microbatch is not None:
                    raise
                warnings.warn(
                    f"{e} (A warning, not a refusal: without scale.max_tokens_per_microbatch this is every episode "
                    "at the env's context bound.)",
                    MemoryBudgetWarning,
                    stacklevel=2,
                )
        return est["total"]

    def setup(self) -> None:
        cfg = self.cfg
        self.parallel.start()
        torch.manual_seed(cfg.run.seed)
        scale.prepare_process(cfg.model, cfg.scale)
        if self.parallel.is_main and not self.resume:
            claim_run_dir(self.run_dir, overwrite=cfg.run.overwrite, key="run.overwrite", resumable=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.parallel.is_main:
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        self.tokenizer = load_tokenizer_for(cfg.model)
        self.policy = load_policy(cfg.model, self.tokenizer, seed=cfg.run.seed)
        self.critic = Critic(self.policy).to(cfg.model.device) if cfg.algorithm.uses_critic else None
        self.policy, self.critic, self.ref = scale.prepare_models(cfg, self.policy, self.critic)
        if self.critic is not None:
            self.critic.share_prefix = cfg.scale.share_prefix
        if cfg.scale.share_prefix and not self.update_share_prefix and self.parallel.is_main:
            warnings.warn(
                "scale.share_prefix: this model's decoder layers are not transformers' gradient-checkpointing "
                "layers, so under scale.gradient_checkpointing its update runs every row at full length "
                "(micro-batches packed by scale.max_tokens_per_microbatch alone); scoring still shares the prompt",
                stacklevel=2,
            )
        self.parallel.shard(self.policy, self.critic, self.ref)
        self.memory_estimate = self._check_memory()  # before any engine, worker or env starts
        a = cfg.algorithm
        self.opt = torch.optim.AdamW(scale.trainable(self.policy), lr=a.lr, weight_decay=a.weight_decay, eps=a.adam_eps)
        self.critic_opt = (
            torch.optim.AdamW(scale.trainable(self.critic), lr=a.critic_lr, weight_decay=a.weight_decay, eps=a.adam_eps)
            if self.critic is not None
            else None
        )
        warm = lambda step: lr_multiplier(step, a.warmup_steps)  # noqa: E731
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, warm)
        self.critic_sched = torch.optim.lr_scheduler.LambdaLR(self.critic_opt, warm) if self.critic_opt else None
        self.env_factory = env_factory(cfg, self.tokenizer, self.policy.get_input_embeddings().num_embeddings)
        self.pad_id = self.env_factory.pad_id
        learner = self.rollout_cls.learner_backend  # e.g. "hf" under Ray workers: the learner only evaluates
        rollout = dataclasses.replace(cfg.rollout, backend=learner) if learner else cfg.rollout
        # An overlapped rollout samples while the learner trains: an in-process HF sampler then gets
        # its own copy of the policy (weights copied in between rollouts), not the module itself.
        own_copy = self.overlap is not None and learner is None and rollout.backend == "hf"
        sampler = copy.deepcopy(self.policy).eval().requires_grad_(False) if own_copy else self.policy
        self.backend = make_backend(
            rollout,
            sampler,
            self.tokenizer,
            self.run_dir,
            device=cfg.model.device,
            seed=cfg.run.seed,
            lone=self.overlap is None,  # lockstep: nothing else runs while the engine generates
        )
        source = self.rollout_cls(
            cfg, env_factory=self.env_factory, policy=self.policy, backend=self.backend, parallel=self.parallel
        )
        self.source: RolloutSource = (
            self.overlap(source, ahead=self.following_request) if self.overlap is not None else source
        )
        self.num_tasks = self.source.num_tasks
        r, run = cfg.rollout, cfg.run
        self.sampling = SamplingConfig(max_new_tokens=r.max_turn_tokens, temperature=r.temperature, top_p=r.top_p)
        self.logger = (
            RunLogger(
                self.run_dir,
                run.iterations,
                run.tensorboard,
                run.wandb,
                run.progress_bar,
                to_dict(cfg),
                mlflow=run.mlflow,
            )
            if self.parallel.is_main
            else NullLogger()
        )
        if self.resume:
            self._restore()
        self.t_start = time.perf_counter()
        self._graceful = GracefulStop(
            "finishing this iteration and saving a checkpoint", on_request=lambda: setattr(self, "_stop", True)
        ).install()

    @property
    def update_share_prefix(self) -> bool:
        """Whether the update's forwards share a group's prompt (``scale.share_prefix``): not where
        gradient checkpointing rules it out for this decoder (``trains_with_shared_prefix``); then its
        micro-batches are packed and counted as plain ones (the scoring passes, run without
        checkpointing, still share). Decided on first use, from the unsharded policy in ``setup``."""
        share = getattr(self, "_update_share_prefix", None)
        if share is None:
            share = self._update_share_prefix = self.cfg.scale.share_prefix and trains_with_shared_prefix(
                self.policy, self.cfg.scale.gradient_checkpointing
            )
        return share

    # -- the loop ------------------------------------------------------------------------------

    def train(self) -> dict[str, float]:
        cfg = self.cfg
        last: dict[str, float] = {}
        self.gc_stats = GcStats(freeze=cfg.run.gc_freeze)  # after set-up: freezes what set-up built
        self.engine_restarts = EngineRestarts(self.backend)  # an in-process engine's; Ray workers' come from the source
        self.phases = PhaseTimes()  # from zero: set-up and a resume's restore are not an iteration's
        self.version = self.start_iteration
        for it in range(self.start_iteration, cfg.run.iterations):
            t0 = time.perf_counter()
            trajs, rt, version, waited = self.next_rollout(it)
            sampled = trajs
            dyn_metrics: dict[str, float] = {}
            if cfg.algorithm.dynamic_sampling:
                trajs, rt, dyn_metrics = self.dynamic_sample(it, trajs, rt)
            t_fb = time.perf_counter()
            if trajs:
                with self.phases("score"):
                    batch = self.score(trajs)
                with self.phases("advantages"):
                    adv_metrics = self.compute_advantages(batch)
                update_metrics = self.update(batch, it)
            else:  # every group dropped and the refill cap spent: nothing to train on
                batch, adv_metrics, update_metrics = (
                    None,
                    {},
                    {"update/skipped": 1.0, "policy/loss": 0.0, "policy/total_loss": 0.0},
                )
            t_fb = time.perf_counter() - t_fb
            staleness = self.version - version  # the weights that sampled the batch, against the ones it updated
            self.version += 1
            with self.phases("sync"):
                self.sync_weights()  # an overlap part holds the weights until no rollout is in flight
            metrics = {
                **summarize(sampled),
                **self.source.metrics(),
                **dyn_metrics,
                **adv_metrics,
                **update_metrics,
                **(self.mismatch(batch) if batch is not None else {}),
                "train/old_from_update": float(batch is not None and batch.old_logprobs is None),
                "rollout/policy_version": float(version),
                "rollout/staleness_mean": float(staleness),
                "rollout/staleness_max": float(staleness),
            }
            if (it + 1) % cfg.eval.every == 0 or it == cfg.run.iterations - 1 or it == 0:
                with self.phases("eval"):
                    metrics.update(self.evaluate())
            total = time.perf_counter() - t0
            metrics.update(self.timing(rt, t_fb, total))
            metrics.update(self.phases.take())
            metrics["time/rollout_wait_s"] = waited
            metrics.update(self.gc_stats.take())
            metrics.update(self.engine_restarts.take())
            with self.phases("log"):
                self.logger.log(it, metrics)
                logged = sampled[: cfg.run.log_trajectories]
                self.logger.log_trajectories(
                    it,
                    with_advantages(
                        self.trajectory_records(logged, policy_version=version, staleness=staleness),
                        logged,
                        trajs,
                        batch,
                    ),
                )
            last = metrics
            if (it + 1) % cfg.run.checkpoint_every == 0 or it == cfg.run.iterations - 1 or self.should_stop(metrics):
                with self.phases("checkpoint"):
                    self.checkpoint(it)
            if self.should_stop(metrics):
                break
        return last

    def cleanup(self) -> None:
        # First the source (Ray workers shut down, envs closed; an overlap part first waits for the
        # rollout in flight, never killing it mid-episode), then the backend it may still be using.
        # After a setup that stopped part-way (a refusal, a failed engine start) only what was
        # built is closed.
        for name in ("source", "gc_stats", "logger", "backend", "parallel"):
            part = getattr(self, name, None)
            if part is not None:
                part.close()
        if getattr(self, "_graceful", None) is not None:
            self._graceful.restore()

    # -- steps ---------------------------------------------------------------------------------

    def task_indices(self, it: int) -> list[int]:
        """The data cursor: a fresh permutation of the task indices per epoch, from (seed, epoch)."""
        per = self.cfg.rollout.tasks_per_iter
        start = it * per
        out = []
        while len(out) < per:
            epoch, offset = divmod(start + len(out), self.num_tasks)
            order = np.random.default_rng([self.cfg.run.seed, epoch]).permutation(self.num_tasks)
            out.extend(order[offset : offset + per - len(out)].tolist())
        return out

    def request(self, it: int) -> tuple[tuple, dict[str, Any]]:
        """The arguments of the source's ``collect`` for iteration ``it``: this process's share of the
        tasks, the group size, the sampling, the iteration's seed, the share's offset (and the
        scaffold's reset options when the run anneals it)."""
        gs = self.cfg.rollout.group_size
        tasks, offset = self.parallel.share(self.task_indices(it), gs)
        args = (tasks, gs, self.sampling, derive_seed(self.cfg.run.seed, it))
        return args, {"offset": offset, **self.reset_options(it)}

    def following_request(self) -> tuple[tuple, dict[str, Any]] | None:
        """The ``request`` of the iteration after the one asked for last, or None when there is none
        (the last iteration, or the run is stopping): what an overlap part collects ahead."""
        it = self._iteration + 1
        return None if it >= self.cfg.run.iterations or self._stop else self.request(it)

    def rollout(self, it: int) -> tuple[list[Trajectory], Any]:
        """The iteration's trajectories: this process's share of the tasks from the rollout source
        (generated under the policy's full parameters), then every process's, in process order."""
        self.policy.eval()
        self._iteration = it
        args, kwargs = self.request(it)
        with self.parallel.full_params(self.policy):
            trajs, rt = self.source.collect(*args, **kwargs)
        return self.parallel.gather_rollout(trajs, rt)

    def reset_options(self, it: int) -> dict[str, Any]:
        """``{"reset_options": ...}`` for the source's ``collect`` when the run anneals the scaffold
        (``rollout.scaffold_drop``: iteration ``it``'s drop probability), else ``{}`` (a source
        written before the keyword is called as before)."""
        drop = self.cfg.rollout.scaffold_drop
        if drop is None:
            return {}
        frac = min(it / max(self.cfg.run.iterations - 1, 1), 1.0)
        return {"reset_options": {"scaffold_drop_prob": float(drop[0] + (drop[1] - drop[0]) * frac)}}

    def next_rollout(self, it: int) -> tuple[list[Trajectory], Any, int, float]:
        """Iteration ``it``'s trajectories, the weight version that sampled them and the seconds the
        learner waited for them. A source that samples ahead (the overlap part ``Prefetching``) says
        by how many updates its batch is behind the learner (``staleness``); another samples the
        weights of the last ``sync_weights``."""
        t0 = time.perf_counter()
        trajs, rt = self.rollout(it)
        version = self.version - getattr(self.source, "staleness", 0)
        return trajs, rt, version, time.perf_counter() - t0

    def dynamic_sample(
        self, it: int, trajs: list[Trajectory], rt: Any
    ) -> tuple[list[Trajectory], Any, dict[str, float]]:
        """``algorithm.dynamic_sampling``: drop the groups of ``trajs`` without a reward spread, then
        refill from further rounds, each one batch of fresh tasks (the rollout's vector env is one
        batch wide, and DAPO samples whole batches too), drawn from ``(seed, it, round)`` among the
        tasks not yet used this iteration, until ``tasks_per_iter`` groups have a spread or the
        extra-episode cap (rounded down to whole batches) is spent. The kept groups are renumbered
        0.. in the order they were sampled; past ``tasks_per_iter`` the later ones are left out.
        Metrics: ``dynamic/dropped_groups`` (of every group sampled), ``dynamic/extra_episodes``,
        ``dynamic/rounds``, ``dynamic/kept_groups``, ``dynamic/short_groups`` (how many groups fewer
        than ``tasks_per_iter`` the update trains on, the cap being spent)."""
        cfg, r = self.cfg, self.cfg.rollout
        want = r.tasks_per_iter
        cap = cfg.algorithm.dynamic_sampling_max_extra
        max_rounds = (r.batch_size if cap is None else cap) // r.batch_size
        kept, dropped = keep_spread_groups(trajs, self.pad_id)
        used = set(self.task_indices(it))
        rounds = 0
        while len(kept) < want and rounds < max_rounds:
            rng = np.random.default_rng([cfg.run.seed, it, 1 + rounds])
            tasks = [int(t) for t in rng.permutation(self.num_tasks) if int(t) not in used][:want]
            if len(tasks) < want:  # fewer fresh tasks than a batch: the rest repeats used ones
                tasks += [int(t) for t in rng.permutation(self.num_tasks)[: want - len(tasks)]]
            used.update(tasks)
            self.policy.eval()
            with self.parallel.full_params(self.policy):
                more, rt2 = self.source.collect(
                    tasks,
                    r.group_size,
                    self.sampling,
                    derive_seed(cfg.run.seed, it, 2, rounds),
                    **self.reset_options(it),
                )
            rt = _add_times(rt, rt2)
            rounds += 1
            new_kept, new_dropped = keep_spread_groups(more, self.pad_id)
            kept += new_kept
            dropped += new_dropped
        kept = kept[:want]
        out = [dataclasses.replace(tr, group=i) for i, grp in enumerate(kept) for tr in grp]
        return (
            out,
            rt,
            {
                "dynamic/dropped_groups": float(dropped),
                "dynamic/extra_episodes": float(rounds * r.batch_size),
                "dynamic/rounds": float(rounds),
                "dynamic/kept_groups": float(len(kept)),
                "dynamic/short_groups": float(want - len(kept)),
            },
        )

    @torch.no_grad()
    def score(self, trajs: list[Trajectory]) -> RolloutBatch:
        cfg = self.cfg
        batch = build_batch(trajs, self.pad_id)
        if not cfg.algorithm.use_action_mask:
            # Ablation: everything after the prompt (env tokens included) is under the loss.
            pos = torch.arange(batch.input_ids.shape[1])[None, :]  # (1, T)
            prompt = torch.tensor([t.episode.prompt_len for t in trajs])[:, None]  # (B, 1)
            batch.loss_mask = ((pos >= prompt) & (batch.attention_mask > 0)).float()
        self._overlong_metrics, self._overlong_rows = overlong_shaping(batch, trajs, cfg.algorithm)
        # Built on the CPU from the episodes; scored and trained where the models are.
        return self.score_batch(batch.to(cfg.model.device))

    @torch.no_grad()
    def score_batch(self, batch: RolloutBatch) -> RolloutBatch:
        """Old and reference log-probs and values of a built batch (``benchmarks/perf/gpu_step.py`` feeds
        it synthetic batches of the configured length)."""
        cfg = self.cfg
        self.policy.eval()
        temp = cfg.rollout.temperature
        share = cfg.scale.share_prefix
        self._mismatch_parts = []
        if self.old_from_update(len(batch)):
            # One optimizer step on this batch: the update's forward runs the very weights that
            # sampled it, so its log-probs (detached) are the old ones and a scoring pass would
            # only repeat that forward.
            batch.old_logprobs = None
        elif cfg.rollout.recompute_logprobs:
            batch.old_logprobs = self._rows(
                lambda ids, am, lm: token_logprobs(
                    self.policy, ids, am, temperature=temp, loss_mask=lm, share_prefix=share
                )[0],
                batch,
                self.policy,
            )
        else:
            batch.old_logprobs = batch.sampler_logprobs.clone()
        self._is_metrics = {}
        if self.corrects_behaviour:
            batch.behaviour_weights, m = algos.behaviour_weights(
                batch.old_logprobs, batch.sampler_logprobs, batch.loss_mask, cfg.algorithm.tis_cap
            )
            self._is_metrics = {k: float(v) for k, v in m.items()}
        if self.ref is not None:
            batch.ref_logprobs = self._rows(
                lambda ids, am, lm: scale.ref_logprobs(
                    self.ref, ids, am, temperature=temp, loss_mask=lm, share_prefix=share
                ),
                batch,
                self.ref,
            )
            a = cfg.algorithm
            if a.kl_mode == "reward":
                batch.token_rewards, self._kl_reward_metrics = algos.kl_in_reward(
                    batch.token_rewards, batch.old_logprobs, batch.ref_logprobs, batch.loss_mask, a.kl_coef, a.kl_kind
                )
        if self.critic is not None:
            self.critic.eval()
            batch.values = self._rows(lambda ids, am, lm: self.critic(ids, am), batch, self.critic)
        return batch

    def old_from_update(self, rows: int) -> bool:
        """Whether the old log-probs come from the update's own forward instead of a scoring pass:
        ``recompute_logprobs`` with a single optimizer step on the batch (one PPO epoch, one minibatch
        of ``rows``), no reference model (its KL may sit in the rewards, which need the old log-probs
        before the advantages) and no behaviour weights (computed from the old log-probs before the
        update). Every micro-batch of that step then runs the weights that sampled the batch, so the
        recomputation and the update's forward are one and the same (docs/scaling.md, "Old
        log-probs from the update's forward")."""
        a = self.cfg.algorithm
        return (
            self.cfg.rollout.recompute_logprobs
            and a.ppo_epochs == 1
            and rows <= a.minibatch_size
            and self.ref is None
            and not self.corrects_behaviour
        )

    @property
    def corrects_behaviour(self) -> bool:
        """Whether the loss weights tokens by proximal over behaviour policy (``algorithm.behaviour_weight``)."""
        mode = self.cfg.algorithm.behaviour_weight
        return mode == "tis" or (mode == "auto" and self.cfg.rollout.max_staleness > 0)

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        a = self.cfg.algorithm
        fn = algos.get_adv_est(a.adv_estimator)
        batch.advantages, batch.returns, m = fn(
            token_rewards=batch.token_rewards,
            loss_mask=batch.loss_mask,
            values=batch.values,
            group_ids=batch.group_ids,
            gamma=a.gamma,
            lam=a.lam,
            norm_by_std=a.norm_adv_by_std,
            **a.adv_kwargs,
        )
        m = dict(m)
        m.update(self._kl_reward_metrics)
        m.update(self._is_metrics)
        m.update(self._overlong_metrics)
        if a.overlong == "mask" and self._overlong_rows.any():
            # After the advantages: a truncated episode still counts in its group's statistics; it
            # only carries no loss (its loss-mask row is cleared, so token means skip its tokens).
            batch.loss_mask[self._overlong_rows.to(batch.loss_mask.device)] = 0.0
        return {k: float(v) for k, v in m.items()}

    def void_update(self, batch: RolloutBatch) -> bool:
        """Whether no term of the loss can have a gradient on ``batch``: every advantage on the loss
        mask is 0 (every GRPO group without a spread) and there is no critic, no entropy bonus and
        no KL term in the loss. Every process must agree (FSDP: one rank alone skipping would hang
        the others' collectives), so it is void only if it is void on every rank."""
        a = self.cfg.algorithm
        if (
            self.critic is not None
            or a.entropy_coef > 0
            or (self.ref is not None and a.kl_mode == "loss" and a.kl_coef > 0)
        ):
            return False
        signal_here = bool((batch.advantages * batch.loss_mask != 0).any())  # NaN counts as signal: it is checked later
        return not self.parallel.any_rank(signal_here)

    def update(self, batch: RolloutBatch, it: int) -> dict[str, float]:
        """The optimizer steps on ``batch``: ``ppo_epochs`` passes over shuffled minibatches. A void
        batch (``void_update``) skips the forward, the backward and the optimizer step (an Adam step
        on zero gradients would still move the weights by its momentum and weight decay, and the
        learning-rate schedule does not advance): ``update/skipped`` is 1."""
        cfg = self.cfg
        if self.void_update(batch):  # every token's surrogate is exactly 0 (A = 0): the loss is known
            return {"update/skipped": 1.0, "policy/loss": 0.0, "policy/total_loss": 0.0}
        self.policy.train()
        if self.critic is not None:
            self.critic.train()
        g = torch.Generator().manual_seed(derive_seed(cfg.run.seed, it, 1))
        sums: dict[str, float] = {}
        count, tokens, padded, widest = 0, 0.0, 0.0, 0
        share = self.update_share_prefix
        for _ in range(cfg.algorithm.ppo_epochs):
            for idx in self.shuffled(batch, g).split(cfg.algorithm.minibatch_size):
                micro = self.microbatches(batch, idx)
                with self.phases("update"):
                    m = self.accumulate(self.opt, micro, self.policy_loss, it, "policy")
                with self.phases("optimizer"):
                    self._step(self.opt, self.policy, self.sched)
                if self.critic is not None:
                    with self.phases("update"):
                        m.update(self.accumulate(self.critic_opt, micro, self.value_loss, it, "value"))
                    with self.phases("optimizer"):
                        self._step(self.critic_opt, self.critic, self.critic_sched)
                m["perf/microbatches"] = len(micro)
                tokens += sum(float(mb.attention_mask.sum()) for mb, _ in micro)
                padded += sum(float(mb.input_ids.numel()) for mb, _ in micro)
                widest = max([widest] + [scale.forward_positions(mb, share) for mb, _ in micro])
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                count += 1
        return {
            **{k: v / count for k, v in sums.items()},
            "update/skipped": 0.0,
            "perf/update_tokens": tokens,
            "perf/update_padding_frac": 1.0 - tokens / padded if padded else 0.0,
            "perf/max_microbatch_positions": float(widest),
        }

    def microbatches(self, batch: RolloutBatch, idx: torch.Tensor) -> list[tuple[RolloutBatch, float]]:
        """The ``(micro-batch, weight)`` pairs of minibatch ``idx`` this process trains on."""
        return self.parallel.microbatches(
            batch,
            idx,
            self.cfg.scale.max_tokens_per_microbatch,
            self.cfg.algorithm.loss_agg,
            self.update_share_prefix,
        )

    def shuffled(self, batch: RolloutBatch, g: torch.Generator) -> torch.Tensor:
        """The rows of ``batch`` in a random order for one epoch's minibatches: a permutation of the
        rows, or where the update shares a group's prompt (``update_share_prefix``) of whole groups
        (each group's rows together, so that a minibatch holds whole groups and its micro-batches share
        their prompts)."""
        if not self.update_share_prefix:
            return torch.randperm(len(batch), generator=g)
        gids = batch.group_ids.tolist()
        groups = list(dict.fromkeys(gids))
        return torch.tensor(
            [i for k in torch.randperm(len(groups), generator=g).tolist() for i, x in enumerate(gids) if x == groups[k]]
        )

    def policy_loss(self, mb: RolloutBatch) -> tuple[torch.Tensor, dict[str, Any]]:
        """The policy's loss on a (micro-)batch: clipped surrogate, KL in the loss, entropy bonus.
        ``policy/entropy`` is measured on every call, from the logits of this forward (the entropy
        monitor, docs/metrics.md); without a bonus it is computed outside autograd: no term, no
        gradient, no (tokens, vocabulary) intermediates kept for the backward."""
        a = self.cfg.algorithm
        lp, ent = token_logprobs(
            self.policy,
            mb.input_ids,
            mb.attention_mask,
            with_entropy=True,
            temperature=self.cfg.rollout.temperature,
            loss_mask=mb.loss_mask,
            entropy_grad=a.entropy_coef > 0,
            share_prefix=self.update_share_prefix,
        )
        old = mb.old_logprobs
        if old is None:  # old_from_update: this forward is the recomputation
            old = lp.detach()
            if self.cfg.rollout.top_p == 1.0:
                self._mismatch_parts.append((old - mb.sampler_logprobs).abs()[mb.loss_mask > 0])
        loss, m = algos.policy_loss(
            lp,
            old,
            mb.advantages,
            mb.loss_mask,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip_c=a.dual_clip_c,
            agg=a.loss_agg,
            agg_kwargs=a.loss_kwargs,
            behaviour_weights=mb.behaviour_weights,
        )
        m = dict(m)
        if self.ref is not None and a.kl_mode == "loss":
            kl, km = algos.kl_loss(
                lp, mb.ref_logprobs, mb.loss_mask, kind=a.kl_kind, agg=a.loss_agg, agg_kwargs=a.loss_kwargs
            )
            loss = loss + a.kl_coef * kl
            m.update(km)
        entropy = algos.aggregate(ent, mb.loss_mask, a.loss_agg, **a.loss_kwargs)
        if a.entropy_coef > 0:
            loss = loss - a.entropy_coef * entropy
        m["policy/entropy"] = entropy.detach()
        m["policy/total_loss"] = loss.detach()
        return loss, m

    def value_loss(self, mb: RolloutBatch) -> tuple[torch.Tensor, dict[str, Any]]:
        a = self.cfg.algorithm
        values = self.critic(mb.input_ids, mb.attention_mask)
        vloss, vm = algos.value_loss(
            values, mb.values, mb.returns, mb.loss_mask, clip_eps=a.value_clip, agg=a.loss_agg, agg_kwargs=a.loss_kwargs
        )
        return a.vf_coef * vloss, vm

    def accumulate(
        self, opt: torch.optim.Optimizer, micro: list[tuple[RolloutBatch, float]], loss_fn: Any, it: int, name: str
    ) -> dict[str, float]:
        """Zero the gradients, then backward ``weight * loss`` of each micro-batch: the sum is the
        minibatch's loss (``scale.microbatches``). Each loss is checked before its backward. The
        metrics are the minibatch's (``Parallelism.reduce_metrics``: summed over processes)."""
        opt.zero_grad(set_to_none=True)
        parts = []
        for mb, w in micro:
            with scale.autocast(self.cfg.scale.mixed_precision, self.cfg.model.device):
                loss, m = loss_fn(mb)
            self._check_finite(loss, it, name)
            (loss * w).backward()
            parts.append((m, w))
        return self.parallel.reduce_metrics(scale.combine_metrics(parts))

    def _check_finite(self, loss: torch.Tensor, it: int, name: str) -> None:
        """Stop before applying a non-finite loss (every process together), with a checkpoint of the
        weights before this update."""
        if not self.parallel.any_rank(not bool(torch.isfinite(loss))):
            return
        path = self.checkpoint(it - 1, keep=self.cfg.run.keep_checkpoints + 1, nonfinite=name) if it > 0 else None
        what = (
            f"{loss.item()} at iteration {it}"
            if self.parallel.world == 1
            else f"not finite on some rank at iteration {it} (this rank's: {loss.item()})"
        )
        raise NonFiniteLossError(
            f"the {name} loss is {what}; stopped before applying it. "
            f"{'The weights before this update are saved in ' + str(path) + '. ' if path else ''}"
            "Lower lr, check the rewards for NaN/Inf, or enable max_grad_norm."
        )

    def _step(self, opt: torch.optim.Optimizer, module: torch.nn.Module, sched: Any) -> None:
        torch.nn.utils.clip_grad_norm_(module.parameters(), self.cfg.algorithm.max_grad_norm)
        opt.step()
        sched.step()

    def sync_weights(self) -> None:
        """Make the rollout source sample from the updated policy (``RolloutSource.sync_weights``)."""
        self.source.sync_weights(self.policy)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on the evaluation tasks (the first ``eval.tasks`` of the eval env), then
        on each of ``eval.sets`` (``eval/<name>/*``); by the main process, under the policy's full
        parameters (the other processes return nothing)."""
        self.policy.eval()
        with self.parallel.full_params(self.policy):
            if not self.parallel.is_main:
                return {}
            return self.source.evaluate(self.sampling, self.cfg.eval.tasks, derive_seed(self.cfg.run.seed, 10**6))

    def mismatch(self, batch: RolloutBatch) -> dict[str, float]:
        """Backend log-probs vs the trainer's recomputation, on agent tokens."""
        m = batch.loss_mask > 0
        if self.cfg.rollout.top_p != 1.0 or not self.cfg.rollout.recompute_logprobs or not m.any():
            # top-p changes the sampled distribution's support; without a recomputation there is nothing to compare
            return {}
        if batch.old_logprobs is None:  # taken in the update's forward (old_from_update); this process's rows
            diff = torch.cat(self._mismatch_parts) if self._mismatch_parts else torch.zeros(0)
            if not len(diff):  # a void update ran no forward
                return {}
        else:
            diff = (batch.old_logprobs - batch.sampler_logprobs).abs()[m]
        return {"train/logprob_mismatch_mean": float(diff.mean()), "train/logprob_mismatch_max": float(diff.max())}

    def timing(self, rt: Any, fwd_bwd: float, total: float) -> dict[str, float]:
        other = total - rt.generate_s - rt.env_s - fwd_bwd
        return {
            "time/iteration_s": total,
            "time/generate_s": rt.generate_s,
            "time/env_s": rt.env_s,
            "time/forward_backward_s": fwd_bwd,
            "time/other_s": other,
            "time/env_fraction": rt.env_s / total,
            "time/elapsed_min": (time.perf_counter() - self.t_start) / 60,
            "perf/generated_tokens_per_s": rt.generated_tokens / max(rt.generate_s, 1e-9),
            "memory/peak_rss_gib": peak_rss_gib(),
            **resident_metrics(trim=self.cfg.scale.release_freed_memory),
            **({"memory/estimate_gib": self.memory_estimate} if self.memory_estimate is not None else {}),
        }

    def should_stop(self, metrics: dict[str, float]) -> bool:
        """Ctrl-C, ``max_minutes`` or ``stop_success``; any process's reason stops every process."""
        run = self.cfg.run
        stop = self._stop or (
            run.max_minutes is not None and (time.perf_counter() - self.t_start) / 60 >= run.max_minutes
        )
        stop = stop or (run.stop_success is not None and metrics.get("eval/success_rate", -1.0) >= run.stop_success)
        return self.parallel.any_rank(stop)

    def trajectory_records(self, trajs: list[Trajectory], **extra: Any) -> list[dict[str, Any]]:
        """JSON records of trajectories; a ``Trajectory`` subclass's own fields (``agent``) and
        ``extra`` (the weight version that sampled them, their staleness) go in too."""
        base = {f.name for f in dataclasses.fields(Trajectory)}
        return [
            episode_record(
                t.episode,
                self.tokenizer,
                group=t.group,
                **extra,
                **{f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name not in base},
            )
            for t in trajs
        ]

    # -- checkpoints ---------------------------------------------------------------------------

    def state(self, it: int) -> dict[str, Any]:
        """The checkpoint's state: full state dicts in the single-process layout, whatever the
        parallelism (a collective under FSDP, complete on the main process only)."""
        policy, opt = self.parallel.full_state(self.policy, self.opt)
        critic, critic_opt = (
            self.parallel.full_state(self.critic, self.critic_opt) if self.critic is not None else (None, None)
        )
        return {
            "policy": policy,
            "opt": opt,
            "critic": critic,
            "critic_opt": critic_opt,
            "sched": self.sched.state_dict(),
            "critic_sched": self.critic_sched.state_dict() if self.critic_sched is not None else None,
            "cursor": {"next_task_offset": (it + 1) * self.cfg.rollout.tasks_per_iter, "num_tasks": self.num_tasks},
            "config": to_dict(self.cfg),
        }

    def checkpoint(self, it: int, keep: int | None = None, **extra: Any) -> Path | None:
        """Save iteration ``it``'s state (and ``extra`` keys) under run_dir/checkpoints, keeping the
        newest ``keep`` (default ``keep_checkpoints``); the main process writes, the others return None."""
        st = self.state(it)  # every process takes part (FSDP gathers the shards)
        if not self.parallel.is_main:
            return None
        return save_checkpoint(self.run_dir, it, st | extra, keep=keep or self.cfg.run.keep_checkpoints)

    def _restore(self) -> None:
        path, st, skipped = load_latest_checkpoint(self.run_dir)
        if path is None and skipped:
            raise CheckpointError(
                f"--resume: no checkpoint under {self.run_dir / 'checkpoints'} can be loaded: "
                + "; ".join(why for _, why in skipped)
                + ". Start a new run instead."
            )
        for bad, why in skipped if self.parallel.is_main else []:  # newer ones, corrupt or partial: named, passed over
            print(f"warning: skipping {bad.name} ({why}); resuming from {path.name}", file=sys.stderr)
        if path is None:  # stopped before its first checkpoint: nothing to restore, so it starts over
            if self.parallel.is_main:
                print(
                    f"--resume: no checkpoint under {self.run_dir / 'checkpoints'} yet (the run stopped before its "
                    "first one); starting it over from iteration 0"
                )
            self.logger.truncate_after(-1)  # the lines of iterations it will redo
            return
        self.load_state(st)
        set_rng_state(st["rng"])
        self.start_iteration = st["iteration"] + 1
        self.version = self.start_iteration
        self.sync_weights()
        self.logger.truncate_after(st["iteration"])
        print(f"resumed from {path} at iteration {self.start_iteration}")

    def load_state(self, st: dict[str, Any]) -> None:
        """Models, optimizers and schedulers from a checkpoint's ``state.pt`` (each process keeps its shards)."""
        self.parallel.load_full_state(self.policy, self.opt, st["policy"], st["opt"])
        self.sched.load_state_dict(st["sched"])
        if self.critic is not None:
            self.parallel.load_full_state(self.critic, self.critic_opt, st["critic"], st["critic_opt"])
            self.critic_sched.load_state_dict(st["critic_sched"])

    def _rows(self, fn: Any, batch: RolloutBatch, model: Any) -> torch.Tensor:
        """``fn(ids, attention_mask, loss_mask)`` on every row of ``batch``: this process's rows under
        ``model``'s full parameters, chunked, then every process's (``Parallelism.score_rows``)."""
        return self.parallel.score_rows(batch, model, lambda rows: self._chunked(fn, rows))

    def _chunked(self, fn: Any, batch: RolloutBatch, size: int = 16) -> torch.Tensor:
        """``fn`` on the batch's rows in chunks of ``size`` rows, or of the token budget; with
        ``scale.share_prefix``, one group's rows at a time (``scale.prefix_parts``, as the update's
        micro-batches), each part trimmed to its longest row and 0 past it."""
        if self.cfg.scale.share_prefix:
            return self._chunked_by_prefix(fn, batch)
        if self.cfg.scale.max_tokens_per_microbatch:  # rows of the padded batch within the token budget
            size = max(1, self.cfg.scale.max_tokens_per_microbatch // batch.input_ids.shape[1])
        out = []
        for s in range(0, len(batch), size):
            sl = slice(s, s + size)
            with scale.autocast(self.cfg.scale.mixed_precision, self.cfg.model.device):
                out.append(fn(batch.input_ids[sl], batch.attention_mask[sl], batch.loss_mask[sl]))
        return torch.cat(out)

    def _chunked_by_prefix(self, fn: Any, batch: RolloutBatch) -> torch.Tensor:
        lengths = batch.attention_mask.sum(-1)
        out = None
        for part in scale.prefix_parts(batch, self.cfg.scale.max_tokens_per_microbatch):
            rows = torch.tensor(part)
            t = int(lengths[rows].max())
            with scale.autocast(self.cfg.scale.mixed_precision, self.cfg.model.device):
                got = fn(batch.input_ids[rows, :t], batch.attention_mask[rows, :t], batch.loss_mask[rows, :t])
            if out is None:
                out = got.new_zeros(batch.input_ids.shape)
            out[rows, :t] = got
        return out


def keep_spread_groups(trajs: list[Trajectory], pad_id: int) -> tuple[list[list[Trajectory]], int]:
    """The groups of ``trajs`` whose scores differ (each a list, in order of first appearance) and
    the number of groups left out: those whose every trajectory scored the same, judged as the
    group estimators judge it (``algos.group_spread``: the sum of the env's rewards on agent
    tokens, equal up to rounding), so a dropped group is exactly one whose advantages would be 0."""
    if not trajs:
        return [], 0
    b = build_batch(trajs, pad_id)
    spread = algos.group_spread(b.token_rewards, b.loss_mask, b.group_ids)  # (B,) bool
    groups: dict[int, list[int]] = {}
    for i, tr in enumerate(trajs):
        groups.setdefault(tr.group, []).append(i)
    kept = [[trajs[i] for i in rows] for rows in groups.values() if bool(spread[rows[0]])]
    return kept, len(groups) - len(kept)


def overlong_shaping(
    batch: RolloutBatch, trajs: Sequence[Trajectory], algo: Any
) -> tuple[dict[str, float], torch.Tensor]:
    """``algorithm.overlong`` on a built batch (CPU, before scoring): ``soft`` adds DAPO's length
    penalty (``algos.soft_overlong_penalty`` of each row's agent-token count) to the reward of the
    row's last agent token, so it enters the trajectory's score; ``mask`` only marks the rows cut by
    a length limit (``LENGTH_CUTS``), whose loss mask ``compute_advantages`` clears after the
    advantages. Returns the ``overlong/*`` metrics and the (B,) bool rows truncated by length."""
    cut = torch.tensor([tr.episode.truncation_reason in LENGTH_CUTS for tr in trajs], dtype=torch.bool)
    if algo.overlong == "none":
        return {}, torch.zeros_like(cut)
    metrics = {"overlong/truncated_frac": float(cut.float().mean())}
    if algo.overlong == "soft":
        lengths = batch.loss_mask.sum(-1)  # (B,) agent tokens
        pen = algos.soft_overlong_penalty(lengths, algo.overlong_max_tokens, algo.overlong_buffer)  # (B,)
        has = lengths > 0
        last = batch.loss_mask.shape[1] - 1 - batch.loss_mask.flip(-1).argmax(-1)  # (B,) last agent token
        rows = has.nonzero().flatten()
        batch.token_rewards[rows, last[rows]] += pen[rows].to(batch.token_rewards.dtype)
        metrics.update(
            {"overlong/penalty_mean": float(pen.mean()), "overlong/penalized_frac": float((pen < 0).float().mean())}
        )
        return metrics, torch.zeros_like(cut)
    metrics["overlong/masked_frac"] = metrics["overlong/truncated_frac"]
    return metrics, cut


def _add_times(a: Any, b: Any) -> Any:
    """Two rollouts' ``RolloutTimes`` summed (generation and env seconds, generated tokens)."""
    return dataclasses.replace(a, **{f.name: getattr(a, f.name) + getattr(b, f.name) for f in dataclasses.fields(a)})


def lr_multiplier(step: int, warmup_steps: int, schedule: str = "constant", total_steps: int = 0) -> float:
    """The learning-rate multiplier at optimizer step ``step`` (0-based): linear warmup over
    ``warmup_steps``, then 1 (``constant``) or a cosine decay to 0 at ``total_steps`` (``cosine``).
    The RL trainer uses the constant schedule, SFT either."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup_steps) / span)))


__all__ = ["NonFiniteLossError", "Trainer", "env_factory", "lr_multiplier"]
