"""The command line shared by ``train_ppo.py`` and ``train_grpo.py``.

    python trainers/train_ppo.py --config configs/factchain_ppo.yaml [key=value ...]
    python trainers/train_ppo.py --resume runs/factchain_ppo [key=value ...]
    python trainers/train_grpo.py --plugin my_project.algos --config my.yaml   # a module that registers names
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import sys
import traceback
import warnings
from pathlib import Path

import yaml

from trainers import plugins
from trainers.config import ConfigDeprecationWarning, ConfigError, load_config, parse_overrides


def script_main(algo: str) -> None:
    """The scripts' entry: exit with ``main``'s status. A torchrun rank that trained (fsdp: true)
    ends through ``trainers.distributed.exit_rank``, which skips the interpreter's finalization (a
    gloo thread can abort the process there)."""
    rc = main(algo)
    dist_mod = sys.modules.get("trainers.distributed")
    if dist_mod is not None and dist_mod.ran_collectives():
        dist_mod.exit_rank(rc)
    sys.exit(rc)


def main(algo: str, argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"train_{algo}", description=f"Train an agent with {algo.upper()}.")
    ap.add_argument("--config", help="a YAML file from configs/ (its sections mirror trainers.config.TrainConfig)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    ap.add_argument("overrides", nargs="*", help="section.key=value overrides (e.g. algorithm.lr=1e-5), values "
                                                 "parsed as YAML")
    plugins.add_argument(ap)
    args = ap.parse_args(argv)
    warnings.simplefilter("default", ConfigDeprecationWarning)  # say which flat keys moved, once each
    from trainers.trainer import resume_config, run

    try:
        plugins.load(args.plugin, "--plugin")
        if args.resume:
            over = parse_overrides(args.overrides)
            if args.plugin:  # added to the run's own (its config.yaml's plugins)
                saved = Path(args.resume) / "config.yaml"
                old = (yaml.safe_load(saved.read_text()) or {}).get("plugins") or [] if saved.is_file() else []
                over["plugins"] = list(dict.fromkeys([*old, *args.plugin]))
            cfg = resume_config(args.resume, over)
        else:
            cfg = load_config(args.config, args.overrides, defaults={"algorithm": {"algo": algo}}, plugins=args.plugin)
        family = {"ppo": ("ppo",), "grpo": ("grpo", "rloo", "reinforce_pp")}[algo]
        if cfg.algo not in family:
            raise ConfigError(f"config key 'algorithm.algo' is {cfg.algo!r}, which train_{algo}.py does not run; use "
                              f"{'train_ppo.py' if cfg.algo == 'ppo' else 'train_grpo.py'} or set algorithm.algo to one "
                              f"of {family}")
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        last = run(cfg, resume=bool(args.resume))
    except Exception as e:
        failure = _failure(e, cfg.run_dir)
        if failure is None:
            raise
        print(f"error: {failure[1]}", file=sys.stderr)
        return failure[0]
    keys = [k for k in ("rollout/success_rate", "eval/success_rate", "rollout/reward_mean") if k in last]
    if os.environ.get("RANK", "0") == "0":  # under torchrun (fsdp) rank 0 alone reports
        print(json.dumps({k: round(last[k], 4) for k in keys}))
    return 0


def _failure(e: BaseException, run_dir: str) -> tuple[int, str] | None:
    """The exit status and message of a run that failed in a known way, or ``None`` (then the
    traceback is shown): 2 bad config, model or path; 3 a non-finite loss; 4 the run's files could
    not be written (a full disk, a checkpoint that failed; earlier checkpoints are intact)."""
    from trainers.checkpoint import CheckpointError, format_bytes
    from trainers.models import ModelLoadError
    from trainers.trainer import NonFiniteLossError

    chain = [e]
    while chain[-1].__context__ is not None and len(chain) < 10:
        chain.append(chain[-1].__context__)
    first = next((x for x in chain if isinstance(x, CheckpointError)), None)
    if first is not None:  # a failed checkpoint, possibly followed by a failure while closing the run
        after = "" if first is e else f" (Then, while closing the run: {type(e).__name__}: {e}.)"
        return 4, f"{first}{after}"
    if isinstance(e, (ConfigError, ModelLoadError, FileNotFoundError)):
        return 2, str(e)
    if isinstance(e, NonFiniteLossError):
        return 3, str(e)
    full = next((x for x in chain if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT)), None)
    if full is not None:
        try:
            free = format_bytes(shutil.disk_usage(run_dir).free)
        except OSError:
            free = "an unknown amount"
        return 4, (f"the disk is full: could not write {full.filename or 'a file'} ({full.strerror}) in {_where(full)}; "
                   f"{free} is free under {run_dir}. The checkpoints already written are intact: free space (or move "
                   f"run_dir), then continue with --resume {run_dir}.")
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
