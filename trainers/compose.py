"""Where an RL run is put together: the one place that reads a whole config and decides.

- ``REFUSALS``: every rule "these keys cannot be combined", one table of rows (a name, the keys, a
  condition and a message that names the fix). A section's dataclass (``trainers.config``) checks
  its own keys one at a time (a type, a range); a rule that reads two keys or more is a row here.
  ``check`` walks the table and raises ``ConfigError`` with the first row that applies;
  tests/trainers/test_compose.py builds a config that trips each row.
- ``choose_parts``: the rollout source (``LocalRollout``, ``RayRollout``, ``AsyncRollout``,
  ``TeamRollout``), the parallelism strategy (``SingleProcess``, ``FSDP``) and the overlap part
  (``Prefetching`` for ``rollout.max_staleness: 1``) the config asks for.
- ``build_trainer``: a ``trainers.trainer.Trainer`` given those parts (the trainer imports none of
  them), ``run``: the entry ``trainers/cli.py`` calls, ``resume_config``: a run's saved config for
  ``--resume``.

Nothing imports this module but the command line (and tests): it sits above every part.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

import agent_gym
from agent_gym.env_arguments import unknown_env_argument_in
from trainers.config import ConfigError, TrainConfig, agg_units_problem, from_dict
from trainers.distributed import FSDP
from trainers.multiagent import TeamRollout
from trainers.parallel import Parallelism, SingleProcess
from trainers.ray_rollout import RayRollout
from trainers.rollout_async import AsyncRollout
from trainers.sources import LocalRollout, Prefetching
from trainers.trainer import Trainer

FAMILIES = {"ppo": ("ppo",), "grpo": ("grpo", "rloo", "reinforce_pp")}
"""The algorithms each command runs (``train_ppo.py``, ``train_grpo.py``)."""


@dataclass(frozen=True)
class Setting:
    """What a refusal looks at: the config and, where known, how the run is launched."""

    cfg: TrainConfig
    parallel: Any = None
    """A ``Parallelism`` the caller gives instead of the one ``choose_parts`` picks (None: that one)."""
    script: str | None = None
    """The command's algorithm family, ``ppo`` or ``grpo`` (``trainers/cli.py``); None: any."""
    prog: str = ""
    """The command's name, for its message."""

    @property
    def world(self) -> int:
        """Processes the run has: the given strategy's, else torchrun's ``WORLD_SIZE`` (1 without it)."""
        if self.parallel is not None:
            return int(getattr(self.parallel, "world", 1))
        try:
            return max(1, int(os.environ.get("WORLD_SIZE", "1")))
        except ValueError:
            return 1  # torchrun_env names a malformed one when FSDP starts

    @property
    def team(self) -> bool:
        return self.cfg.rollout.env_id in agent_gym.MULTIAGENT_IDS


@dataclass(frozen=True)
class Refusal:
    """One rule: when ``when(setting)`` holds, the run is refused with ``message(setting)``."""

    name: str
    keys: tuple[str, ...]
    when: Callable[[Setting], bool]
    message: Callable[[Setting], str]


def _async(why: Callable[[Setting], str]) -> Callable[[Setting], str]:
    return lambda s: f"rollout.mode: async does not combine with {why(s)} (or use rollout.mode: lockstep)"


def _dynamic(why: Callable[[Setting], str]) -> Callable[[Setting], str]:
    return lambda s: f"algorithm.dynamic_sampling: true does not combine with {why(s)}"


def _fsdp(why: Callable[[Setting], str]) -> Callable[[Setting], str]:
    return lambda s: f"fsdp: true does not combine with {why(s)}"


def _uneven(s: Setting) -> str | None:
    """The first of ``tasks_per_iter``, ``minibatch_size`` that the processes cannot share evenly."""
    for key, value in (
        ("tasks_per_iter", s.cfg.rollout.tasks_per_iter),
        ("minibatch_size", s.cfg.algorithm.minibatch_size),
    ):
        if value % s.world:
            return f"{key}={value}"
    return None


def _script_message(s: Setting) -> str:
    other = "ppo" if s.cfg.algorithm.algo == "ppo" else "grpo"
    use = f"agent-gym-train-{other} (or agent-gym-train)" if s.prog.startswith("agent-gym") else f"train_{other}.py"
    return (
        f"config key 'algorithm.algo' is {s.cfg.algorithm.algo!r}, which {s.prog} does not run; use "
        f"{use} or set algorithm.algo to one of {FAMILIES[s.script]}"
    )


