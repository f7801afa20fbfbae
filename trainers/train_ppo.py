"""Train an agent with PPO: `python trainers/train_ppo.py --config configs/<name>.yaml [key=value ...]`."""

from trainers.cli import script_main

if __name__ == "__main__":
    script_main("ppo")
