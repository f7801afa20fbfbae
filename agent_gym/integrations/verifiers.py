"""verifiers (Prime Intellect) environment package for any registered env: ``load_environment``.

    # .venv-verifiers (`make verifiers`); any OpenAI-compatible server as the model
    vf-eval agent-gym-verifiers --env.taskset.env-id AgentR1/FactChain-v0 \\
        --env.taskset.env-kwargs '{"max_turns": 3}' --env.taskset.max-tokens 40 \\
        --model NAME --client.base-url http://127.0.0.1:8000/v1 --sampling.temperature 0 \\
        -n 20 --no-push --no-rich -o runs/vf

    from agent_gym.integrations.verifiers import load_environment
    env = load_environment("AgentR1/FactChain-v0", max_turns=3)   # a verifiers.v1.Env

Built on verifiers 0.4's v1 stack (``verifiers.v1``), where an environment is a ``Taskset`` (the
rows), an ``Env`` (how one task becomes one episode: ``run(task, agents)``, the multi-turn
surface) and the agents' ``Harness`` (the program that calls the model); the rubric is the
task's ``@vf.reward`` / ``@vf.metric`` hooks, run on each finished trace. Here:

- :class:`AgentGymTaskset`: row ``k`` of the env is the task with ``idx`` ``k``; its prompt is the
  env's opening messages (``ChatView.reset(options={"task_index": k})``), its ``info`` the request
  settings the harness sends (the env's tool schemas, stop ids, the row's seed ``seed + k``).
- :class:`AgentGymEnv`: ``run`` steps a :class:`~agent_gym.wrappers.ChatView` of the env with each
  assistant reply, as ``trainers/evaluate.py --openai-base-url`` does
  (:func:`agent_gym.integrations.openai_policy.play_row`), and hands the env's next
  conversation to the agent's next turn, until the env terminates or truncates. The env's
  ``Episode`` (its reward, its own answer scores, success, and the whole ``Episode`` as
  ``dataclasses.asdict`` gives it: token ids, loss mask, step rewards) is kept on the trace's
  ``info["agent_gym"]``, with the final conversation (``messages``).
- :class:`AgentGymTask`: the rubric. ``env_reward`` (weight 1) is the episode's total reward as
  the env computed it; the metrics are the env's answer scores (``em``, ``f1``... whatever its
  scorer returns; 0 for an episode without an answer, as the trainer's summaries count it),
  ``success``, ``turns``, ``truncated``. No score is recomputed here: the env's own scorer decided
  them on its own step.
- :class:`AgentGymHarness`: a tool-less chat loop run in process (verifiers' harness contract
  allows it: every model call goes through the interception endpoint the rollout hands it). Each
  segment is one ``/chat/completions`` request with the env's messages verbatim and the body
  the OpenAI-compatible policy sends (``temperature`` 0 and ``max_tokens`` unless the run's
  ``--sampling.*`` overrides them, ``seed``, the tool schemas with ``tool_choice: none``, and with
  ``same_tokenizer`` vLLM's ``stop_token_ids`` and ``skip_special_tokens: false``), so a greedy
  run scores as ``evaluate.py --openai-base-url`` does on the same rows. (verifiers' built-in
  ``null`` harness would run a PEP 723 chat program through ``uv``, which resolves its packages
  from the network on first use, and sends no ``tools``, so the model would see another prompt.)

verifiers finds plugins by module name (``vf-eval <taskset-id>`` imports the id with ``-`` as ``_``);
a dotted id cannot be used (0.4.0 looks for ``verifiers.v1.tasksets.<id>`` first, and that lookup
raises on a dotted name), so the top-level package ``agent_gym_verifiers`` re-exports these
classes: its id is ``agent-gym-verifiers``. The package needs ``verifiers`` (0.4):
``make verifiers`` builds ``.venv-verifiers`` with it; the rest of ``agent_gym`` never imports
this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.wrappers import ChatView

try:
    import verifiers.v1 as vf
    from verifiers.v1.types import content_text
except ImportError as e:  # pragma: no cover - depends on the venv
    raise ImportError(
        f"agent_gym.integrations.verifiers needs Prime Intellect's `verifiers` package, 0.4 ({e}). "
        "`make verifiers` builds .venv-verifiers with it (scripts/setup_verifiers.sh), or "
        "`pip install verifiers==0.4.0` in a venv of its own (its dependencies are many)."
    ) from e

TASKSET_ID = "agent-gym-verifiers"
"""The id ``vf-eval`` and ``--env.taskset.id`` take: the module ``agent_gym_verifiers``."""


# -- the rows ------------------------------------------------------------------------------------


class AgentGymTasksetConfig(vf.TasksetConfig):
    """``--env.taskset.*``: which env, its kwargs, and the request settings of every turn."""

    id: str = TASKSET_ID
    env_id: str = "AgentR1/FactChain-v0"
    """A registered env id (``agent_gym`` registers them on import)."""
    env_kwargs: dict[str, Any] = {}
    """``gym.make`` kwargs (the same as ``evaluate.py --env-kwargs``)."""
    rows: int | None = None
    """Rows ``0 .. rows-1``; None: every row the env has (``num_tasks()``), or without end for a
    generated env (then bound the run with ``-n``)."""
    seed: int = 0
    """Row ``k``'s requests carry ``seed + k`` (``evaluate.py --seed``)."""
    max_tokens: int = 256
    """Tokens per reply (``evaluate.py --max-turn-tokens``); ``--sampling.max-tokens`` overrides."""
    same_tokenizer: bool = False
    """The server runs the env's tokenizer (``evaluate.py --openai-same-tokenizer``): send vLLM's
    ``stop_token_ids`` (the env's) and ``skip_special_tokens: false``."""
    extra_body: dict[str, Any] = {}
    """More request fields (``evaluate.py --openai-extra-body``)."""


