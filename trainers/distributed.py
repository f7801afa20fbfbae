"""The Trainer on several processes with FSDP2: ``fsdp: true`` under ``torchrun``.

    torchrun --nproc_per_node N trainers/train_grpo.py --config CONFIG fsdp=true

``FSDP`` is the parallelism strategy (``trainers.parallel.Parallelism``) the ``Trainer`` is given
then; the loop is the single-process one. Each process (rank) holds a shard of every model (``trainers.scale.fsdp_wrap``: one FSDP unit
per decoder layer; the critic's backbone likewise; the KL reference too, frozen) and runs the
single-process loop on its share, so that one iteration of N ranks is the single-process
iteration on the same seed, up to float rounding:

- rollout: rank r collects tasks ``[r*k, (r+1)*k)`` of the iteration's ``tasks_per_iter``
  (k = tasks_per_iter / N) with sub-envs ``offset = r*k*group_size`` onwards, so seeds and group
  ids are those of the same sub-envs in one process, and a GRPO group never spans two ranks.
  Generation needs the whole policy: all ranks all-gather it (``full_params``: FSDP2's
  ``unshard`` with resharding after forward off) and generate from the gathered copy without
  further communication, however many turns and tokens each rank's episodes take. Then every
  rank receives every rank's trajectories (``all_gather_object``), in rank order: the
  single-process batch.
- scoring: the batch is built from all trajectories on every rank (same padding as one process);
  each rank scores its own rows (old and reference log-probs, values) under ``full_params`` and
  the rows are all-gathered. Advantages are then computed on the whole batch on every rank, so
  any statistic over the batch (GAE/REINFORCE++ whitening, GRPO groups) is the single-process
  one, with no change to the estimators.
- update: every rank draws the same minibatch order; rank r trains on rows ``idx[r::N]`` of each
  minibatch, its loss weighted by its share of the aggregation's denominator (loss tokens for
  token-mean, rows with a loss token for the seq-mean modes: ``scale.agg_units``) times N, since
  FSDP averages gradients over ranks: the summed gradient is the minibatch's. Micro-batches
  (``max_tokens_per_microbatch``) are cut within a rank's share; ranks that get fewer add
  zero-weight micro-batches so that every rank runs the same number of forward/backward passes
  (each all-gathers and reduce-scatters). Gradient clipping uses the global norm (DTensor).
  Logged update metrics are the share-weighted sums over ranks (``*_max``: the maximum).
- rank 0 alone writes config.yaml, metrics, trajectories and checkpoints, and evaluates (the other
  ranks wait at the next collective). A checkpoint holds full state dicts gathered from the shards
  (``torch.distributed.checkpoint.state_dict``) in the single-process layout: ``--resume`` works
  with or without fsdp, and ``state["policy"]`` loads into the plain model.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
from typing import Any, Callable, ContextManager, Iterator, NoReturn, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from trainers import scale
from trainers.config import ConfigError, TrainConfig
from trainers.rollout import RolloutBatch, RolloutTimes, Trajectory

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_env() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from the variables torchrun sets; a clear error without them."""
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise ConfigError(
            f"fsdp: true needs torchrun's process environment ({', '.join(missing)} not set). Launch one process per "
            "GPU (or CPU share) with: torchrun --nproc_per_node N trainers/train_grpo.py --config CONFIG fsdp=true "
            "(train_ppo.py likewise; docs/scaling.md has the multi-machine command), or set fsdp: false."
        )
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])


_ran_collectives = False  # set once this process has run a trainer in a process group


