"""Train an agent with GRPO: `python trainers/train_grpo.py --config configs/<name>.yaml [key=value ...]`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainers.cli import script_main  # noqa: E402

if __name__ == "__main__":
    script_main("grpo")
