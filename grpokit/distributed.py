"""torch.distributed glue (gloo on CPU, nccl on GPU) and device placement; every collective
is a no-op in one process.

Launch with ``torchrun --nproc_per_node N -m grpokit train ...`` or ``accelerate launch``:
both set RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR, which is all this module reads.
Collectives take tensors on any device: with nccl they run on this rank's GPU and the
result comes back on the input's device (rewards and scores stay on the CPU).

Watchdog: the process group is created with ``timeout = ddp_timeout`` (transformers' key;
grpokit's default 600 s instead of 30 min), so a collective waiting for a rank that died or
hangs fails instead of waiting for ever (gloo notices a dead peer at once: its connection
closes). Every collective here turns that failure into ``PeerError``, one line naming this
rank, the collective, and the likely cause.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import time

import torch
import torch.distributed as dist

from grpokit.config import ConfigError

_COMM_DEVICE = torch.device("cpu")
_TIMEOUT = 600.0  # seconds: every collective (ddp_timeout), set by init
DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(spec: str) -> torch.device:
    """The ``device`` config key -> a torch.device. auto = cuda:LOCAL_RANK when torch sees a
    GPU, else cpu; cuda = cuda:LOCAL_RANK; cuda:N = that GPU. Asking for a GPU that torch
    cannot see is an error naming the fix."""
    spec = str(spec).strip().lower()
    if not DEVICE_RE.match(spec):
        raise ConfigError(f"device={spec!r}: use auto, cpu, cuda or cuda:N")
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    nproc = int(os.environ.get("WORLD_SIZE", "1"))
    if ":" in spec and nproc > 1:
        raise ConfigError(
            f"device={spec!r} with {nproc} processes would put them all on one GPU; use "
            "device: auto or cuda (each process takes cuda:LOCAL_RANK), and CUDA_VISIBLE_DEVICES "
            "to choose the GPUs"
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={spec!r} but torch {torch.__version__} sees no CUDA GPU "
            f"(built with CUDA {torch.version.cuda}); use device: cpu (or auto), or install "
            "a CUDA build of torch on a machine with a GPU"
        )
    idx = int(spec.split(":")[1]) if ":" in spec else local_rank()
    n = torch.cuda.device_count()
    if idx >= n:
        raise ConfigError(
            f"device={spec!r} (LOCAL_RANK {local_rank()}) but torch sees {n} GPU(s); "
            "launch at most one process per GPU, or check CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", idx)


class PeerError(RuntimeError):
    """A collective failed: another training process died, or did not reach it in time."""


def init(device: torch.device | None = None, timeout: float | None = None) -> None:
    """Join the process group when launched with WORLD_SIZE > 1: nccl when this rank trains
    on a GPU (after selecting that GPU, so nccl and every default-device call use it), gloo
    on the CPU. ``timeout`` (seconds, ``ddp_timeout``) bounds every collective."""
    global _COMM_DEVICE, _TIMEOUT
    device = torch.device("cpu") if device is None else torch.device(device)
    if timeout is not None:
        _TIMEOUT = float(timeout)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # nccl: a collective that times out aborts the communicator and raises (torch >= 2.2
        # default; set here so that an older default cannot turn it into a hang)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        with guard("joining the process group"):
            dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=_TIMEOUT))
    if dist.is_initialized():
        _COMM_DEVICE = device if dist.get_backend() == "nccl" else torch.device("cpu")


def timeout() -> float:
    """Seconds a collective may wait (``ddp_timeout``)."""
    return _TIMEOUT


@contextlib.contextmanager
def guard(what: str):
    """Turn a failed collective into ``PeerError``: one line naming this rank, ``what`` was
    waited for, how long, and the likely cause."""
    t0 = time.time()
    try:
        yield
    except (RuntimeError, ValueError, OSError) as e:
        if isinstance(e, PeerError):
            raise
        waited = time.time() - t0
        reason = " ".join(str(e).split())[:200]
        cause = (
            f"another training process stopped answering for ddp_timeout={_TIMEOUT:g} s"
            if waited >= 0.9 * _TIMEOUT
            else "another training process died (its connection closed)"
        )
        where = f"training process rank {rank_or_env()} of {world_size_or_env()}"
        raise PeerError(f"{where}: {what} failed after {waited:.1f} s: {cause} ({reason})") from e


def rank_or_env() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def world_size_or_env() -> int:
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    return _all_reduce(t, "SUM", "a sum")


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum of ``t`` over every process."""
    return _all_reduce(t, "MAX", "a maximum")


def _all_reduce(t: torch.Tensor, op: str, what: str) -> torch.Tensor:
    if world_size() > 1:
        src = t.device
        t = t.to(_COMM_DEVICE, copy=True)
        with guard(f"{what} over processes (all_reduce)"):
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        t = t.to(src)
    return t


def all_gather_cat(t: torch.Tensor) -> torch.Tensor:
    """Concatenate equal-shaped tensors from every rank along dim 0 (rank order)."""
    if world_size() == 1:
        return t
    src = t.device
    t = t.to(_COMM_DEVICE).contiguous()
    parts = [torch.empty_like(t) for _ in range(world_size())]
    with guard("gathering every process's rewards (all_gather)"):
        dist.all_gather(parts, t)
    return torch.cat(parts, dim=0).to(src)


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
    has = torch.tensor(
        [p.grad is not None for p in params], dtype=torch.float32, device=_COMM_DEVICE
    )
    with guard("the gradient sum (all_reduce)"):
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
        with guard("the gradient sum (all_reduce)"):
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


def barrier(what: str = "waiting for every process (barrier)") -> None:
    if world_size() > 1:
        with guard(what):
            if dist.get_backend() == "gloo":
                # names the rank that did not arrive; the barrier itself is an all_reduce
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=_TIMEOUT))
            else:
                dist.barrier()


def gather_objects(obj) -> list:
    """Every process's ``obj`` (picklable), in rank order; ``[obj]`` in one process."""
    if world_size() == 1:
        return [obj]
    out: list = [None] * world_size()
    with guard("exchanging a status between processes (all_gather_object)"):
        dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` on every process."""
    if world_size() == 1:
        return obj
    box = [obj]
    with guard(f"receiving from rank {src} (broadcast)"):
        dist.broadcast_object_list(box, src=src)
    return box[0]
