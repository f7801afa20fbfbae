"""Serve any registered env over OpenEnv (``openenv-core``): HTTP and WebSocket, one env per session.

    python -m agent_gym.serve AgentR1/FactChain-v0 --port 8000
    python -m agent_gym.serve --config configs/factchain_ppo_stream.yaml --env-kwargs '{"num_kbs": 4}'

The server is openenv-core's own (``openenv.core.env_server.create_app``, on uvicorn): each
WebSocket connection to ``/ws`` gets its own :class:`AgentGymEnvironment` (a fresh
``gym.make(env_id, **env_kwargs)``), at most ``--max-concurrent-envs`` at once; a closed or dropped
connection closes its env. openenv-core's stateless ``POST /reset`` builds a throwaway env per request
(reset, answered, closed) and is no use for a multi-turn episode; its ``POST /step`` would step such an
env without a reset, which has no meaning here: it answers **409** with ``{"detail": "...", "code":
"NO_EPISODE"}`` naming the WebSocket session to use instead. Use the WebSocket (the clients below).

The wire types (pydantic models, ``GET /schema`` lists them):

- :class:`AgentGymAction`: exactly one of ``token_ids`` (the ids one assistant turn generated, stop
  token included: the env's token-in/token-out contract, appended verbatim) or ``text`` (the reply
  text, under :class:`agent_gym.wrappers.TextView`'s rules: encoded as one whole turn and closed with
  the end-of-turn token; ``info["retokenized"]`` and ``info["retokenize_lossy"]`` say so).
- :class:`AgentGymObservation`: ``token_ids`` holds the ids appended since this session's previous
  observation (the **delta**; after a reset, the whole prompt), ``num_tokens`` the length of the whole
  context, so a client rebuilds the full ``input_ids`` by appending the deltas and checks it against
  ``num_tokens`` (:class:`RemoteToolEnv` does). ``text`` is TextView's observation (the whole context
  decoded), filled only in a session reset with ``view="text"``. ``reward``, ``done`` (terminated or
  truncated), ``terminated``, ``truncated``, ``info`` (the env's step or reset info, JSON-safe, without
  the trajectory) and, on the step that ends the episode, ``episode``: the env's
  :class:`agent_gym.episode.Episode` itself, which pydantic serializes and rebuilds as that dataclass.
- :class:`AgentGymState`: env id, task, turn, context length, whether the episode is over.

Errors: an action that is not an :class:`AgentGymAction` (both kinds, neither, a field of the wrong
type, an unknown field) is openenv-core's ``VALIDATION_ERROR``; one the env refuses (ids outside the
vocabulary, a step after the episode ended or before any reset) is an ``EXECUTION_ERROR`` with the
env's message. Either way nothing is stepped (``ToolEnv.step`` is transactional) and the session goes
on. A frame that is no message (a binary frame, JSON that is not an object: ``[1, 2]``, ``"s"``, ``42``)
costs one ``INVALID_JSON`` error reply, as invalid JSON does, and the session goes on (openenv-core alone
would end it). A client's close, or a dropped connection, closes the session's env and logs nothing above
debug. The clients raise :class:`AgentGymServerError` for these errors, and :class:`ConnectionError` when
the connection is gone (a server restart: the session and its episode are lost; connect again and reset).

No torch here: the server needs only the env and openenv-core (the ``openenv`` extra). This module is
the command line and the names; the server and clients live in ``agent_gym/_serve_impl.py`` and load on
first use of a name (``from agent_gym.serve import RemoteToolEnv``), so ``--help`` and a bad flag answer
before openenv-core's imports (gradio, FastMCP: seconds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_gym.cli_errors import ArgumentParser, command, prog_name, registered_ids_hint

if TYPE_CHECKING:  # loaded on first use (__getattr__ below)
    from agent_gym._serve_impl import (STATELESS_STEP, AgentGymAction, AgentGymClient, AgentGymEnvironment,  # noqa: F401
                                       AgentGymObservation, AgentGymServerError, AgentGymState, RemoteToolEnv,
                                       RemoteVectorEnv, WebSocketGuard, _jsonable, build_app, describe_env,
                                       frame_problem)


# -- the command line ------------------------------------------------------------------------------


def _load_mapping(text_or_path: str, what: str) -> dict[str, Any]:
    """A YAML/JSON mapping given inline or as a file path."""
    import yaml

    p = Path(text_or_path)
    src = p.read_text() if p.suffix in (".yaml", ".yml", ".json") and p.is_file() else text_or_path
    try:
        value = yaml.safe_load(src)
    except yaml.YAMLError as e:
        raise SystemExit(f"error: {what} is not valid YAML/JSON: {e}")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SystemExit(f"error: {what} must be a mapping (YAML or JSON object), got {type(value).__name__}")
    return value


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, str, dict[str, Any]]:
    ap = ArgumentParser(prog=prog_name("python -m agent_gym.serve", argv, module="agent_gym.serve"),
                        description=__doc__.split("\n\n")[0])
    ap.add_argument("env_id", nargs="?", help="a registered id (default: the config's env_id)")
    ap.add_argument("--config", help="a YAML file with env_id and env_kwargs, at the top or under rollout: (a trainer "
                                     "config works; other keys are ignored)")
    ap.add_argument("--env-kwargs", default=None, help="env kwargs as YAML/JSON, inline or a file; override the config's")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-concurrent-envs", type=int, default=64, help="sessions (one env each) at once")
    ap.add_argument("--session-timeout-s", type=float, default=None, help="close sessions idle this long (default: never)")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    if args.config and not Path(args.config).is_file():
        raise SystemExit(f"error: --config {args.config} is not a file; pass a YAML file with env_id and env_kwargs "
                         "(a trainer config works)")
    cfg = _load_mapping(args.config, "--config") if args.config else {}
    if isinstance(cfg.get("rollout"), dict):  # a sectioned trainer config: the env is the rollout section's
        cfg = {**cfg["rollout"], **{k: v for k, v in cfg.items() if k in ("env_id", "env_kwargs")}}
    env_id = args.env_id or cfg.get("env_id")
    if not env_id:
        raise SystemExit(f"error: name an env id ({ap.prog} AgentR1/FactChain-v0) or give a --config with env_id")
    kwargs = dict(cfg.get("env_kwargs") or {})
    if args.env_kwargs:
        kwargs.update(_load_mapping(args.env_kwargs, "--env-kwargs"))
    return args, env_id, kwargs


@command  # without argv (the command line): one line and exit 2 on a bad input (agent_gym/cli_errors.py)
def main(argv: list[str] | None = None) -> None:
    args, env_id, kwargs = parse_args(argv)  # before the heavy imports: --help and bad flags answer at once
    import agent_gym

    if env_id not in agent_gym.ENV_IDS:  # build_app checks it too; here it answers before openenv-core loads
        raise SystemExit(f"error: unknown env id {env_id!r}; {registered_ids_hint(env_id)}")
    import uvicorn

    from agent_gym._serve_impl import build_app, settle_heap

    try:
        app = build_app(env_id, kwargs, args.max_concurrent_envs, args.session_timeout_s)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}")
    settle_heap()  # this process is the server: its start-up objects leave the cyclic GC
    print(f"serving {env_id} on http://{args.host}:{args.port} (WebSocket /ws, "
          f"{args.max_concurrent_envs} sessions at most)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


# The server and clients (agent_gym/_serve_impl.py), loaded on first use.
_LAZY = ("AgentGymAction", "AgentGymClient", "AgentGymEnvironment", "AgentGymObservation", "AgentGymServerError",
         "AgentGymState", "RemoteToolEnv", "RemoteVectorEnv", "STATELESS_STEP", "WebSocketGuard", "build_app",
         "describe_env", "frame_problem", "_jsonable")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from agent_gym import _serve_impl

        value = getattr(_serve_impl, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["AgentGymAction", "AgentGymClient", "AgentGymEnvironment", "AgentGymObservation", "AgentGymServerError",
           "AgentGymState", "RemoteToolEnv", "RemoteVectorEnv", "build_app", "describe_env", "main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
