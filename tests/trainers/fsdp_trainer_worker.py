"""One rank of tests/trainers/test_fsdp_trainer.py, launched by ``torchrun --nproc_per_node 2`` on the
CPU. Each argument is a JSON list, one step, run in turn in one gloo process group (the trainer uses
it instead of starting its own):

- ``["grpo" | "ppo", *argv]``: ``trainers/train_<algo>.py``'s command line (``trainers.cli.main``);
- ``["copy", SRC, DST]``: rank 0 copies a run directory (the others wait).

Exits with the first non-zero exit status of a run, through ``trainers.distributed.exit_rank`` as
the training scripts do under torchrun."""

import json
import shutil
import sys

import torch.distributed as dist


def main(steps: list[str]) -> int:
    from trainers.cli import main as cli_main

    dist.init_process_group("gloo")
    try:
        for step in map(json.loads, steps):
            if step[0] == "copy":
                if dist.get_rank() == 0:
                    shutil.copytree(step[1], step[2])
                dist.barrier()
                continue
            rc = cli_main(step[0], step[1:])
            if rc:
                return rc
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from trainers.distributed import exit_rank

    exit_rank(main(sys.argv[1:]))
