"""The command line shared by ``train_ppo.py`` and ``train_grpo.py``.

    python trainers/train_ppo.py --config configs/factchain_ppo.yaml [key=value ...]
    python trainers/train_ppo.py --resume runs/factchain_ppo [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from trainers.config import ConfigError, load_config, parse_overrides


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
    ap.add_argument("--config", help="a YAML file from configs/ (its keys mirror trainers.config.TrainConfig)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, values parsed as YAML")
    args = ap.parse_args(argv)
    from trainers.models import ModelLoadError
    from trainers.trainer import NonFiniteLossError, resume_config, run

    try:
        if args.resume:
            cfg = resume_config(args.resume, parse_overrides(args.overrides))
        else:
            cfg = load_config(args.config, args.overrides, defaults={"algo": algo})
        family = {"ppo": ("ppo",), "grpo": ("grpo", "rloo", "reinforce_pp")}[algo]
        if cfg.algo not in family:
            raise ConfigError(f"config key 'algo' is {cfg.algo!r}, which train_{algo}.py does not run; use "
                              f"{'train_ppo.py' if cfg.algo == 'ppo' else 'train_grpo.py'} or set algo to one of {family}")
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        last = run(cfg, resume=bool(args.resume))
    except (ConfigError, ModelLoadError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    keys = [k for k in ("rollout/success_rate", "eval/success_rate", "rollout/reward_mean") if k in last]
    if os.environ.get("RANK", "0") == "0":  # under torchrun (fsdp) rank 0 alone reports
        print(json.dumps({k: round(last[k], 4) for k in keys}))
    return 0
