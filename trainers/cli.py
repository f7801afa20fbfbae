"""The command line shared by ``train_ppo.py`` and ``train_grpo.py``.

    python trainers/train_ppo.py --config configs/factchain_ppo.yaml [key=value ...]
    python trainers/train_ppo.py --resume runs/factchain_ppo [key=value ...]
    python trainers/train_grpo.py --plugin my_project.algos --config my.yaml   # a module that registers names

From the command line (``main`` without ``argv``) a bad input is one line and exit status 2, through
``agent_gym/cli_errors.py`` (``--debug`` shows the traceback), as is an env server (``rollout.env_server``)
that is gone mid-run (the line says to restart it and ``--resume``); a non-finite loss exits 3 and a run
whose files could not be written 4 (``_failure``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import traceback
import warnings
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import yaml

from agent_gym.cli_errors import (
    TRAIN_ENV_KWARGS,
    ArgumentParser,
    command,
    config_yaml_message,
    describe,
    prog_name,
    report,
)
from trainers import plugins
from trainers.config import ConfigDeprecationWarning, ConfigError, load_config, parse_overrides


def script_main(algo: str | Callable[[list[str]], str]) -> None:
    """The scripts' entry: exit with ``main``'s status (``algo`` a function of the arguments:
    ``agent-gym-train``'s ``trainers.console.config_algo``). A torchrun rank that trained (fsdp: true)
    ends through ``trainers.distributed.exit_rank``, which skips the interpreter's finalization (a
    gloo thread can abort the process there)."""
    rc = main(algo)
    dist_mod = sys.modules.get("trainers.distributed")
    if dist_mod is not None and dist_mod.ran_collectives():
        dist_mod.exit_rank(rc)
    sys.exit(rc)


@command(env_kwargs=TRAIN_ENV_KWARGS)  # without argv (the command line): one line and exit 2 on a bad input
def main(algo: str | Callable[[list[str]], str], argv: list[str] | None = None) -> int:
    if callable(algo):  # agent-gym-train: PPO or GRPO as the config says (a bad config: one line, exit 2)
        algo = "ppo" if algo(sys.argv[1:] if argv is None else argv) == "ppo" else "grpo"
    prog = prog_name(f"train_{algo}", argv)
    ap = ArgumentParser(prog=prog, description=f"Train an agent with {algo.upper()}.")
    ap.add_argument("--config", help="a YAML file from configs/ (its sections mirror trainers.config.TrainConfig)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    ap.add_argument(
        "overrides", nargs="*", help="section.key=value overrides (e.g. algorithm.lr=1e-5), values parsed as YAML"
    )
    plugins.add_argument(ap)
    args = ap.parse_args(argv)
    warnings.simplefilter("default", ConfigDeprecationWarning)  # say which flat keys moved, once each
    from trainers.compose import (  # deferred: torch loads after parsing, so --help answers at once
        check,
        resume_config,
        run,
    )

    try:
        plugins.load(args.plugin, "--plugin")
        if args.resume:
            if not (Path(args.resume) / "config.yaml").is_file():
                raise ConfigError(
                    f"--resume {args.resume}: not a run directory (no config.yaml there); pass the "
                    "run_dir of an earlier run (it holds config.yaml and checkpoints/), or start a new "
                    "run with --config FILE"
                )
            over = parse_overrides(args.overrides)
            if args.plugin:  # added to the run's own (its config.yaml's plugins)
                saved = Path(args.resume) / "config.yaml"
                old = (yaml.safe_load(saved.read_text()) or {}).get("plugins") or [] if saved.is_file() else []
                over["plugins"] = list(dict.fromkeys([*old, *args.plugin]))
            cfg = resume_config(args.resume, over)
        else:
            cfg = load_config(args.config, args.overrides, defaults={"algorithm": {"algo": algo}}, plugins=args.plugin)
        check(cfg, script=algo, prog=prog)  # what cannot be combined, this command's algorithms included
    except (ConfigError, FileNotFoundError) as e:
        return report(str(e), 2)
    except yaml.YAMLError as e:  # an override's value, the config file, or the run's config.yaml
        return report(config_yaml_message(e, args.config or str(Path(args.resume) / "config.yaml"), args.overrides), 2)
    try:
        last = run(cfg, resume=bool(args.resume))
    except Exception as e:
        failure = _failure(e, cfg.run.run_dir)
        if failure is None:
            raise
        return report(failure[1], failure[0])
    keys = [k for k in ("rollout/success_rate", "eval/success_rate", "rollout/reward_mean") if k in last]
    if os.environ.get("RANK", "0") == "0":  # under torchrun (fsdp) rank 0 alone reports
        print(json.dumps({k: round(last[k], 4) for k in keys}))
    return 0


def _failure(e: BaseException, run_dir: str) -> tuple[int, str] | None:
    """The exit status and message of a run that failed in a known way, or ``None`` (then the
    traceback is shown): 2 bad config, model, data or path (``agent_gym.cli_errors.describe``), or the
    env server (``rollout.env_server``) gone mid-run (restart it, then ``--resume``); 3 a non-finite
    loss; 4 the run's files could not be written (a full disk, a checkpoint that failed; earlier
    checkpoints are intact)."""
    from trainers.checkpoint import (  # deferred: torch stays out of `import trainers.cli` (--help)
        CheckpointError,
        format_bytes,
    )
    from trainers.trainer import NonFiniteLossError  # deferred: torch stays out of `import trainers.cli` (--help)

    chain = [e]
    while chain[-1].__context__ is not None and len(chain) < 10:
        chain.append(chain[-1].__context__)
    first = next((x for x in chain if isinstance(x, CheckpointError)), None)
    if first is not None:  # a failed checkpoint, possibly followed by a failure while closing the run
        after = "" if first is e else f" (Then, while closing the run: {type(e).__name__}: {e}.)"
        return 4, f"{first}{after}"
    if isinstance(e, NonFiniteLossError):
        return 3, str(e)
    gone = _env_server_gone(e)
    if gone is not None:  # the env server (rollout.env_server) died or restarted mid-run
        resume = f"continue the run from its last checkpoint with --resume {run_dir}"
        if not gone.reason:  # it came back, but with other envs: its own message says which
            return 2, f"{gone}; then {resume}"
        port = urlsplit(gone.url).port
        return 2, (
            f"the env server at {gone.url} is gone mid-run ({gone.reason}): the rollout's sessions and the "
            "episodes in them are lost. Restart the server (python -m agent_gym.serve with this run's env and "
            f"env kwargs{f', on port {port}' if port else ''}), then {resume}"
        )
    full = next((x for x in chain if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT)), None)
    if full is not None:
        try:
            free = format_bytes(shutil.disk_usage(run_dir).free)
        except OSError:
            free = "an unknown amount"
        return 4, (
            f"the disk is full: could not write {full.filename or 'a file'} ({full.strerror}) in {_where(full)}; "
            f"{free} is free under {run_dir}. The checkpoints already written are intact: free space (or move "
            f"run_dir), then continue with --resume {run_dir}."
        )
    message = describe(e, TRAIN_ENV_KWARGS)  # ConfigError, ModelLoadError, a missing file, ...
    return None if message is None else (2, message)


def _env_server_gone(e: BaseException) -> BaseException | None:
    """The ``agent_gym.env_client.EnvServerGoneError`` that ``e`` is or follows from (its causes and
    contexts), if any; the module is only looked up (it imports openenv-core, which only a run
    with an env server has loaded)."""
    client = sys.modules.get("agent_gym.env_client")
    if client is None:
        return None
    queue: list[BaseException] = [e]
    for _ in range(20):  # a chain is short; a cycle of contexts must not loop
        if not queue:
            break
        x = queue.pop(0)
        if isinstance(x, client.EnvServerGoneError):
            return x
        queue += [y for y in (x.__cause__, x.__context__) if y is not None]
    return None


def _where(e: BaseException) -> str:
    """The project's innermost frame of ``e``'s traceback, as ``path:line (function)`` (a write
    error from ``file.write`` carries no file name)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(repo + os.sep)]
    if not frames:
        return "the run"
    f = frames[-1]
    return f"{os.path.relpath(f.filename, repo)}:{f.lineno} ({f.name})"
