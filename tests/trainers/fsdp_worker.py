"""One rank of the FSDP2 check in test_scale.py, launched by ``torchrun --nproc_per_node 2`` on the
CPU (gloo). Every rank builds the same tiny policy and the same synthetic batch, shards the policy
with ``trainers.scale.fsdp_wrap``, takes its own rows, and backpropagates the token-mean policy loss
re-weighted to the whole batch (its share of the batch's loss tokens, times the world size, since
FSDP averages gradients over ranks). Rank 0 writes the gathered gradients and the loss to argv[1]."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main(out: str) -> None:
    from tests.trainers.test_scale import policy_loss_on, synthetic_batch, tiny_policy
    from trainers.scale import agg_units, fsdp_wrap, full_grads

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_policy()
    batch = synthetic_batch(model)
    fsdp_wrap(model, init_device_mesh("cpu", (world,)))
    rows = torch.arange(len(batch))[rank::world]
    mine = batch.select(rows)
    units = agg_units("token-mean")
    share = float(units(mine.loss_mask)) / float(units(batch.loss_mask))
    loss = policy_loss_on(model, mine) * share
    (loss * world).backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = full_grads(model)  # collective: every rank gathers
    if rank == 0:
        torch.save({"loss": total, "grads": grads}, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    from trainers.distributed import exit_rank

    main(sys.argv[1])
    # Not a plain exit: a gloo thread can abort the process during the interpreter's finalization
    # (exit_rank's docstring); once in a clean-clone run rank 1 did, here.
    exit_rank(0)
