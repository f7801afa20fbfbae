"""SFT warm start: `python trainers/train_sft.py --config configs/factchain_sft.yaml [key=value ...]`.

Writes RUN_DIR/model (a HF directory) for ``init_from`` in an RL config.
"""

import json
import sys
import warnings

import yaml

from agent_gym.cli_errors import SFT_ENV_KWARGS, ArgumentParser, command, config_yaml_message, prog_name, report
from trainers import plugins
from trainers.config import ConfigDeprecationWarning, ConfigError, load_config
from trainers.sft import SFTConfig, check_env_arguments, run_sft


@command(env_kwargs=SFT_ENV_KWARGS)  # without argv (the command line): one line and exit 2 on a bad input
def main(argv=None) -> int:
    ap = ArgumentParser(prog=prog_name("train_sft", argv), description="Supervised warm start on env demonstrations.")
    ap.add_argument("--config", help="a YAML file from configs/ (keys of trainers.sft.SFTConfig)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides (model.name=..., eval.tasks=...), parsed as YAML")
    plugins.add_argument(ap)
    args = ap.parse_args(argv)
    warnings.simplefilter("default", ConfigDeprecationWarning)  # say which flat keys moved
    try:
        plugins.load(args.plugin, "--plugin")
        cfg = load_config(args.config, args.overrides, cls=SFTConfig, plugins=args.plugin)
        check_env_arguments(cfg)
    except ConfigError as e:
        return report(str(e), 2)
    except yaml.YAMLError as e:  # the config file or an override's value
        return report(config_yaml_message(e, args.config, args.overrides), 2)
    final = run_sft(cfg)
    print(json.dumps({k: round(v, 4) for k, v in final.items() if k in ("sft/loss", "eval/success_rate")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
