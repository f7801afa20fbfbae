"""The trainer's config: one dataclass, mirrored field for field by the YAML files in configs/.

``load_config(path, overrides)`` reads a YAML file, applies ``key=value`` overrides (values are
parsed as YAML, so ``lr=1e-5`` is a float and ``env_kwargs={num_hops: 3}`` a dict), and checks
every key and type. An unknown key, a wrong type or impossible batch arithmetic fails at start
with a message that names the key.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

Algo = Literal["ppo", "grpo", "rloo", "reinforce_pp"]


class ConfigError(ValueError):
    pass


@dataclass
class TrainConfig:
    # -- run ---------------------------------------------------------------------------------
    run_dir: str = "runs/default"
    """Where metrics, curves, trajectories and checkpoints go."""
    seed: int = 0
    algo: Algo = "ppo"
    """Sets the defaults below: ppo = GAE with a critic; grpo/rloo/reinforce_pp = no critic."""
    iterations: int = 100
    max_minutes: float | None = None
    """Stop (with a checkpoint) after this much wall time."""
    stop_success: float | None = None
    """Stop early once the evaluation success rate reaches this."""

    # -- env -----------------------------------------------------------------------------------
    env_id: str = "AgentR1/FactChain-v0"
    """A Gymnasium id, or a multi-agent id (``agent_gym.MULTIAGENT_IDS``: trained by ``trainers.multiagent``)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "test"})
    """Overrides of env_kwargs for evaluation (FactChain: the held-out split); logged as ``eval/*``."""
    eval_sets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Further greedy evaluations, run with ``eval/*``: name -> overrides of ``env_kwargs`` (not of
    ``eval_env_kwargs``), logged as ``eval/<name>/*``. The FactChain demo measures what was not
    trained on: ``heldout: {split: test, exclude_train_tasks: 64}`` (questions of the same KB outside
    the 64-question training pool) and ``fresh_kb: {kb_seed: 1000, split: test}`` (a KB never seen in
    training)."""
    num_envs_threads: int = 0
    """Threads stepping the vector env (0: inline; use >0 for I/O-bound tools such as HTTP search)."""

    # -- model ---------------------------------------------------------------------------------
    model: str = "tiny"
    """A hub name, a local HF directory, or ``tiny`` (a small Qwen2 built in code)."""
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
    gc_freeze: bool = True
    """After set-up, move every object alive to Python's permanent GC generation (``gc.freeze``), so
    full collections during training skip the model, tokenizer and envs (trainers/gc_stats.py)."""

    # -- rollout -------------------------------------------------------------------------------
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
    rollout_workers: int = 0
    """Ray actors that collect the rollout, each a slice of tasks_per_iter (0: in-process, no Ray);
    see docs/scaling.md, "Ray rollout workers"."""
    ray_address: str | None = None
    """The Ray cluster to join (``auto`` or ``host:port``); None starts a local one."""
    rollout_worker_cpus: float = 1.0
    rollout_worker_gpus: float = 0.0
    """Ray resources of each rollout worker; with GPUs the worker generates on ``cuda``."""
    rollout_retries: int = 2
    """How often one worker's slice is retried in one iteration after the worker died or timed out."""
    rollout_timeout_s: float = 600.0
    """A worker whose slice takes longer is killed (Ray restarts it) and the slice retried."""
    env_server: str | None = None
    """``http://host:port`` of a ``python -m agent_gym.serve`` process serving ``env_id`` with this
    run's env kwargs: the rollout steps envs there (one session per env); evaluation stays in-process.
    None: the envs live in this process (docs/integrations.md, "OpenEnv")."""

    # -- algorithm -----------------------------------------------------------------------------
    adv_estimator: str | None = None
    """A name in the advantage-estimator registry (``trainers.algos.register_adv_est``: gae, grpo,
    rloo, reinforce_pp, or one you register); defaults from ``algo``."""
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
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    loss_agg: str = "token-mean"
    """A name in the aggregation registry (``trainers.algos.register_agg``): token-mean,
    seq-mean-token-sum, seq-mean-token-mean, or one you register."""
    vf_coef: float = 0.5
    value_clip: float | None = 0.2
    kl_coef: float = 0.0
    kl_mode: Literal["reward", "loss"] = "loss"
    kl_kind: str = "k3"
    """A name in the KL registry (``trainers.algos.register_kl``): k1, k2, k3, or one you register."""
    entropy_coef: float = 0.0
    use_action_mask: bool = True
    """Ablation switch: False puts every non-prompt token (env tokens too) under the loss."""

    # -- memory and precision (trainers/scale.py, docs/scaling.md) --------------------------------
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
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                     "gate_proj", "up_proj", "down_proj"])
    fsdp: bool = False
    """Run as torchrun processes, each with an FSDP2 shard of the models (trainers/distributed.py,
    docs/scaling.md): ``torchrun --nproc_per_node N trainers/train_grpo.py --config CONFIG fsdp=true``."""

    # -- evaluation, logging, checkpoints ----------------------------------------------------------
    eval_every: int = 10
    eval_tasks: int = 64
    log_trajectories: int = 4
    tensorboard: bool = True
    wandb: bool = False
    progress_bar: bool = True
    checkpoint_every: int = 1
    keep_checkpoints: int = 2

    @property
    def batch_size(self) -> int:
        return self.tasks_per_iter * self.group_size

    @property
    def uses_critic(self) -> bool:
        """From the estimator's registration (``register_adv_est(name, uses_critic=...)``)."""
        from trainers.algos import USES_CRITIC

        return USES_CRITIC[self.adv_estimator]

    @property
    def needs_groups(self) -> bool:
        """From the estimator's registration (``register_adv_est(name, needs_groups=...)``)."""
        from trainers.algos import NEEDS_GROUPS

        return NEEDS_GROUPS[self.adv_estimator]

    def __post_init__(self) -> None:
        check_types(self)
        if self.adv_estimator is None:
            self.adv_estimator = "gae" if self.algo == "ppo" else self.algo
        check_registered(self)
        check_eval_sets(self.eval_sets)
        for name in ("iterations", "tasks_per_iter", "group_size", "max_turn_tokens", "ppo_epochs",
                     "minibatch_size", "eval_every", "eval_tasks", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.batch_size % self.minibatch_size:
            raise ConfigError(f"minibatch_size={self.minibatch_size} must divide the batch of "
                              f"tasks_per_iter * group_size = {self.tasks_per_iter} * {self.group_size} = {self.batch_size}")
        if self.needs_groups and self.group_size < 2:
            raise ConfigError(f"group_size must be at least 2 for adv_estimator={self.adv_estimator!r}, got {self.group_size} "
                              "(it compares each trajectory with the others of its group: registered with needs_groups=True)")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.recompute_logprobs and self.top_p != 1.0:
            raise ConfigError(f"recompute_logprobs=false needs top_p: 1.0 (got top_p={self.top_p}): the sampler's "
                              "log-probs under top-p are not the policy's")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ConfigError(f"dual_clip_c must be > 1, got {self.dual_clip_c}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.lr <= 0 or self.critic_lr <= 0:
            raise ConfigError("lr and critic_lr must be positive")
        check_rollout_workers(self)
        from trainers.scale import ScaleConfigError, check_config

        try:
            check_config(self)
        except ScaleConfigError as e:
            raise ConfigError(str(e)) from None


def check_rollout_workers(cfg: "TrainConfig") -> None:
    if cfg.rollout_workers < 0:
        raise ConfigError(f"rollout_workers must be >= 0 (0: in-process rollout), got {cfg.rollout_workers}")
    if cfg.rollout_workers and cfg.tasks_per_iter % cfg.rollout_workers:
        raise ConfigError(f"rollout_workers={cfg.rollout_workers} must divide tasks_per_iter={cfg.tasks_per_iter} "
                          "(each worker collects an equal slice of the tasks)")
    if cfg.rollout_worker_cpus < 0 or cfg.rollout_worker_gpus < 0:
        raise ConfigError("rollout_worker_cpus and rollout_worker_gpus must be >= 0")
    if cfg.rollout_retries < 0:
        raise ConfigError(f"rollout_retries must be >= 0, got {cfg.rollout_retries}")
    if cfg.rollout_timeout_s <= 0:
        raise ConfigError(f"rollout_timeout_s must be positive, got {cfg.rollout_timeout_s}")
    if cfg.env_server is not None:
        import agent_gym

        if not cfg.env_server.startswith(("http://", "https://")):
            raise ConfigError(f"env_server must be the http(s):// URL of a `python -m agent_gym.serve` process "
                              f"(e.g. http://127.0.0.1:8000), got {cfg.env_server!r}")
        if cfg.env_id in agent_gym.MULTIAGENT_IDS:
            raise ConfigError(f"env_server serves single-agent envs; {cfg.env_id!r} is a multi-agent id: unset env_server")


def check_registered(cfg: "TrainConfig") -> None:
    """The registries are the only lists of valid names: anything registered (before the config is
    built) is selectable, anything else fails naming the valid ones."""
    from trainers import algos

    for key, registry, how in (("adv_estimator", algos.ADV_ESTIMATORS, "register_adv_est"),
                               ("loss_agg", algos.AGGREGATIONS, "register_agg"), ("kl_kind", algos.KL_KINDS, "register_kl")):
        if getattr(cfg, key) not in registry:
            raise ConfigError(f"config key {key!r}: {getattr(cfg, key)!r} is not registered; registered: "
                              f"{', '.join(sorted(registry))} (add one with trainers.algos.{how})")


def check_eval_sets(eval_sets: dict[str, Any]) -> None:
    for name, kw in eval_sets.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(f"eval_sets: a set's name must be a non-empty string without '/', got {name!r}")
        if not isinstance(kw, dict):
            raise ConfigError(f"eval_sets: {name!r} must map to a mapping of env_kwargs overrides "
                              f"(e.g. {{kb_seed: 1000}}), got {kw!r}")


def check_types(cfg: Any) -> None:
    """Check every field of a config dataclass against its type hint (RL and SFT configs); YAML's
    ints are accepted for floats and stored as floats, and ``1e-5`` strings are read as floats."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if _base(hints[f.name]) is float and isinstance(value, str):
            try:  # PyYAML reads 1e-5 (no dot) as a string
                value = float(value)
                setattr(cfg, f.name, value)
            except ValueError:
                pass
        if not _matches(value, hints[f.name]):
            raise ConfigError(f"config key {f.name!r}: expected {_describe(hints[f.name])}, got {value!r} "
                              f"({type(value).__name__})")
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
        return isinstance(value, list)
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


def config_fields(cls: type = TrainConfig) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def from_dict(d: dict[str, Any], source: str = "config", cls: type = TrainConfig) -> Any:
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: expected a mapping of config keys, got {type(d).__name__}")
    names = set(config_fields(cls))
    unknown = sorted(set(d) - names)
    if unknown:
        import difflib

        hints = {k: difflib.get_close_matches(k, names, n=1) for k in unknown}
        msg = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
        raise ConfigError(f"{source}: unknown config key(s) {msg}. Valid keys are the fields of "
                          f"{cls.__module__}.{cls.__name__} (see docs/configs.md).")
    return cls(**d)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else None
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None, defaults: dict[str, Any] | None = None,
                cls: type = TrainConfig) -> Any:
    data: dict[str, Any] = dict(defaults or {})
    source = "config"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found; configs live in configs/*.yaml")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of config keys")
        data.update(loaded)
        source = str(p)
    data.update(parse_overrides(overrides or []))
    return from_dict(data, source, cls)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