class AgentGymData(vf.TaskData):
    info: dict[str, Any]
    """``row``, ``task_id`` and ``request``: the request settings of this row's turns."""


class AgentGymTask(vf.Task[AgentGymData, vf.State, vf.TaskConfig]):
    """One row; its ``@vf.reward``/``@vf.metric`` hooks are the rubric (module docstring)."""

    @staticmethod
    def _episode(trace: vf.Trace) -> dict[str, Any]:
        ep = trace.info.get("agent_gym")
        if not isinstance(ep, dict):
            raise ValueError(
                "the trace holds no agent_gym episode: its env run ended before the env "
                "terminated or truncated (see the trace's errors)"
            )
        return ep

    @vf.reward
    async def env_reward(self, trace: vf.Trace) -> float:
        """The episode's total reward, as the env computed it (the sum of its step rewards)."""
        return float(self._episode(trace)["reward"])

    @vf.metric
    async def env_scores(self, trace: vf.Trace) -> dict[str, float]:
        """The env's own answer scores (``em``, ``f1``...; 0 for an episode without an answer, as the
        trainer's summaries count it), ``success``, ``turns``, ``truncated``."""
        ep = self._episode(trace)
        out = {k: float(v) for k, v in ep["answer_scores"].items()}
        out.update(
            success=float(ep["success"]), turns=float(ep["turns"]), truncated=float(ep["truncation_reason"] is not None)
        )
        return out


def _make_view(env_id: str, env_kwargs: dict[str, Any]):
    try:
        view = ChatView(gym.make(env_id, **env_kwargs))
    except gym.error.Error as e:
        raise ValueError(f"--env.taskset.env-id {env_id!r}: {e}") from e
    if view.tool_env.scaffold is not None:
        view.close()
        raise ValueError(
            f"--env.taskset.env-kwargs: {env_id} is scaffolded (scaffold: ...), and a verifiers agent "
            "cannot prefill its assistant turns or stop them at the slot's strings; drop the scaffold "
            "(scaffold: null), or evaluate the scaffolded env with trainers/evaluate.py "
            "(--openai-base-url with --openai-same-tokenizer for a vLLM server)"
        )
    return view


def _request(view: Any, row: int, cfg: AgentGymTasksetConfig) -> dict[str, Any]:
    te = view.tool_env
    extra = dict(cfg.extra_body)
    if cfg.same_tokenizer:
        extra.update({"stop_token_ids": [int(t) for t in te.stop_token_ids or []], "skip_special_tokens": False})
    return {
        "tools": te.renderer.tools or None,
        "seed": cfg.seed + row,
        "max_tokens": cfg.max_tokens,
        "temperature": 0.0,
        "extra_body": extra,
    }


