"""``clamp_tasks``: the evaluation's task list cut to an env's task count. Its own (torch-free)
module so that ``trainers.evaluate`` and ``trainers.integrations.openai_eval`` (which evaluate's
command line dispatches to) both use it without importing each other."""

from __future__ import annotations

import sys
from typing import Any


def clamp_tasks(tasks: list[int], env: Any) -> list[int]:
    """``tasks`` cut to the env's task count (a rows file may hold fewer rows than ``--tasks``),
    saying so on stderr."""
    try:
        n = int(env.num_tasks())
    except NotImplementedError:
        return tasks
    if len(tasks) > n:
        print(
            f"note: --tasks {len(tasks)} but {getattr(env, 'env_id', type(env).__name__)} has {n} tasks "
            f"(its data); evaluating all {n}",
            file=sys.stderr,
        )
        return tasks[:n]
    return tasks


__all__ = ["clamp_tasks"]
