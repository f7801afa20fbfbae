"""A retriever shared by every env of a Ray cluster: one named actor holds the index.

With ``rollout_workers: N`` (trainers/ray_rollout.py) every worker builds its own envs, and a
corpus retriever (``bm25``, ``dense``, ``pyserini``) would build its own index in each worker
process: N copies of the index in memory, N index builds at start. Kind ``ray`` instead makes
each env a thin client of one named actor, ``RetrieverActor``, that builds the real retriever
once (``make_retriever(inner, **kwargs)``) and answers ``search`` for all of them::

    env_kwargs: {retriever: ray, retriever_kwargs: {inner: bm25}}           # QA envs add corpus=
    # or, with a corpus file:  retriever_kwargs: {inner: bm25, corpus: corpus.jsonl}

The first client to search creates the actor (``get_if_exists``, so two clients racing get one
actor); the rest find it by name. It is an ordinary (non-detached) actor of the job, so it ends
with the job or ``ray.shutdown()``. Its owner is the process that created it: if that process
dies (a killed rollout worker), Ray ends the actor too, and the next search of any client
creates it again (the index is rebuilt; the search is retried once). A search past
``timeout_s`` raises ``RetrieverError``, which the env turns into a tool error, as for the HTTP
client.

Ray must be running in the process that searches (a rollout worker, or a learner that started
the workers); the client never starts a cluster on its own.
"""

from __future__ import annotations

from typing import Any

from .base import RETRIEVERS, Passage, RetrieverError, check_k, make_retriever, require

__all__ = ["RayRetriever", "RetrieverActor"]


class RetrieverActor:
    """The actor's class (made remote by ``RayRetriever``): the real retriever, built once."""

    def __init__(self, kind: str, kwargs: dict[str, Any]):
        self.retriever = make_retriever(kind, **kwargs)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        return self.retriever.search(queries, k)


class RayRetriever:
    """``Retriever`` client of the cluster's shared ``RetrieverActor`` named ``name``.

    inner: the kind of retriever the actor builds (any registered kind but ``ray``); kwargs go to it.
    num_cpus: Ray CPUs the actor reserves (0: it takes no CPU slot from the rollout workers).
    """

    def __init__(
        self,
        inner: str = "bm25",
        name: str = "agent_gym_retriever",
        namespace: str = "agent_gym",
        timeout_s: float = 60.0,
        num_cpus: float = 0.0,
        **kwargs: Any,
    ):
        if inner == "ray" or inner not in RETRIEVERS:
            raise ValueError(
                f"retriever 'ray': inner={inner!r} must name the retriever the shared actor builds, one "
                f"of {', '.join(sorted(k for k in RETRIEVERS if k != 'ray'))}"
            )
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.inner, self.kwargs, self.name, self.namespace = inner, kwargs, name, namespace
        self.timeout_s, self.num_cpus = float(timeout_s), float(num_cpus)
        self._actor: Any = None

    def actor(self) -> Any:
        """The shared actor's handle, created on first use."""
        if self._actor is None:
            ray = require("ray", "scale")
            if not ray.is_initialized():
                raise RuntimeError(
                    "retriever 'ray' needs a running Ray session in this process (rollout_workers > 0 "
                    "starts one; or call ray.init() first); use retriever 'bm25' without Ray."
                )
            try:
                self._actor = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:  # not created yet
                self._actor = (
                    ray.remote(RetrieverActor)
                    .options(
                        name=self.name,
                        namespace=self.namespace,
                        get_if_exists=True,
                        num_cpus=self.num_cpus,
                        max_restarts=-1,
                    )
                    .remote(self.inner, self.kwargs)
                )
        return self._actor

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        check_k(k)
        ray = require("ray", "scale")
        try:
            return self._search(ray, list(queries), k)
        except ray.exceptions.RayActorError:  # its owner died with it: find or create it again, once
            self._actor = None
            try:
                return self._search(ray, list(queries), k)
            except ray.exceptions.RayActorError as e:
                raise RetrieverError(f"the shared retriever actor {self.name!r} died twice: {e}") from e

    def _search(self, ray: Any, queries: list[str], k: int) -> list[list[Passage]]:
        # max_task_retries=-1: a call waits through a restart of the actor's process.
        ref = self.actor().search.options(max_task_retries=-1).remote(queries, k)
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise RetrieverError(
                f"the shared retriever actor {self.name!r} did not answer in {self.timeout_s} s"
            ) from e