def exit_rank(rc: int) -> NoReturn:
    """End a torchrun rank with exit status ``rc``: flush the logs and std streams, then ``os._exit``,
    skipping the interpreter's finalization. Why: a gloo worker thread still holds the last
    collective's work for a moment after the collective returns, and dropping its tensors takes the
    GIL; if the interpreter is finalizing by then, the thread is ended inside a destructor and the
    process aborts ("terminate called without an active exception", SIGABRT; core dump of a rank
    of tests/trainers/test_fsdp_trainer.py: ``c10d::AsyncAllreduceWork::~AsyncAllreduceWork`` ->
    ``TensorImpl::decref_pyobject`` -> ``take_gil`` -> ``pthread_exit``). ``destroy_process_group``
    does not stop those threads. torchrun then reports the run as failed and stops the other ranks,
    rank 0 perhaps in the middle of its own clean-up. It happened in 4 of 47 runs of that test
    on the 2-core machine. Every file the trainer writes is closed by ``Trainer.cleanup`` before this."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written anyway
            pass
    os._exit(rc)


def ran_collectives() -> bool:
    """Whether this process ran a trainer in a torch.distributed process group (see ``exit_rank``)."""
    return _ran_collectives


def comm_device() -> torch.device:
    """Where collectives' tensors live: the rank's GPU under nccl, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce(values: list[float], op: Any = None) -> torch.Tensor:
    """``values`` reduced over ranks (sum, or ``op``), as a float64 CPU tensor."""
    t = torch.tensor(values, dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t.cpu()


def fsdp_modules(*modules: nn.Module | None) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule  # deferred: ~1 s of import, only with scale.fsdp

    return [m for mod in modules if mod is not None for m in mod.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_params(*modules: nn.Module | None) -> Iterator[None]:
    """Every FSDP unit of ``modules`` all-gathered (a collective: all ranks enter together) and kept
    whole until the exit, so forwards inside (generation, scoring, evaluation on one rank) run
    locally without further collectives. FSDP2's ``unshard`` plus ``set_reshard_after_forward(False)``,
    the documented way to run evaluation; on exit each unit is resharded (the full copies freed)
    and resharding after forward is restored (true; the root's default false is an optimisation
    only)."""
    units = fsdp_modules(*modules)
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
    for m in units:
        m.unshard()
    try:
        yield
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def shard_critic(critic: nn.Module, mesh: Any) -> nn.Module:
    """``Critic``: one FSDP unit per decoder layer of its backbone, the backbone, then the root (head)."""
    from torch.distributed.fsdp import fully_shard  # deferred: ~1 s of import, only with scale.fsdp

    for layer in critic.backbone.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(critic.backbone, mesh=mesh)
    fully_shard(critic, mesh=mesh)
    return critic


class FSDP:
    """The parallelism strategy of ``fsdp: true`` (``trainers.parallel.Parallelism``), one instance per
    torchrun process (the module docstring)."""

    shards_models = True

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rank, self.world, self.local_rank = torchrun_env()  # shares that do not divide: trainers.compose.REFUSALS
        self._own_group = False
        self.mesh = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def start(self) -> None:
        global _ran_collectives
        _ran_collectives = True
        cuda = torch.device(self.cfg.model.device).type == "cuda"
        if cuda:
            torch.cuda.set_device(self.local_rank)
        if not dist.is_initialized():
            # gloo's collectives time out; rank 0 evaluates alone while the others wait at the next one
            dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(hours=2))
            self._own_group = True
        self.mesh = init_device_mesh("cuda" if cuda else "cpu", (self.world,))

    def close(self) -> None:
        if self._own_group and dist.is_initialized():
            dist.destroy_process_group()

    def shard(self, policy: nn.Module, critic: nn.Module | None, ref: Any) -> None:
        scale.fsdp_wrap(policy, self.mesh, mp_bf16=False)
        if critic is not None:
            shard_critic(critic, self.mesh)
        if ref is not None:
            scale.fsdp_wrap(ref, self.mesh)

    def share(self, tasks: Sequence[int], group_size: int) -> tuple[list[int], int]:
        per = len(tasks) // self.world
        return list(tasks[self.rank * per : (self.rank + 1) * per]), self.rank * per * group_size

    def gather_rollout(self, trajs: list[Trajectory], times: RolloutTimes) -> tuple[list[Trajectory], RolloutTimes]:
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, (trajs, times))
        merged = RolloutTimes(
            generate_s=max(p[1].generate_s for p in parts),
            env_s=max(p[1].env_s for p in parts),
            generated_tokens=sum(p[1].generated_tokens for p in parts),
        )
        return [t for p in parts for t in p[0]], merged

    def full_params(self, *modules: Any) -> ContextManager[None]:
        return full_params(*modules)

    def score_rows(self, batch: RolloutBatch, model: Any, fn: Callable[[RolloutBatch], torch.Tensor]) -> torch.Tensor:
        """This rank's rows of ``batch`` scored under ``model``'s full parameters, then every rank's rows."""
        per = len(batch) // self.world
        mine = batch.select(torch.arange(self.rank * per, (self.rank + 1) * per))
        with full_params(model):
            out = fn(mine)
        dev = comm_device()
        parts = [torch.empty_like(out, device=dev) for _ in range(self.world)]
        dist.all_gather(parts, out.contiguous().to(dev))
        return torch.cat(parts).to(out.device)

    def microbatches(
        self, batch: RolloutBatch, idx: torch.Tensor, max_tokens: int | None, agg: str, by_prefix: bool = False
    ) -> list[tuple[RolloutBatch, float]]:
        units = scale.agg_units(agg)
        total = float(units(batch.loss_mask[idx]))
        mine = idx[self.rank :: self.world]
        share = float(units(batch.loss_mask[mine])) / total if total > 0 else 1.0 / self.world
        micro = [
            (mb, w * share * self.world) for mb, w in scale.microbatches(batch.select(mine), max_tokens, agg, by_prefix)
        ]
        n = all_reduce([len(micro)], dist.ReduceOp.MAX)[0]
        # zero-weight repeats keep every rank's number of forward/backward passes (collectives) equal
        return micro + [(micro[0][0], 0.0)] * (int(n) - len(micro))

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The rank's metrics carry weights ``share * world``: their sum over ranks / world is the minibatch's."""
        return reduce_metrics(metrics, self.world)

    def any_rank(self, flag: bool) -> bool:
        """Any rank's flag (rank 0's eval target or time limit, a Ctrl-C, a non-finite loss) holds for every rank."""
        return bool(all_reduce([1.0 if flag else 0.0], dist.ReduceOp.MAX)[0])

    def full_state(self, model: nn.Module, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        """Full (gathered) state dicts, complete on rank 0 only (a collective)."""
        return full_state(model, opt)

    def load_full_state(
        self, model: nn.Module, opt: torch.optim.Optimizer, msd: dict[str, Any], osd: dict[str, Any]
    ) -> None:
        """Every rank reads the checkpoint (a shared run_dir across machines) and keeps its shards."""
        load_full_state(model, opt, msd, osd)


def reduce_metrics(m: dict[str, float], world: int) -> dict[str, float]:
    """Sum over ranks / world (``*_max``: maximum over ranks); every rank passes the same keys."""
    keys = sorted(m)
    sums = all_reduce([0.0 if k.endswith("_max") else float(m[k]) for k in keys])
    maxes = all_reduce([float(m[k]) if k.endswith("_max") else 0.0 for k in keys], dist.ReduceOp.MAX)
    return {k: float(maxes[i]) if k.endswith("_max") else float(sums[i]) / world for i, k in enumerate(keys)}


def _param_names(model: nn.Module, opt: torch.optim.Optimizer) -> list[str]:
    """The optimizer's parameters by name, in the order of its (single-process) state-dict indices."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in opt.param_groups for p in g["params"]]


