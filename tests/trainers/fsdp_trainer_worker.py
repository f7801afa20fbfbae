"""One rank of tests/trainers/test_fsdp_trainer.py, launched by ``torchrun --nproc_per_node 2`` on the
CPU: runs ``trainers/train_<algo>.py``'s command line (``trainers.cli.main``) with ``fsdp=true`` for
each ``ALGO:CONFIG`` argument in turn, in one gloo process group (the trainer uses it instead of
starting its own). Exits non-zero if a run does."""

import sys

import torch.distributed as dist


def main(pairs: list[str]) -> int:
    from trainers.cli import main as cli_main

    dist.init_process_group("gloo")
    try:
        for pair in pairs:
            algo, path = pair.split(":", 1)
            rc = cli_main(algo, ["--config", path, "fsdp=true"])
            if rc:
                return rc
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
