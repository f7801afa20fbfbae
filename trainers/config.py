"""The trainer's config, in sections, mirrored key for key by the YAML files in configs/.

    plugins: [my_project.estimators]      # imported before anything is checked
    model:     {name: tiny, init_from: runs/sft/model, device: cpu, ...}     # ModelConfig
    rollout:   {env_id: AgentR1/FactChain-v0, env_kwargs: {...}, tasks_per_iter: 16, ...}  # RolloutConfig
    algorithm: {algo: ppo, lr: 1e-4, adv_estimator: gae, adv_kwargs: {}, loss_kwargs: {}, ...}  # AlgorithmConfig
    scale:     {max_tokens_per_microbatch: null, lora_r: 0, fsdp: false, ...}  # ScaleConfig
    run:       {run_dir: runs/x, seed: 0, iterations: 100, ...}             # RunConfig
    eval:      {env_kwargs: {split: test}, sets: {...}, every: 10, tasks: 64}  # EvalConfig

Each section is a dataclass that checks its own keys (types, ranges) when built. What cannot be
combined (keys of two sections, or two keys of one: batch arithmetic, FSDP's refusals, ...) is one
table in ``trainers.compose`` (``REFUSALS``), checked where a run is put together. SFT (``trainers.sft.SFTConfig``) and
evaluation reuse ``ModelConfig`` and ``EvalConfig``. Nothing here imports torch: the estimator,
aggregation and KL names are checked against the torch-free ``trainers.algos.registry``, after the
config's ``plugins`` are imported (``trainers.plugins``).

``load_config(path, overrides)`` reads a YAML file and applies ``key=value`` overrides (values
parsed as YAML: ``algorithm.lr=1e-5`` is a float, ``rollout.env_kwargs={num_hops: 3}`` a dict).
The old flat keys (``lr: 1e-5``, a whole config without sections, as written by runs before the
sections) still load: each is converted once, when the config is built, to its section
(``FLAT_KEYS``) with a ``ConfigDeprecationWarning`` naming the new place, so old configs and
checkpoints resume. A built config has one spelling per key, its section's (``cfg.algorithm.lr``);
there is no flat alias. An unknown key, flat or sectioned, fails naming the closest valid one.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from trainers import plugins
from trainers.algos import registry
from trainers.errors import ConfigError  # noqa: F401  (trainers.config.ConfigError, as before)

Algo = Literal["ppo", "grpo", "rloo", "reinforce_pp"]


class ConfigDeprecationWarning(DeprecationWarning):
    """A config used a flat key (``lr``) instead of its sectioned place (``algorithm.lr``)."""


class Section:
    """A config section: ``check_types`` and ``check`` run when it is built (and on
    ``dataclasses.replace``); messages name keys as ``<section>.<key>``."""

    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_types(self, self.section)
        self.check()

    def check(self) -> None:
        pass

    def _positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.section}.{name} must be positive, got {getattr(self, name)}")


@dataclass
class ModelConfig(Section):
    """The policy's model: what ``trainers.models.load_tokenizer_for`` / ``load_policy`` read
    (RL, SFT, evaluation and the Ray rollout workers)."""

    section: ClassVar[str] = "model"
    name: str = "tiny"
    """A hub name, a local HF directory, a named model (``smollm2-135m-instruct``) or ``tiny`` (a
    small Qwen2 built in code)."""
    tokenizer: str | None = None
    """Defaults to the model's tokenizer; ``tiny`` uses the built-in one."""
    tiny_hidden_size: int = 64
    tiny_layers: int = 2
    init_from: str | None = None
    """A HF directory (e.g. an SFT run's ``model/``) whose weights start the policy."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = "cpu"
    torch_threads: int | None = None
    """torch intra-op threads (None: torch's default). 1 is fastest for tiny models on a busy CPU."""

    def check(self) -> None:
        self._positive("tiny_hidden_size", "tiny_layers")
        if self.torch_threads is not None:
            self._positive("torch_threads")


@dataclass
class RolloutConfig(Section):
    """The env and how trajectories are sampled from it (in-process or by Ray workers)."""

    section: ClassVar[str] = "rollout"
    env_id: str | None = None
    """Required: a Gymnasium id, or a multi-agent id (``agent_gym.MULTIAGENT_IDS``: trained by
    ``trainers.multiagent``). No env is assumed."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    num_envs_threads: int = 0
    """Threads stepping the vector env (0: inline; use >0 for I/O-bound tools such as HTTP search)."""
    backend: Literal["hf", "vllm"] = "hf"
    tasks_per_iter: int = 16
    group_size: int = 4
    """Rollouts per task; the batch holds tasks_per_iter * group_size trajectories."""
    max_turn_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    recompute_logprobs: bool = True
    """Recompute the old (behaviour) log-probs with the trainer's policy before the update, as PPO
    defines them. False reuses the backend's sampling log-probs instead and saves one forward pass
    over the batch: exact for the ``hf`` backend (same module, mismatch ~1e-6), approximate for
    vLLM; it needs ``top_p: 1.0`` (top-p changes the sampled distribution's support)."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """The vLLM backend's arguments (``max_restarts``, ``kv_cache_memory_bytes``, ``omp_threads_bind``)
    and anything else for ``vllm.LLM``. On the CPU a lockstep run's engine gets ``omp_threads_bind:
    all`` unless set here or by ``VLLM_CPU_OMP_THREADS_BIND`` (docs/vllm.md)."""
    workers: int = 0
    """Ray actors that collect the rollout, each a slice of tasks_per_iter (0: in-process, no Ray);
    see docs/scaling.md, "Ray rollout workers"."""
    ray_address: str | None = None
    """The Ray cluster to join (``auto`` or ``host:port``); None starts a local one."""
    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    """Ray resources of each rollout worker; with GPUs the worker generates on ``cuda``."""
    retries: int = 2
    """How often one worker's slice is retried in one iteration after the worker died or timed out."""
    timeout_s: float = 600.0
    """A worker whose slice takes longer is killed (Ray restarts it) and the slice retried."""
    mode: Literal["lockstep", "async"] = "lockstep"
    """``lockstep`` (trainers/rollout.py: each turn, every live episode in one backend call) or ``async``
    (trainers/rollout_async.py: each episode a coroutine against vLLM's asynchronous engine, so a
    trajectory waiting on its tools holds no one up; needs ``backend: vllm``; docs/vllm.md,
    "Asynchronous rollout")."""
    max_staleness: int = 0
    """0: each iteration's rollout uses the weights of the update just made (the loop waits for it).
    1: the rollout of iteration i+1 runs in a background thread while iteration i trains, on the
    weights before update i (pushed to the rollout engine between rollouts), so every trajectory
    is at most one weight version old; the loss corrects for it (``algorithm.behaviour_weight``).
    Pays where rollout and training have separate devices; docs/design.md, "Overlapping rollout
    with training"."""
    env_server: str | None = None
    """``http://host:port`` of a ``python -m agent_gym.serve`` process serving ``env_id`` with this
    run's env kwargs: the rollout steps envs there (one session per env); evaluation stays in-process.
    None: the envs live in this process (docs/integrations.md, "OpenEnv")."""
    env_server_reconnect_s: float = 0.0
    """With ``env_server``: how long the rollout waits for a server that went away to come back (a
    restart on the same URL), retrying with backoff, before the run stops with the one-line error
    that says to restart it and ``--resume``. The episodes in flight are replayed on the restarted
    server (same resets, same actions, checked token for token). 0: stop at once."""
    scaffold_drop: list[float] | None = None
    """``[start, end]``: a scaffolded env's (``env_kwargs.scaffold``, agent_gym/scaffold.py) chance of
    dropping a turn's slot, annealed linearly from ``start`` at the first iteration to ``end`` at the
    last (every env's reset gets it as ``scaffold_drop_prob``), to wean the agent off the scaffold.
    None: the env's own ``drop_prob``."""

    def check(self) -> None:
        if not self.env_id:
            raise ConfigError(
                "rollout.env_id is required (no env is assumed): a Gymnasium id such as "
                "AgentR1/FactChain-v0 or AgentR1/HotpotQA-v0, or one a plugin registers"
            )
        self._positive("tasks_per_iter", "group_size", "max_turn_tokens")
        if self.temperature < 0:
            raise ConfigError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.workers < 0:
            raise ConfigError(f"rollout.workers must be >= 0 (0: in-process rollout), got {self.workers}")
        if self.worker_cpus < 0 or self.worker_gpus < 0:
            raise ConfigError("rollout.worker_cpus and rollout.worker_gpus must be >= 0")
        if self.retries < 0:
            raise ConfigError(f"rollout.retries must be >= 0, got {self.retries}")
        if self.max_staleness not in (0, 1):
            raise ConfigError(
                f"rollout.max_staleness must be 0 (rollout waits for each update) or 1 (the next "
                f"rollout overlaps the update), got {self.max_staleness!r}"
            )
        self._positive("timeout_s")
        d = self.scaffold_drop
        if d is not None and (len(d) != 2 or not all(0.0 <= x <= 1.0 for x in d)):
            raise ConfigError(f"rollout.scaffold_drop must be [start, end], two probabilities in [0, 1], got {d!r}")
        if self.env_server is not None and not self.env_server.startswith(("http://", "https://")):
            raise ConfigError(
                f"rollout.env_server must be the http(s):// URL of a `python -m agent_gym.serve` "
                f"process (e.g. http://127.0.0.1:8000), got {self.env_server!r}"
            )
        if self.env_server_reconnect_s < 0:
            raise ConfigError(
                f"rollout.env_server_reconnect_s must be >= 0 seconds (0: stop at once when the env "
                f"server goes away), got {self.env_server_reconnect_s!r}"
            )

    @property
    def batch_size(self) -> int:
        """Trajectories per iteration: ``tasks_per_iter * group_size``."""
        return self.tasks_per_iter * self.group_size


@dataclass
class AlgorithmConfig(Section):
    """The RL algorithm: estimator, losses and optimizer. ``adv_kwargs`` and ``loss_kwargs`` go to
    the registered estimator and aggregation as keyword arguments (their own hyperparameters)."""

    section: ClassVar[str] = "algorithm"
    algo: Algo = "ppo"
    """Sets the defaults below: ppo = GAE with a critic; grpo/rloo/reinforce_pp = no critic."""
    adv_estimator: str | None = None
    """A name in the advantage-estimator registry (``trainers.algos.register_adv_est``: gae, grpo,
    rloo, reinforce_pp, or one a plugin registers); defaults from ``algo``."""
    adv_kwargs: dict[str, Any] = field(default_factory=dict)
    """The estimator's own keyword parameters (e.g. ``{eps: 1e-8}``, or a plugin estimator's
    hyperparameter), checked against its signature."""
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std: bool = True
    ppo_epochs: int = 1
    minibatch_size: int = 32
    lr: float = 1e-4
    critic_lr: float = 1e-3
    warmup_steps: int = 0
    """Linear learning-rate warmup over this many optimizer steps (policy and critic). Adam's
    first steps move every weight by about lr whatever the gradient's quality, which can undo a
    warm start; a short warmup lets its second-moment estimate settle first."""
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    """AdamW's eps (policy and critic). Where a weight's gradient is of the order of eps (its
    second moment ~1e-15), the update m / (sqrt(v) + eps) turns float32 rounding into a change of
    a sizeable part of lr; a larger eps (1e-6) damps those weights."""
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    loss_agg: str = "token-mean"
    """A name in the aggregation registry (``trainers.algos.register_agg``): token-mean,
    seq-mean-token-sum, seq-mean-token-mean, or one a plugin registers."""
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    """The aggregation's own keyword parameters, checked against its signature."""
    vf_coef: float = 0.5
    value_clip: float | None = 0.2
    kl_coef: float = 0.0
    kl_mode: Literal["reward", "loss"] = "loss"
    kl_kind: str = "k3"
    """A name in the KL registry (``trainers.algos.register_kl``): k1, k2, k3, or one a plugin registers."""
    entropy_coef: float = 0.0
    use_action_mask: bool = True
    """Ablation switch: False puts every non-prompt token (env tokens too) under the loss."""
    behaviour_weight: Literal["auto", "tis", "none"] = "auto"
    """How the loss corrects for trajectories sampled by an older policy than the one PPO's ratio
    is taken against (``rollout.max_staleness: 1`` with ``rollout.recompute_logprobs``). ``tis``: the
    decoupled PPO objective (Hilton et al. 2021, arXiv 2110.00641): each token's clipped surrogate,
    with the ratio against the recomputed (proximal) log-probs, is weighted by
    ``min(pi_prox / pi_behaviour, tis_cap)``, the behaviour policy's probability being the one the
    sampler recorded, truncated as in truncated importance sampling (Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"). ``none``: no weight.
    ``auto``: ``tis`` when ``max_staleness`` is 1, else ``none``."""
    tis_cap: float = 2.0
    """The truncation of the behaviour weight (``tis``); Yao et al. use 2."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476): a group whose trajectories all
    scored the same (the env's rewards; no spread, so every advantage in it is 0) is dropped
    before scoring, and the batch is refilled with groups of further tasks until it holds
    ``tasks_per_iter`` groups with a spread or ``dynamic_sampling_max_extra`` extra episodes
    have been sampled; then the update trains on the groups there are (``dynamic/*`` metrics).
    Grouped estimators only (grpo, rloo); in-process rollouts (lockstep or async)."""
    overlong: Literal["none", "mask", "soft"] = "none"
    """Episodes cut by a length limit. ``none``: trained on like any other. ``mask``: an episode the
    env truncated at its context (``truncation_reason`` ``context``) or turn limit (``max_turns``)
    carries no loss (its rewards still count in its group's statistics; DAPO's overlong filtering).
    ``soft``: DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13) added to
    the episode's reward: 0 up to ``overlong_max_tokens - overlong_buffer`` agent tokens, falling
    linearly to -1 at ``overlong_max_tokens``, -1 past it. Metrics ``overlong/*``."""
    overlong_max_tokens: int | None = None
    """``overlong: soft``: L_max, in agent tokens per episode (all turns together)."""
    overlong_buffer: int | None = None
    """``overlong: soft``: L_cache, the length over which the penalty ramps from 0 to -1 (<= overlong_max_tokens)."""
    dynamic_sampling_max_extra: int | None = None
    """The most extra episodes an iteration may sample to refill dropped groups, rounded down to
    whole batches (each refill round samples one batch of fresh tasks); null: one batch
    (``tasks_per_iter * group_size``); 0: drop without refilling."""

    @property
    def uses_critic(self) -> bool:
        """From the estimator's registration (``register_adv_est(name, uses_critic=...)``)."""
        return registry.USES_CRITIC[self.adv_estimator]

    @property
    def needs_groups(self) -> bool:
        """From the estimator's registration (``register_adv_est(name, needs_groups=...)``)."""
        return registry.NEEDS_GROUPS[self.adv_estimator]

    def check(self) -> None:
        if self.adv_estimator is None:
            self.adv_estimator = "gae" if self.algo == "ppo" else self.algo
        for key, table, how in (
            ("adv_estimator", registry.ADV_ESTIMATORS, "register_adv_est"),
            ("loss_agg", registry.AGGREGATIONS, "register_agg"),
            ("kl_kind", registry.KL_KINDS, "register_kl"),
        ):
            if getattr(self, key) not in table:
                raise ConfigError(
                    f"config key 'algorithm.{key}': {getattr(self, key)!r} is not registered; registered: "
                    f"{', '.join(sorted(table))} (add one with trainers.algos.{how}, in a module named "
                    "by plugins: [MODULE] or --plugin MODULE)"
                )
        for key, what, params, fixed in (
            (
                "adv_kwargs",
                "advantage estimator",
                registry.ADV_PARAMS.get(self.adv_estimator),
                registry.ADV_TRAINER_ARGS,
            ),
            ("loss_kwargs", "loss aggregation", registry.AGG_PARAMS.get(self.loss_agg), registry.AGG_TRAINER_ARGS),
        ):
            name = self.adv_estimator if key == "adv_kwargs" else self.loss_agg
            why = registry.check_kwargs(what, name, getattr(self, key), params, fixed)
            if why:
                raise ConfigError(f"config key 'algorithm.{key}': {why}")
        self._positive("ppo_epochs", "minibatch_size")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ConfigError(f"algorithm.dual_clip_c must be > 1, got {self.dual_clip_c}")
        if not self.adam_eps > 0:
            raise ConfigError(f"algorithm.adam_eps must be positive, got {self.adam_eps}")
        if self.warmup_steps < 0:
            raise ConfigError(f"algorithm.warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"algorithm.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.lr <= 0 or self.critic_lr <= 0:
            raise ConfigError("algorithm.lr and algorithm.critic_lr must be positive")
        if self.dynamic_sampling_max_extra is not None and self.dynamic_sampling_max_extra < 0:
            raise ConfigError(
                f"algorithm.dynamic_sampling_max_extra must be >= 0 (0: drop groups without refilling) "
                f"or null, got {self.dynamic_sampling_max_extra}"
            )
        if not self.tis_cap >= 1:
            raise ConfigError(
                f"algorithm.tis_cap must be >= 1 (a weight cap below 1 would shrink on-policy tokens), "
                f"got {self.tis_cap}"
            )


DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class ScaleConfig(Section):
    """Memory and precision (trainers/scale.py, docs/scaling.md); each is off by default."""

    section: ClassVar[str] = "scale"
    max_tokens_per_microbatch: int | None = None
    """Cut each minibatch into micro-batches of at most this many padded tokens (rows x longest
    row) and accumulate their gradients, weighted so the step equals the full minibatch's."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """bf16: forwards under torch.autocast(bfloat16); weights, gradients and AdamW state stay float32."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass (policy and critic)."""
    lora_r: int = 0
    """LoRA rank through peft (0: full fine-tuning). The KL reference is then the base with adapters off."""
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    fsdp: bool = False
    """Run as torchrun processes, each with an FSDP2 shard of the models (trainers/distributed.py,
    docs/scaling.md): ``torchrun --nproc_per_node N trainers/train_grpo.py --config CONFIG scale.fsdp=true``."""
    share_prefix: bool = False
    """Score and train the rows that begin with the same tokens (a GRPO group's prompt) with one
    forward of that prefix, the rest of each row on top of its key/value cache
    (``trainers.models.decoder_hidden``): a group of G rows with a prompt of P tokens costs P + G x
    (rest) token positions instead of G x (P + rest). Micro-batches then hold the rows of one group
    and minibatches whole groups (shuffled by group, not by row); the log-probs equal the plain
    forward's up to float rounding. Composes with ``gradient_checkpointing`` (both passes checkpointed
    layer by layer) for transformers decoders; other decoders run the plain forward in training there."""
    memory_check: bool = True
    """Refuse at start a run whose estimated peak memory exceeds what the machine has available
    (``trainers.memory_budget.host_step_estimate``, on the CPU), with the estimate per component and
    the keys that lower it, instead of being killed for memory later."""
    release_freed_memory: bool = False
    """Have the C allocator give freed blocks of 1 MiB or more back to the system at once (glibc's
    ``mallopt``: a fixed mmap threshold and trim threshold; no effect on other C libraries). With
    glibc's default, the threshold grows after large frees, so a step's freed activations stay in
    the process: SmolLM2's SFT step kept 4.2 GiB resident where 2.1 GiB were live, and its peak was
    1.25x the estimate. Off by default: every large allocation then faults in fresh pages, which
    made SmolLM2's SFT steps 1.25x slower (median of 3 interleaved rounds, 1.02-1.39)
    (``trainers.scale.release_freed_memory``; docs/scaling.md, "Memory on the CPU")."""

    def check(self) -> None:
        if self.max_tokens_per_microbatch is not None and self.max_tokens_per_microbatch <= 0:
            raise ConfigError(
                f"max_tokens_per_microbatch must be positive or null, got {self.max_tokens_per_microbatch}"
            )
        if self.lora_r < 0:
            raise ConfigError(f"lora_r must be >= 0 (0: no LoRA), got {self.lora_r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not self.lora_target_modules or not all(isinstance(m, str) and m for m in self.lora_target_modules):
            raise ConfigError(
                "lora_target_modules must be a non-empty list of module names, e.g. "
                f"{DEFAULT_LORA_TARGETS}; got {self.lora_target_modules!r}"
            )


@dataclass
class RunConfig(Section):
    """Where the run writes, how long it runs, what it logs and checkpoints."""

    section: ClassVar[str] = "run"
    run_dir: str = "runs/default"
    """Where metrics, curves, trajectories and checkpoints go."""
    seed: int = 0
    iterations: int = 100
    max_minutes: float | None = None
    """Stop (with a checkpoint) after this much wall time."""
    stop_success: float | None = None
    """Stop early once the evaluation success rate reaches this."""
    gc_freeze: bool = True
    """After set-up, move every object alive to Python's permanent GC generation (``gc.freeze``), so
    full collections during training skip the model, tokenizer and envs (trainers/gc_stats.py)."""
    log_trajectories: int = 4
    tensorboard: bool = True
    wandb: bool = False
    """Log to Weights & Biases too: offline into ``RUN_DIR/wandb`` unless ``WANDB_MODE`` says
    otherwise (the ``wandb`` extra; trainers/logger.py)."""
    mlflow: bool = False
    """Log to MLflow too: a local file store, ``RUN_DIR/mlruns``, unless ``MLFLOW_TRACKING_URI``
    names another (the ``mlflow`` extra; trainers/logger.py)."""
    progress_bar: bool = True
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    overwrite: bool = False
    """A new run (no ``--resume``) into a ``run_dir`` that already holds a run (its ``metrics.jsonl``
    or a checkpoint) is refused, naming ``--resume`` and this key: the old run's metrics would be
    mixed with the new one's and its checkpoints kept. ``true``: that run's files are removed first
    (``trainers.logger.RUN_FILES``; anything else in the folder is left)."""

    def check(self) -> None:
        self._positive("iterations", "checkpoint_every", "keep_checkpoints")


@dataclass
class EvalConfig(Section):
    """Greedy evaluation (RL and SFT; ``trainers/evaluate.py --checkpoint`` reads a run's ``sets``)."""

    section: ClassVar[str] = "eval"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of the env's kwargs for evaluation (FactChain: ``{split: test}``, the held-out
    split); logged as ``eval/*``. Empty: the training env's settings."""
    sets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Further greedy evaluations, run with ``eval/*``: name -> overrides of the env's kwargs (not of
    ``eval.env_kwargs``), logged as ``eval/<name>/*``. The FactChain demo measures what was not
    trained on: ``heldout: {split: test, exclude_train_tasks: 64}`` (questions of the same KB outside
    the 64-question training pool) and ``fresh_kb: {kb_seed: 1000, split: test}`` (a KB never seen in
    training)."""
    every: int = 10
    """Evaluate every this many iterations (SFT: steps; 0, SFT only: only at the end)."""
    tasks: int = 64

    def check(self) -> None:
        check_eval_sets(self.sets)
        self._positive("tasks")
        if self.every < 0:
            raise ConfigError(f"eval.every must be >= 0, got {self.every}")


def check_eval_sets(eval_sets: dict[str, Any]) -> None:
    for name, kw in eval_sets.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(f"eval.sets: a set's name must be a non-empty string without '/', got {name!r}")
        if not isinstance(kw, dict):
            raise ConfigError(
                f"eval.sets: {name!r} must map to a mapping of env_kwargs overrides "
                f"(e.g. {{kb_seed: 1000}}), got {kw!r}"
            )


# ----------------------------------------------------------------------------- sectioned configs


class Sectioned:
    """A config made of sections (dataclass fields whose type is a ``Section``) and plain keys.

    ``Cls(section=dict or instance, ..., key=value)`` builds it; a flat key (``lr=...``) is put in
    its section (``FLAT_KEYS``) without a warning in code (YAML and dicts warn: ``from_dict``).
    ``plugins`` are imported first, so that names they register validate."""

    RENAMED: ClassVar[dict[str, tuple[str, str]]] = {}

    def __init__(self, **kw: Any) -> None:
        cls = type(self)
        data = normalise(cls, kw, f"{cls.__name__}(...)", warn=False)
        plugins.load(data.get("plugins") or [])
        for f in dataclasses.fields(self):
            if f.name in section_types(cls):
                value = data.get(f.name, {})
                if isinstance(value, Section):
                    value = copy.copy(value)
                else:
                    value = section_types(cls)[f.name](**{**f.metadata.get("defaults", {}), **value})
            elif f.name in data:
                value = data[f.name]
            else:
                value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            object.__setattr__(self, f.name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        check_types(self, "")


def section_types(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if isinstance(hints[f.name], type) and issubclass(hints[f.name], Section)
    }


def flat_keys(cls: type) -> dict[str, tuple[str, str]]:
    """The old flat key of every sectioned field of ``cls``: flat name -> (section, field). A
    field keeps its name unless ``cls.RENAMED`` maps it (``model`` -> ``model.name``,
    ``rollout_workers`` -> ``rollout.workers``, ``eval_tasks`` -> ``eval.tasks``, ...); a flat name
    that is a plain key of ``cls`` (SFT's ``lr``) stays plain."""
    out: dict[str, tuple[str, str]] = {}
    renamed = {v: k for k, v in cls.RENAMED.items()}
    plain = {f.name for f in dataclasses.fields(cls)} - set(section_types(cls))
    for sec, typ in section_types(cls).items():
        for f in dataclasses.fields(typ):
            flat = renamed.get((sec, f.name), f.name)
            if flat in plain or (flat in out and (sec, f.name) not in renamed):
                continue
            assert flat not in out, f"flat key {flat!r} maps to {out[flat]} and {(sec, f.name)}"
            out[flat] = (sec, f.name)
    return out


def normalise(cls: type, d: dict[str, Any], source: str, warn: bool = True) -> dict[str, Any]:
    """``d`` (sectioned, dotted ``section.key``, flat or a mix) as ``{section: {key: value}, plain: value}``.

    Sections come first; dotted and flat keys then override them (so ``lr=...`` on the command line,
    or a flat key a caller adds to a saved sectioned config, wins). Flat keys warn (``warn``) naming
    their new place; unknown keys fail naming the closest valid one."""
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: expected a mapping of config keys, got {type(d).__name__}")
    sections = section_types(cls)
    flat = flat_keys(cls)
    plain = {f.name for f in dataclasses.fields(cls)} - set(sections)
    out: dict[str, Any] = {}
    later: list[tuple[str, str, Any]] = []
    moved: list[str] = []
    unknown: list[str] = []
    for key, value in d.items():
        if key in sections and isinstance(value, Section):
            out[key] = value
        elif key in sections and isinstance(value, dict):
            fields = {f.name for f in dataclasses.fields(sections[key])}
            bad = [f"{key}.{k}" for k in value if k not in fields]
            unknown += bad
            if not bad:
                out[key] = dict(value)
        elif key in sections and key not in flat:
            raise ConfigError(
                f"{source}: config key {key!r} is a section: expected a mapping of its keys "
                f"({', '.join(f.name for f in dataclasses.fields(sections[key]))}), got {value!r}"
            )
        elif isinstance(key, str) and "." in key and key.split(".", 1)[0] in sections:
            sec, name = key.split(".", 1)
            if name in {f.name for f in dataclasses.fields(sections[sec])}:
                later.append((sec, name, value))
            else:
                unknown.append(key)
        elif key in plain:
            out[key] = value
        elif key in flat:
            later.append((*flat[key], value))
            moved.append(f"{key} -> {'.'.join(flat[key])}")
        else:
            unknown.append(str(key))
    if unknown:
        dotted = {f"{s}.{f.name}" for s, t in sections.items() for f in dataclasses.fields(t)}
        valid = sorted(plain | set(flat) | dotted)

        def hint(k: str) -> list[str]:
            tail = k.split(".")[-1]
            if tail in flat:  # a key of another section, or the flat name of one: its new place
                return [".".join(flat[tail])]
            moved_to = [d for d in sorted(dotted) if d.endswith("." + tail)]
            close = (
                moved_to[:1] or difflib.get_close_matches(k, valid, n=1) or difflib.get_close_matches(tail, valid, n=1)
            )
            return [".".join(flat[c]) if c in flat else c for c in close]

        hints = {k: hint(k) for k in unknown}
        msg = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
        raise ConfigError(
            f"{source}: unknown config key(s) {msg}. Valid keys are the fields of the sections of "
            f"{cls.__module__}.{cls.__name__} (see docs/configs.md)."
        )
    for sec, name, value in later:
        current = out.get(sec, {})
        if isinstance(current, Section):
            current = {f.name: getattr(current, f.name) for f in dataclasses.fields(current)}
        out[sec] = {**current, name: value}
    if moved and warn:
        warnings.warn(
            f"{source}: flat config keys are deprecated; read as {', '.join(moved)}. Write them under "
            'their section (docs/configs.md, "Sections").',
            ConfigDeprecationWarning,
            stacklevel=3,
        )
    return out


@dataclass(init=False)
class TrainConfig(Sectioned):
    """The RL trainer's config (``trainers/train_ppo.py``, ``train_grpo.py``): six sections and the
    plugins. Each key is read through its section (``cfg.algorithm.lr``); what the sections cannot
    combine is refused where the run is put together (``trainers.compose.REFUSALS``)."""

    model: ModelConfig
    rollout: RolloutConfig
    algorithm: AlgorithmConfig
    scale: ScaleConfig
    run: RunConfig
    eval: EvalConfig
    plugins: list[str] = field(default_factory=list)
    """Modules imported before the config is checked, in every process (rollout workers and
    torchrun ranks too): where custom estimators, aggregations, KL kinds and envs register."""

    RENAMED: ClassVar[dict[str, tuple[str, str]]] = {
        "model": ("model", "name"),
        "rollout_workers": ("rollout", "workers"),
        "rollout_worker_cpus": ("rollout", "worker_cpus"),
        "rollout_worker_gpus": ("rollout", "worker_gpus"),
        "rollout_retries": ("rollout", "retries"),
        "rollout_timeout_s": ("rollout", "timeout_s"),
        "eval_env_kwargs": ("eval", "env_kwargs"),
        "eval_sets": ("eval", "sets"),
        "eval_every": ("eval", "every"),
        "eval_tasks": ("eval", "tasks"),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval.every <= 0:
            raise ConfigError(f"eval.every must be positive for RL, got {self.eval.every}")


def agg_units_problem(agg: str) -> str | None:
    """Why ``agg`` cannot be split over micro-batches or ranks (None when it has ``units``)."""
    if agg in registry.AGG_UNITS:
        return None
    what = "was registered without units=" if agg in registry.AGGREGATIONS else "is not a registered aggregation"
    return (
        f"loss_agg={agg!r} {what}, so its micro-batch or rank losses cannot be re-weighted to the minibatch's "
        f"(aggregations with units: {', '.join(sorted(registry.AGG_UNITS))}). Register it with "
        f"trainers.algos.register_agg({agg!r}, units=fn), fn(mask (B, T)) -> the count its loss divides by "
        "(loss tokens for a token mean, rows with a loss token for a row mean), or set max_tokens_per_microbatch: "
        "null and fsdp: false."
    )


FLAT_KEYS = flat_keys(TrainConfig)
"""The old flat key of each field: flat name -> (section, field), for converting old configs at load
(``normalise``); a built ``TrainConfig`` has no attribute by these names."""


# ----------------------------------------------------------------------------- types


def check_types(cfg: Any, prefix: str = "") -> None:
    """Check every field of a config dataclass against its type hint (sections, RL and SFT configs);
    YAML's ints are accepted for floats and stored as floats, and ``1e-5`` strings are read as floats."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        if _base(hints[f.name]) is float and isinstance(value, str):
            try:  # PyYAML reads 1e-5 (no dot) as a string
                value = float(value)
                setattr(cfg, f.name, value)
            except ValueError:
                pass
        if not _matches(value, hints[f.name]):
            raise ConfigError(
                f"config key {key!r}: expected {_describe(hints[f.name])}, got {value!r} ({type(value).__name__})"
            )
        # YAML writes 1 for 1.0: accept ints for floats, stored as float.
        if _base(hints[f.name]) is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(cfg, f.name, float(value))


def _base(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is typing.Union or str(origin) == "types.UnionType":
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin is dict:
        return isinstance(value, dict)
    if origin is list:
        args = typing.get_args(tp)
        return isinstance(value, list) and (not args or all(_matches(v, args[0]) for v in value))
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


# ----------------------------------------------------------------------------- loading


def config_fields(cls: type = TrainConfig) -> list[str]:
    """Every key of ``cls`` as written in YAML: ``section.key`` and its plain keys."""
    sections = section_types(cls)
    return [
        f"{f.name}.{g.name}" if f.name in sections else f.name
        for f in dataclasses.fields(cls)
        for g in (dataclasses.fields(sections[f.name]) if f.name in sections else [f])
    ]


def from_dict(d: dict[str, Any], source: str = "config", cls: type = TrainConfig) -> Any:
    """A config from a dict: sectioned, flat (deprecated, warns) or mixed; ``plugins`` are
    imported before any key is checked."""
    if isinstance(d, dict):
        plugins.load(d.get("plugins") or [], source)
    data = normalise(cls, d, source)
    return cls(**data)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {item!r} must look like key=value (a section's key: section.key=value, "
                "e.g. algorithm.lr=1e-5)"
            )
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else None
    return out


def load_config(
    path: str | Path | None,
    overrides: list[str] | None = None,
    defaults: dict[str, Any] | None = None,
    cls: type = TrainConfig,
    plugins: list[str] | None = None,
) -> Any:
    """The config in ``path`` (YAML), over ``defaults``, under ``overrides`` (``key=value``);
    ``plugins`` (``--plugin``) are added to the file's own."""
    data: dict[str, Any] = dict(defaults or {})
    source = "config"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found; configs live in configs/*.yaml")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of config keys")
        data = merge(data, loaded, shorthand(cls))
        source = str(p)
    data = merge(data, nested_overrides(data, parse_overrides(overrides or []), cls), shorthand(cls))
    if plugins:
        data["plugins"] = list(dict.fromkeys([*(data.get("plugins") or []), *plugins]))
    return from_dict(data, source, cls)


def _mapping_fields(section: type) -> set[str]:
    """The fields of a section whose type is a mapping (``dict[...]`` or ``dict[...] | None``)."""
    hints = typing.get_type_hints(section)
    out = set()
    for f in dataclasses.fields(section):
        tp = hints[f.name]
        args = (
            typing.get_args(tp)
            if typing.get_origin(tp) is typing.Union or str(typing.get_origin(tp)) == "types.UnionType"
            else (tp,)
        )
        if any(typing.get_origin(a) is dict or a is dict for a in args):
            out.add(f.name)
    return out


def nested_overrides(data: dict[str, Any], over: dict[str, Any], cls: type) -> dict[str, Any]:
    """``section.field.key[.key...]=value`` overrides of a mapping field (``rollout.env_kwargs.topk=5``,
    ``eval.sets.heldout.limit=50``, ``rollout.vllm_kwargs.max_model_len=4096``; a plain mapping field
    of ``cls`` likewise, SFT's ``env_kwargs.topk=5``) as one ``section.field`` override: the field's
    mapping so far (from ``data``, an earlier override, or its default) with that key set, the rest
    kept. Other keys pass through unchanged."""
    sections = section_types(cls)
    plain = _mapping_fields(cls) - set(sections)
    out: dict[str, Any] = {}
    for key, value in over.items():
        parts = key.split(".") if isinstance(key, str) else []
        if len(parts) >= 3 and parts[0] in sections and parts[1] in _mapping_fields(sections[parts[0]]):
            owner, sec, name, path = sections[parts[0]], parts[0], parts[1], parts[2:]
            dotted = f"{sec}.{name}"
            held = data.get(sec) if isinstance(data.get(sec), dict) else {}
        elif len(parts) >= 2 and parts[0] in plain:
            owner, sec, name, path = cls, None, parts[0], parts[1:]
            dotted, held = name, data
        else:
            out[key] = value
            continue
        if dotted in out:
            current = out[dotted]
        elif dotted in data:
            current = data[dotted]
        elif name in held:
            current = held[name]
        else:
            f = {f.name: f for f in dataclasses.fields(owner)}[name]
            current = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        mapping = copy.deepcopy(current) if current is not None else {}
        node = mapping
        for i, part in enumerate(path[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                where = ".".join([dotted, *path[: i + 1]])
                shown = repr(nxt) if len(repr(nxt)) <= 60 else repr(nxt)[:57] + "..."
                raise ConfigError(
                    f"override {key!r}: {where} is {shown}, not a mapping, so it has no key {path[i + 1]!r}"
                )
            node = nxt
        node[path[-1]] = value
        out[dotted] = mapping
    return out


def shorthand(cls: type) -> dict[str, str]:
    """Sections that a plain value may stand for, and the key it fills: ``model: NAME`` is
    ``model.name: NAME`` (``cls.RENAMED``)."""
    return {flat: key for flat, (sec, key) in getattr(cls, "RENAMED", {}).items() if flat == sec}


def merge(base: dict[str, Any], over: dict[str, Any], short: dict[str, str] | None = None) -> dict[str, Any]:
    """``over`` on ``base``, section by section (a section mapping in both is merged key by key).

    Where one side is a section's mapping and the other its deprecated plain-value shorthand
    (``short``: ``model=PATH`` for ``model.name``), the shorthand fills its key of the mapping (with
    the deprecation warning), so ``model=PATH`` on the command line replaces the name and keeps the
    file's ``model.dtype`` and ``model.device``: it used to replace the whole section with its
    defaults."""
    short = short or {}
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        if k in short and (isinstance(v, dict) != isinstance(old, dict)) and v is not None and old is not None:
            warnings.warn(
                f"flat config keys are deprecated; read as {k} -> {k}.{short[k]}. Write it as {k}.{short[k]}=...",
                ConfigDeprecationWarning,
                stacklevel=3,
            )
            v = v if isinstance(v, dict) else {short[k]: v}
            old = old if isinstance(old, dict) else {short[k]: old}
            out[k] = old
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) and k in _SECTION_NAMES else v
    return out


_SECTION_NAMES = {"model", "rollout", "algorithm", "scale", "run", "eval"}


def to_dict(cfg: Any) -> dict[str, Any]:
    """The sectioned dict of a config (what ``config.yaml`` and checkpoints hold)."""
    return dataclasses.asdict(cfg)
