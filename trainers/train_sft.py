"""SFT warm start: `python trainers/train_sft.py --config configs/factchain_sft.yaml [key=value ...]`.

Writes RUN_DIR/model (a HF directory) for ``init_from`` in an RL config.
"""

import json
import sys
import warnings

from trainers import plugins
from trainers.config import ConfigDeprecationWarning, ConfigError, load_config
from trainers.sft import SFTConfig, run_sft


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="train_sft", description="Supervised warm start on env demonstrations.")
    ap.add_argument("--config", help="a YAML file from configs/ (keys of trainers.sft.SFTConfig)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides (model.name=..., eval.tasks=...), parsed as YAML")
    plugins.add_argument(ap)
    args = ap.parse_args(argv)
    warnings.simplefilter("default", ConfigDeprecationWarning)  # say which flat keys moved
    try:
        plugins.load(args.plugin, "--plugin")
        cfg = load_config(args.config, args.overrides, cls=SFTConfig, plugins=args.plugin)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    final = run_sft(cfg)
    print(json.dumps({k: round(v, 4) for k, v in final.items() if k in ("sft/loss", "eval/success_rate")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