class AgentGymTaskset(vf.Taskset[AgentGymTask, AgentGymTasksetConfig]):
    def load(self) -> Iterator[AgentGymTask]:
        cfg = self.config
        if cfg.max_tokens < 1:
            raise ValueError(f"--env.taskset.max-tokens must be at least 1, got {cfg.max_tokens}")
        view = _make_view(cfg.env_id, cfg.env_kwargs)
        try:
            try:
                n = int(view.tool_env.num_tasks())
            except NotImplementedError:  # a generated env: rows without end
                n = None
            rows = n if cfg.rows is None else (cfg.rows if n is None else min(cfg.rows, n))
            k = 0
            while rows is None or k < rows:
                msgs, info = view.reset(options={"task_index": k})
                tid = str(info.get("task_id", k))
                yield AgentGymTask(
                    AgentGymData(
                        id=tid,
                        name=f"{cfg.env_id}#{k}",
                        prompt=msgs,
                        info={"row": k, "task_id": tid, "request": _request(view, k, cfg)},
                    ),
                    cfg.task,
                )
                k += 1
        finally:
            view.close()

    @property
    def bounded(self) -> bool:
        if self._bounded is not None:
            return self._bounded
        if self.config.rows is not None:
            return True
        view = _make_view(self.config.env_id, self.config.env_kwargs)
        try:
            view.tool_env.num_tasks()
            return True
        except NotImplementedError:
            return False
        finally:
            view.close()


# -- the model calls ---------------------------------------------------------------------------


class AgentGymHarnessConfig(vf.HarnessConfig):
    request_timeout: float = 300.0
    """Seconds for one chat request through the interception (to the model and back)."""


def _wire(m: Any) -> dict[str, Any]:
    """A message as the env's ``{role, content}`` dict (a typed one back to it, verbatim for text)."""
    if isinstance(m, dict):
        return {"role": m["role"], "content": m.get("content") or ""}
    c = m.content
    return {"role": m.role, "content": c if isinstance(c, str) else content_text(c) if c is not None else ""}


class AgentGymHarness(vf.Harness[AgentGymHarnessConfig]):
    """One chat request per segment, in process, through the rollout's interception endpoint.
    A turn's messages are the whole conversation (the env's own record of it), so a resumed
    segment sends them as they are instead of the trace's branch plus the new messages."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        import openai  # optional: the openai client (extra openai)

        req = data.info["request"]
        body: dict[str, Any] = {
            "model": ctx.model,
            "messages": [_wire(m) for m in data.prompt],
            "temperature": req["temperature"],
            "max_tokens": req["max_tokens"],
        }
        if req.get("tools"):
            body["tools"], body["tool_choice"] = req["tools"], "none"
        if req.get("seed") is not None:
            body["seed"] = int(req["seed"])
        client = openai.AsyncOpenAI(
            base_url=endpoint, api_key=secret, max_retries=0, timeout=self.config.request_timeout
        )
        try:
            await client.chat.completions.create(**body, extra_body=req.get("extra_body") or None)
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    async def resume(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, messages, tool_interception_url=None):
        return await self.launch(
            ctx, trace, runtime, endpoint, secret, mcp_urls, data.model_copy(update={"prompt": list(messages)})
        )


# -- the episode ---------------------------------------------------------------------------------


class AgentGymEnvConfig(vf.EnvConfig):
    taskset: AgentGymTasksetConfig = AgentGymTasksetConfig()
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The policy's seat: the in-process harness needs no sandbox, so the runtime is a local one."""


def _answer_scores(te: Any, ep: Any) -> dict[str, float]:
    """The episode's answer scores; for an episode without an answer, the names the env's scorer
    gives (its scores of an empty answer) at 0, as the trainer's summaries count them, so every
    trace of a run carries the same metrics."""
    if ep.answer_scores or ep.answer is not None:
        return {k: float(v) for k, v in ep.answer_scores.items()}
    try:
        names = te.score_answer("", te.task)
    except Exception:  # noqa: BLE001 - a scorer that refuses an empty answer: no names to report
        return {}
    return {k: 0.0 for k in names}


