"""Serve any registered env over OpenEnv (``openenv-core``): HTTP and WebSocket, one env per session.

    python -m agent_gym.serve AgentR1/FactChain-v0 --port 8000
    python -m agent_gym.serve --config configs/factchain_ppo_stream.yaml --env-kwargs '{"num_kbs": 4}'

This module is the command line (``agent-gym-serve``). The pieces live in modules of their own:

- :mod:`agent_gym.env_wire`: the wire types (``AgentGymAction``, ``AgentGymObservation``,
  ``AgentGymState``: pydantic models, ``GET /schema`` lists them);
- :mod:`agent_gym.env_server`: the server (openenv-core's ``create_app`` on uvicorn, each WebSocket
  session on ``/ws`` with its own env; ``build_app``), its routes, errors and rules;
- :mod:`agent_gym.env_client`: the clients (``AgentGymClient``, ``RemoteToolEnv``, ``RemoteVectorEnv``).

No torch here. The command parses its arguments and checks the env id before it imports the server,
so ``--help``, a bad flag and an unknown id answer before openenv-core's imports (gradio, FastMCP:
seconds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agent_gym.cli_errors import ArgumentParser, command, prog_name, registered_ids_hint
from agent_gym.env_ids import ENV_IDS


def _load_mapping(text_or_path: str, what: str) -> dict[str, Any]:
    """A YAML/JSON mapping given inline or as a file path."""
    import yaml  # deferred: yaml (~20 ms) stays out of --help; only --config and --env-kwargs need it

    p = Path(text_or_path)
    src = p.read_text() if p.suffix in (".yaml", ".yml", ".json") and p.is_file() else text_or_path
    try:
        value = yaml.safe_load(src)
    except yaml.YAMLError as e:
        raise SystemExit(f"error: {what} is not valid YAML/JSON: {e}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SystemExit(f"error: {what} must be a mapping (YAML or JSON object), got {type(value).__name__}")
    return value


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, str, dict[str, Any]]:
    ap = ArgumentParser(
        prog=prog_name("python -m agent_gym.serve", argv, module="agent_gym.serve"),
        description=__doc__.split("\n\n")[0],
    )
    ap.add_argument("env_id", nargs="?", help="a registered id (default: the config's env_id)")
    ap.add_argument(
        "--config",
        help="a YAML file with env_id and env_kwargs, at the top or under rollout: (a trainer "
        "config works; other keys are ignored)",
    )
    ap.add_argument(
        "--env-kwargs", default=None, help="env kwargs as YAML/JSON, inline or a file; override the config's"
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument(
        "--max-concurrent-envs",
        type=int,
        default=64,
        help="sessions (one env each) at once; a trainer needs rollout.tasks_per_iter * "
        "rollout.group_size of them (its client checks, GET /agent_gym/sessions)",
    )
    ap.add_argument(
        "--session-timeout-s", type=float, default=None, help="close sessions idle this long (default: never)"
    )
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    if args.config and not Path(args.config).is_file():
        raise SystemExit(
            f"error: --config {args.config} is not a file; pass a YAML file with env_id and env_kwargs "
            "(a trainer config works)"
        )
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
    if env_id not in ENV_IDS:  # build_app checks it too; here it answers before openenv-core loads
        raise SystemExit(f"error: unknown env id {env_id!r}; {registered_ids_hint(env_id)}")
    import uvicorn  # optional: uvicorn (extra openenv), after --help and the env id check

    from agent_gym.env_server import build_app, settle_heap  # optional: openenv-core (extra openenv), after --help

    try:
        app = build_app(env_id, kwargs, args.max_concurrent_envs, args.session_timeout_s)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}") from None
    settle_heap()  # this process is the server: its start-up objects leave the cyclic GC
    print(
        f"serving {env_id} on http://{args.host}:{args.port} (WebSocket /ws, "
        f"{args.max_concurrent_envs} sessions at most)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