def _env_argument_problem(s: Setting) -> str | None:
    """The first env keyword a built-in env does not take, in ``rollout.env_kwargs``, ``eval.env_kwargs``
    or an ``eval.sets`` entry (``agent_gym.env_arguments.unknown_env_argument``), named by its config key."""
    cfg = s.cfg
    places = {"rollout.env_kwargs": cfg.rollout.env_kwargs, "eval.env_kwargs": cfg.eval.env_kwargs}
    places |= {f"eval.sets.{name}": kw for name, kw in cfg.eval.sets.items()}
    return unknown_env_argument_in(cfg.rollout.env_id, places)


REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "env_arguments_taken",
        ("rollout.env_kwargs", "eval.env_kwargs", "eval.sets", "rollout.env_id"),
        lambda s: _env_argument_problem(s) is not None,
        lambda s: f"{_env_argument_problem(s)} (refused before any model, engine or env is started)",
    ),
    # the rollout section's keys among themselves
    Refusal(
        "recompute_needs_top_p_1",
        ("rollout.recompute_logprobs", "rollout.top_p"),
        lambda s: not s.cfg.rollout.recompute_logprobs and s.cfg.rollout.top_p != 1.0,
        lambda s: (
            f"rollout.recompute_logprobs=false needs top_p: 1.0 (got top_p={s.cfg.rollout.top_p}): the "
            "sampler's log-probs under top-p are not the policy's"
        ),
    ),
    Refusal(
        "workers_divide_tasks",
        ("rollout.workers", "rollout.tasks_per_iter"),
        lambda s: s.cfg.rollout.workers > 0 and s.cfg.rollout.tasks_per_iter % s.cfg.rollout.workers != 0,
        lambda s: (
            f"rollout.workers={s.cfg.rollout.workers} must divide tasks_per_iter={s.cfg.rollout.tasks_per_iter} "
            "(each worker collects an equal slice of the tasks)"
        ),
    ),
    Refusal(
        "scaffold_drop_in_process_single_agent",
        ("rollout.scaffold_drop", "rollout.env_server", "rollout.env_id"),
        lambda s: s.cfg.rollout.scaffold_drop is not None and (s.cfg.rollout.env_server is not None or s.team),
        lambda s: (
            "rollout.scaffold_drop reaches in-process and Ray envs only: unset rollout.env_server "
            "(a served env takes its drop_prob in env_kwargs.scaffold) and use a single-agent id"
        ),
    ),
    Refusal(
        "async_needs_vllm",
        ("rollout.mode", "rollout.backend"),
        lambda s: s.cfg.rollout.mode == "async" and s.cfg.rollout.backend != "vllm",
        _async(
            lambda s: (
                f"backend: {s.cfg.rollout.backend!r}: the transformers backend has no engine to keep full "
                "and stays lockstep; set rollout.backend: vllm"
            )
        ),
    ),
    Refusal(
        "async_without_workers",
        ("rollout.mode", "rollout.workers"),
        lambda s: s.cfg.rollout.mode == "async" and s.cfg.rollout.workers > 0,
        _async(
            lambda s: (
                f"workers: {s.cfg.rollout.workers}: Ray rollout workers run the lockstep rollout; "
                "set rollout.workers: 0"
            )
        ),
    ),
    Refusal(
        "async_without_env_server",
        ("rollout.mode", "rollout.env_server"),
        lambda s: s.cfg.rollout.mode == "async" and s.cfg.rollout.env_server is not None,
        _async(lambda s: "env_server: the asynchronous rollout steps in-process envs; unset rollout.env_server"),
    ),
    Refusal(
        "async_single_agent",
        ("rollout.mode", "rollout.env_id"),
        lambda s: s.cfg.rollout.mode == "async" and s.team,
        _async(lambda s: f"the multi-agent env_id {s.cfg.rollout.env_id!r}: its team rollout is lockstep"),
    ),
    Refusal(
        "env_server_single_agent",
        ("rollout.env_server", "rollout.env_id"),
        lambda s: s.cfg.rollout.env_server is not None and s.team,
        lambda s: (
            f"rollout.env_server serves single-agent envs; {s.cfg.rollout.env_id!r} is a multi-agent id: "
            "unset env_server"
        ),
    ),
    # the algorithm and scale sections' keys among themselves
    Refusal(
        "soft_overlong_needs_lengths",
        ("algorithm.overlong", "algorithm.overlong_max_tokens", "algorithm.overlong_buffer"),
        lambda s: (
            s.cfg.algorithm.overlong == "soft"
            and not (
                s.cfg.algorithm.overlong_max_tokens is not None
                and s.cfg.algorithm.overlong_buffer is not None
                and 0 < s.cfg.algorithm.overlong_buffer <= s.cfg.algorithm.overlong_max_tokens
            )
        ),
        lambda s: (
            f"algorithm.overlong: soft needs overlong_max_tokens (L_max) and overlong_buffer (L_cache) with "
            f"0 < overlong_buffer <= overlong_max_tokens, got {s.cfg.algorithm.overlong_max_tokens} and "
            f"{s.cfg.algorithm.overlong_buffer} (DAPO used L_max 20480 and L_cache 4096 tokens)"
        ),
    ),
    Refusal(
        "overlong_lengths_need_soft",
        ("algorithm.overlong_max_tokens", "algorithm.overlong_buffer", "algorithm.overlong"),
        lambda s: (
            s.cfg.algorithm.overlong != "soft"
            and (s.cfg.algorithm.overlong_max_tokens is not None or s.cfg.algorithm.overlong_buffer is not None)
        ),
        lambda s: (
            f"algorithm.overlong_max_tokens and overlong_buffer apply to overlong: soft only (overlong is "
            f"{s.cfg.algorithm.overlong!r}): set overlong: soft or remove them"
        ),
    ),
    Refusal(
        "lora_needs_alpha",
        ("scale.lora_r", "scale.lora_alpha"),
        lambda s: s.cfg.scale.lora_r > 0 and s.cfg.scale.lora_alpha <= 0,
        lambda s: f"lora_alpha must be positive, got {s.cfg.scale.lora_alpha}",
    ),
    # across sections
    Refusal(
        "minibatch_divides_batch",
        ("algorithm.minibatch_size", "rollout.tasks_per_iter", "rollout.group_size"),
        lambda s: s.cfg.rollout.batch_size % s.cfg.algorithm.minibatch_size != 0,
        lambda s: (
            f"algorithm.minibatch_size={s.cfg.algorithm.minibatch_size} must divide the batch of "
            f"rollout.tasks_per_iter * rollout.group_size = {s.cfg.rollout.tasks_per_iter} * "
            f"{s.cfg.rollout.group_size} = {s.cfg.rollout.batch_size}"
        ),
    ),
    Refusal(
        "groups_need_two",
        ("rollout.group_size", "algorithm.adv_estimator"),
        lambda s: s.cfg.algorithm.needs_groups and s.cfg.rollout.group_size < 2,
        lambda s: (
            f"rollout.group_size must be at least 2 for adv_estimator={s.cfg.algorithm.adv_estimator!r}, got "
            f"{s.cfg.rollout.group_size} (it compares each trajectory with the others of its group: "
            "registered with needs_groups=True)"
        ),
    ),
    Refusal(
        "dynamic_sampling_needs_groups",
        ("algorithm.dynamic_sampling", "algorithm.adv_estimator"),
        lambda s: s.cfg.algorithm.dynamic_sampling and not s.cfg.algorithm.needs_groups,
        _dynamic(
            lambda s: (
                f"adv_estimator: {s.cfg.algorithm.adv_estimator!r}, which has no groups to compare (use grpo or rloo)"
            )
        ),
    ),
    Refusal(
        "dynamic_sampling_without_staleness",
        ("algorithm.dynamic_sampling", "rollout.max_staleness"),
        lambda s: s.cfg.algorithm.dynamic_sampling and s.cfg.rollout.max_staleness > 0,
        _dynamic(
            lambda s: (
                "rollout.max_staleness: 1 (the next rollout runs during the update; a refill would "
                "race it): set rollout.max_staleness: 0"
            )
        ),
    ),
    Refusal(
        "dynamic_sampling_without_workers",
        ("algorithm.dynamic_sampling", "rollout.workers"),
        lambda s: s.cfg.algorithm.dynamic_sampling and s.cfg.rollout.workers > 0,
        _dynamic(
            lambda s: (
                f"rollout.workers: {s.cfg.rollout.workers} (Ray workers take whole shares of a fixed "
                "batch): set rollout.workers: 0"
            )
        ),
    ),
    Refusal(
        "dynamic_sampling_without_fsdp",
        ("algorithm.dynamic_sampling", "scale.fsdp"),
        lambda s: s.cfg.algorithm.dynamic_sampling and s.cfg.scale.fsdp,
        _dynamic(lambda s: "scale.fsdp: true (each rank collects its own share): set scale.fsdp: false"),
    ),
    Refusal(
        "microbatches_need_agg_units",
        ("scale.max_tokens_per_microbatch", "algorithm.loss_agg"),
        lambda s: (
            s.cfg.scale.max_tokens_per_microbatch is not None
            and agg_units_problem(s.cfg.algorithm.loss_agg) is not None
        ),
        lambda s: agg_units_problem(s.cfg.algorithm.loss_agg),
    ),
    Refusal(
        "fsdp_needs_hf",
        ("scale.fsdp", "rollout.backend"),
        lambda s: s.cfg.scale.fsdp and s.cfg.rollout.backend != "hf",
        _fsdp(
            lambda s: (
                f"backend: {s.cfg.rollout.backend!r}; the sharded trainer generates with backend: hf (each "
                "rank gathers the full policy for its share of the rollout)"
            )
        ),
    ),
    Refusal(
        "fsdp_without_workers",
        ("scale.fsdp", "rollout.workers"),
        lambda s: s.cfg.scale.fsdp and s.cfg.rollout.workers > 0,
        _fsdp(
            lambda s: (
                f"rollout.workers: {s.cfg.rollout.workers}; set it to 0 (each torchrun rank collects its "
                "own share of the rollout)"
            )
        ),
    ),
    Refusal(
        "fsdp_without_lora",
        ("scale.fsdp", "scale.lora_r"),
        lambda s: s.cfg.scale.fsdp and s.cfg.scale.lora_r > 0,
        _fsdp(
            lambda s: (
                f"lora_r: {s.cfg.scale.lora_r}; LoRA under FSDP is not implemented, set lora_r: 0 (or "
                "fsdp: false: LoRA fits the 3B model on one GPU, docs/scaling.md)"
            )
        ),
    ),
    Refusal(
        "fsdp_needs_agg_units",
        ("scale.fsdp", "algorithm.loss_agg"),
        lambda s: s.cfg.scale.fsdp and agg_units_problem(s.cfg.algorithm.loss_agg) is not None,
        lambda s: "fsdp: true: " + agg_units_problem(s.cfg.algorithm.loss_agg),
    ),
    Refusal(
        "staleness_without_fsdp",
        ("rollout.max_staleness", "scale.fsdp"),
        lambda s: s.cfg.rollout.max_staleness > 0 and s.cfg.scale.fsdp,
        lambda s: (
            "rollout.max_staleness: 1 does not combine with scale.fsdp: true (the overlapped rollout runs "
            "beside a single learner process); set rollout.max_staleness: 0"
        ),
    ),
    Refusal(
        "bf16_needs_float32_weights",
        ("scale.mixed_precision", "model.dtype", "scale.lora_r"),
        lambda s: s.cfg.scale.mixed_precision == "bf16" and s.cfg.model.dtype == "bfloat16" and s.cfg.scale.lora_r == 0,
        lambda s: (
            "mixed_precision: bf16 keeps float32 master weights and optimizer state: set model.dtype: float32 "
            "(dtype: bfloat16 is allowed with LoRA, lora_r > 0, where the bf16 base is frozen and the adapters "
            "are float32)"
        ),
    ),
    # what the parts run
    Refusal(
        "team_without_fsdp",
        ("rollout.env_id", "scale.fsdp"),
        lambda s: s.team and s.cfg.scale.fsdp,
        lambda s: (
            f"scale.fsdp: true with the multi-agent env_id {s.cfg.rollout.env_id!r}: the multi-agent trainer "
            "runs in one process; set scale.fsdp: false"
        ),
    ),
    Refusal(
        "team_without_staleness",
        ("rollout.env_id", "rollout.max_staleness"),
        lambda s: s.team and s.cfg.rollout.max_staleness > 0,
        lambda s: (
            f"rollout.max_staleness: 1 is not supported with the multi-agent env {s.cfg.rollout.env_id!r} "
            "(its agents share one team rollout); set rollout.max_staleness: 0"
        ),
    ),
    Refusal(
        "team_without_workers",
        ("rollout.env_id", "rollout.workers"),
        lambda s: s.team and s.cfg.rollout.workers > 0,
        lambda s: (
            f"rollout.workers: {s.cfg.rollout.workers} is not supported with the multi-agent env "
            f"{s.cfg.rollout.env_id!r}; set rollout.workers: 0"
        ),
    ),
    Refusal(
        "fsdp_needs_sharding_strategy",
        ("scale.fsdp",),
        lambda s: s.cfg.scale.fsdp and s.parallel is not None and not s.parallel.shards_models,
        lambda s: (
            f"scale.fsdp: true needs a parallelism strategy that shards the models (trainers.distributed.FSDP, "
            f"which choose_parts picks); {type(s.parallel).__name__} keeps them whole. Build the trainer with "
            "trainers.compose.build_trainer(cfg), or launch trainers/train_ppo.py or train_grpo.py under "
            "torchrun (docs/scaling.md)"
        ),
    ),
    Refusal(
        "command_runs_the_algo",
        ("algorithm.algo",),
        lambda s: s.script is not None and s.cfg.algorithm.algo not in FAMILIES[s.script],
        _script_message,
    ),
    Refusal(
        "fsdp_shares_even",
        ("scale.fsdp", "rollout.tasks_per_iter", "algorithm.minibatch_size"),
        lambda s: s.cfg.scale.fsdp and _uneven(s) is not None,
        lambda s: (
            f"fsdp: true with {s.world} processes: {_uneven(s)} must be a multiple of the number of processes "
            "(torchrun --nproc_per_node x --nnodes) so that every rank gets an equal share"
        ),
    ),
)