def full_state(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and optimizer's full state dicts on rank 0 (empty elsewhere), the optimizer's keyed
    by parameter index as ``Optimizer.state_dict`` is in one process. A collective."""
    from torch.distributed.checkpoint.state_dict import (  # deferred: ~1 s of import, only with scale.fsdp
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=options)
    osd = get_optimizer_state_dict(model, opt, options=options)
    if not msd:
        return {}, {}
    index = {n: i for i, n in enumerate(_param_names(model, opt))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]
    return msd, {"state": {index[n]: s for n, s in osd["state"].items()}, "param_groups": groups}


def load_full_state(model: nn.Module, opt: torch.optim.Optimizer, msd: dict[str, Any], osd: dict[str, Any]) -> None:
    """``full_state``'s inverse on every rank: each keeps its shards of the full state dicts."""
    from torch.distributed.checkpoint.state_dict import (  # deferred: ~1 s of import, only with scale.fsdp
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, msd, options=options)
    names = _param_names(model, opt)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]
    set_optimizer_state_dict(
        model, opt, {"state": {names[i]: s for i, s in osd["state"].items()}, "param_groups": groups}, options=options
    )


__all__ = ["FSDP", "full_params", "full_state", "load_full_state", "reduce_metrics", "shard_critic", "torchrun_env"]
