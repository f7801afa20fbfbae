"""How the trainer's work is spread over processes: a *parallelism strategy* the ``Trainer`` is given
(``trainers.compose.choose_parts`` picks it from the config).

The loop is written once; every place where one process and several sharded processes differ is a
call on the strategy:

- ``start`` / ``close``: the process group (none in one process);
- ``shard(policy, critic, ref)``: split the models across processes (one process keeps them whole);
- ``share(tasks, group_size)``: this process's slice of the iteration's tasks and the global index of
  its first sub-env; ``gather_rollout``: every process's trajectories, in process order;
- ``full_params(*modules)``: a context in which the modules' full parameters are present (generation,
  evaluation, scoring);
- ``score_rows(batch, model, fn)``: ``fn`` on this process's rows of the batch, then every process's rows;
- ``microbatches(batch, idx, ...)``: this process's ``(micro-batch, weight)`` pairs of minibatch ``idx``;
- ``reduce_metrics``: a process's update metrics -> the minibatch's; ``any_rank(flag)``: a flag any
  process raised (stop, a non-finite loss) stops every process;
- ``full_state`` / ``load_full_state``: a model's and its optimizer's state dicts in the
  single-process layout (checkpoints load either way);
- ``is_main``: the process that writes files and evaluates.

``SingleProcess`` is the identity of each; ``trainers.distributed.FSDP`` runs under torchrun with
FSDP2 (its module docstring says how each step keeps the single-process result).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Protocol, Sequence

import torch
from torch import nn

from trainers import scale
from trainers.rollout import RolloutBatch, RolloutTimes, Trajectory


class Parallelism(Protocol):
    """The strategy a ``Trainer`` runs its loop with (the module docstring)."""

    rank: int
    world: int
    shards_models: bool  # True when ``shard`` splits the models (``fsdp: true`` needs such a strategy)

    @property
    def is_main(self) -> bool: ...

    def start(self) -> None: ...

    def close(self) -> None: ...

    def shard(self, policy: nn.Module, critic: nn.Module | None, ref: Any) -> None: ...

    def share(self, tasks: Sequence[int], group_size: int) -> tuple[list[int], int]: ...

    def gather_rollout(self, trajs: list[Trajectory], times: RolloutTimes) -> tuple[list[Trajectory], RolloutTimes]: ...

    def full_params(self, *modules: Any) -> ContextManager[None]: ...

    def score_rows(
        self, batch: RolloutBatch, model: Any, fn: Callable[[RolloutBatch], torch.Tensor]
    ) -> torch.Tensor: ...

    def microbatches(
        self, batch: RolloutBatch, idx: torch.Tensor, max_tokens: int | None, agg: str, by_prefix: bool = False
    ) -> list[tuple[RolloutBatch, float]]: ...

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]: ...

    def any_rank(self, flag: bool) -> bool: ...

    def full_state(self, model: nn.Module, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]: ...

    def load_full_state(
        self, model: nn.Module, opt: torch.optim.Optimizer, msd: dict[str, Any], osd: dict[str, Any]
    ) -> None: ...


class SingleProcess:
    """Everything in this process: models whole, the whole batch, no collectives."""

    rank, world, shards_models = 0, 1, False

    def __init__(self, cfg: Any = None):
        pass

    @property
    def is_main(self) -> bool:
        return True

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def shard(self, policy: nn.Module, critic: nn.Module | None, ref: Any) -> None:
        pass

    def share(self, tasks: Sequence[int], group_size: int) -> tuple[list[int], int]:
        return list(tasks), 0

    def gather_rollout(self, trajs: list[Trajectory], times: RolloutTimes) -> tuple[list[Trajectory], RolloutTimes]:
        return trajs, times

    def full_params(self, *modules: Any) -> ContextManager[None]:
        return contextlib.nullcontext()

    def score_rows(self, batch: RolloutBatch, model: Any, fn: Callable[[RolloutBatch], torch.Tensor]) -> torch.Tensor:
        return fn(batch)

    def microbatches(
        self, batch: RolloutBatch, idx: torch.Tensor, max_tokens: int | None, agg: str, by_prefix: bool = False
    ) -> list[tuple[RolloutBatch, float]]:
        return scale.microbatches(batch.select(idx), max_tokens, agg, by_prefix)

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return metrics

    def any_rank(self, flag: bool) -> bool:
        return bool(flag)

    def full_state(self, model: nn.Module, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        return model.state_dict(), opt.state_dict()

    def load_full_state(
        self, model: nn.Module, opt: torch.optim.Optimizer, msd: dict[str, Any], osd: dict[str, Any]
    ) -> None:
        model.load_state_dict(msd)
        opt.load_state_dict(osd)


__all__ = ["Parallelism", "SingleProcess"]
