"""Train an agent with GRPO: `python trainers/train_grpo.py --config configs/<name>.yaml [key=value ...]`."""

from trainers.cli import script_main

if __name__ == "__main__":
    script_main("grpo")
