"""torch.distributed glue (gloo on CPU, nccl on GPU); every function is a no-op in one process.

Launch with ``torchrun --nproc_per_node N -m grpokit train ...`` or ``accelerate launch``:
both set RANK / WORLD_SIZE / MASTER_ADDR, which is all this module reads.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if world_size() > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_cat(t: torch.Tensor) -> torch.Tensor:
    """Concatenate equal-shaped tensors from every rank along dim 0 (rank order)."""
    if world_size() == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=0)


def sum_gradients(params) -> None:
    """Sum gradients over ranks. The losses are already normalised by global counts, so the
    sum (not the mean) gives the gradient of the global objective."""
    if world_size() == 1:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