def check(cfg: TrainConfig, *, parallel: Any = None, script: str | None = None, prog: str = "") -> None:
    """Raise ``ConfigError`` with the first row of ``REFUSALS`` that applies to ``cfg`` (and, when
    given, the strategy ``parallel``, the command's algorithm family ``script`` and its name ``prog``)."""
    setting = Setting(cfg, parallel, script, prog)
    for rule in REFUSALS:
        if rule.when(setting):
            raise ConfigError(rule.message(setting))


@dataclass(frozen=True)
class Parts:
    """What a config selects: a rollout source class, a parallelism strategy class and an overlap
    part (``Prefetching``, or None: each rollout waits for the update before it)."""

    rollout: type
    parallel: type
    overlap: type | None = None


def choose_parts(cfg: TrainConfig) -> Parts:
    """The parts ``cfg`` asks for (after ``check``): a multi-agent ``rollout.env_id``: ``TeamRollout``;
    ``rollout.workers > 0``: ``RayRollout``; ``rollout.mode: async``: ``AsyncRollout``; else
    ``LocalRollout``. ``scale.fsdp: true``: ``FSDP``, else ``SingleProcess``. ``rollout.max_staleness:
    1``: ``Prefetching`` around the source."""
    check(cfg)
    r = cfg.rollout
    rollout = (
        TeamRollout
        if r.env_id in agent_gym.MULTIAGENT_IDS
        else RayRollout
        if r.workers
        else AsyncRollout
        if r.mode == "async"
        else LocalRollout
    )
    return Parts(
        rollout=rollout,
        parallel=FSDP if cfg.scale.fsdp else SingleProcess,
        overlap=Prefetching if r.max_staleness else None,
    )


