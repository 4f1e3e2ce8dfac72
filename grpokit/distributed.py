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


def sum_gradients(params, bucket_bytes: int = 64 << 20) -> None:
    """Sum gradients over ranks. The losses are already normalised by global counts, so the
    sum (not the mean) gives the gradient of the global objective.

    Gradients are flattened into buckets of about ``bucket_bytes`` (one dtype per bucket) and
    each bucket is reduced with one collective, as DDP does, instead of one call per tensor
    (a 135M-parameter model has ~270 of them). The ranks first agree on which parameters have
    a gradient anywhere: one missing on some ranks only is reduced as zeros there, one missing
    everywhere stays None (the optimizer skips it, as in one process).
    """
    if world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32)
    dist.all_reduce(has, op=dist.ReduceOp.SUM)
    params = [p for p, h in zip(params, has.tolist()) if h > 0]
    bucket: list[torch.nn.Parameter] = []
    size = 0

    def flush():
        nonlocal bucket, size
        if not bucket:
            return
        for p in bucket:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        off = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[off : off + n].view_as(p.grad))
            off += n
        bucket, size = [], 0

    for p in params:
        if bucket and (p.dtype != bucket[0].dtype or size >= bucket_bytes):
            flush()
        bucket.append(p)
        size += p.numel() * p.element_size()
    flush()


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