class AgentGymEnv(vf.Env[AgentGymEnvConfig]):
    """Steps the env's ``ChatView`` with each reply (module docstring). Envs are pooled: one per
    episode in flight, reused by the next."""

    def __init__(self, config: AgentGymEnvConfig) -> None:
        super().__init__(config)
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._make_lock = threading.Lock()

    def _acquire(self):
        with self._lock:
            if self._idle:
                return self._idle.pop()
        # One construction at a time: episodes start in worker threads, and a first
        # `from transformers import ...` in several threads at once fails (its lazy module is not
        # thread-safe).
        with self._make_lock:
            return _make_view(self.config.taskset.env_id, self.config.taskset.env_kwargs)

    def _release(self, view) -> None:
        with self._lock:
            self._idle.append(view)

    async def stop(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for v in idle:
            v.close()

    async def run(self, task: AgentGymTask, agents: vf.Agents) -> None:
        row = int(task.data.info["row"])
        view = await asyncio.to_thread(self._acquire)
        try:
            msgs, _ = await asyncio.to_thread(view.reset, options={"task_index": row})
            if [_wire(m) for m in task.data.prompt] != msgs:
                raise RuntimeError(
                    f"row {row} of {self.config.taskset.env_id} opened with other messages than "
                    "when the taskset was loaded: the env is not deterministic in its task_index"
                )
            async with agents.agent.interaction(task) as interaction:
                segment = await interaction.turn()
                while True:
                    if segment.terminated:
                        raise RuntimeError(
                            f"the agent's run ended before the env did (row {row}, turn "
                            f"{view.tool_env.turn + 1}): {interaction.trace.stop_condition}"
                        )
                    reply = next(
                        (m.content or "" for m in reversed(segment.messages) if isinstance(m, vf.AssistantMessage)), ""
                    )
                    msgs, _, term, trunc, info = await asyncio.to_thread(view.step, reply)
                    if term or trunc:
                        ep = info["trajectory"]
                        interaction.trace.info["agent_gym"] = {
                            "row": row,
                            "task_id": ep.task_id,
                            "reward": float(ep.reward),
                            "answer": ep.answer,
                            "answer_scores": _answer_scores(view.tool_env, ep),
                            "success": bool(ep.success),
                            "turns": int(ep.turns),
                            "truncation_reason": ep.truncation_reason,
                            "messages": msgs,
                            "episode": dataclasses.asdict(ep),
                        }
                        break
                    segment = await interaction.turn(msgs)
        finally:
            self._release(view)


def load_environment(
    env_id: str = "AgentR1/FactChain-v0",
    *,
    env_kwargs: dict[str, Any] | None = None,
    rows: int | None = None,
    seed: int = 0,
    max_tokens: int = 256,
    same_tokenizer: bool = False,
    extra_body: dict[str, Any] | None = None,
    **kwargs: Any,
) -> AgentGymEnv:
    """A verifiers ``Env`` of ``env_id``; ``kwargs`` are more ``gym.make`` kwargs (merged over
    ``env_kwargs``). Evaluate it with ``vf-eval`` (module docstring) or, in Python,
    ``verifiers.v1.cli.eval.runner.run_eval`` on an ``EvalConfig`` whose ``env`` is
    ``load_environment(...).config``."""
    taskset = AgentGymTasksetConfig(
        env_id=env_id,
        env_kwargs={**(env_kwargs or {}), **kwargs},
        rows=rows,
        seed=seed,
        max_tokens=max_tokens,
        same_tokenizer=same_tokenizer,
        extra_body=dict(extra_body or {}),
    )
    return AgentGymEnv(AgentGymEnvConfig(taskset=taskset))


__all__ = [
    "AgentGymEnv",
    "AgentGymEnvConfig",
    "AgentGymHarness",
    "AgentGymHarnessConfig",
    "AgentGymTask",
    "AgentGymTaskset",
    "AgentGymTasksetConfig",
    "AgentGymData",
    "TASKSET_ID",
    "load_environment",
]