def build_trainer(
    cfg: TrainConfig,
    resume: bool = False,
    *,
    rollout: type | None = None,
    parallel: Parallelism | None = None,
    trainer_cls: type[Trainer] = Trainer,
) -> Trainer:
    """A trainer given the parts ``choose_parts(cfg)`` picks; ``rollout`` (a source class) and
    ``parallel`` (a strategy instance) replace the picked ones (the overlap part still wraps a given
    source), ``trainer_cls`` a subclass."""
    check(cfg, parallel=parallel)
    parts = choose_parts(cfg)
    return trainer_cls(
        cfg,
        resume,
        rollout=rollout or parts.rollout,
        parallel=parallel if parallel is not None else parts.parallel(cfg),
        overlap=parts.overlap,
    )


def run(cfg: TrainConfig, resume: bool = False) -> dict[str, float]:
    """Train ``cfg`` (``resume``: from its run directory's newest checkpoint); the last iteration's metrics."""
    trainer = build_trainer(cfg, resume=resume)
    trainer.setup()
    try:
        return trainer.train()
    finally:
        trainer.cleanup()


def resume_config(run_dir: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """The config a run saved in ``run_dir/config.yaml`` (flat keys of old runs converted, with the
    deprecation warning), under ``overrides``. The run continues in ``run_dir`` itself, whatever
    run_dir its config.yaml names (a run directory moved or copied since, to fork a run, resumes
    where it is now, not in the directory it was started in); an override naming another run_dir
    is refused."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"--resume {run_dir}: no config.yaml there; is it a run directory?")
    overrides = dict(overrides or {})
    for key in ("run_dir", "run.run_dir"):
        if key in overrides and Path(str(overrides.pop(key))).resolve() != Path(run_dir).resolve():
            raise ConfigError(
                f"--resume {run_dir} continues the run in {run_dir}; the override {key}= names another "
                f"directory. To continue the run elsewhere, copy {run_dir} there and --resume the copy."
            )
    data = yaml.safe_load(path.read_text())
    data.update(overrides)
    cfg = from_dict(data, str(path))
    cfg.run.run_dir = str(run_dir)
    return cfg


__all__ = [
    "FAMILIES",
    "REFUSALS",
    "Parts",
    "Refusal",
    "Setting",
    "build_trainer",
    "check",
    "choose_parts",
    "resume_config",
    "run",
]
