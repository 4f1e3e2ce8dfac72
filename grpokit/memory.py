"""Live-tensor accounting for tests and memory profiles: which tensors exist at the peak.

``LiveTensors`` is a ``TorchDispatchMode``: every tensor an operation returns (forward,
backward, factory functions, ``out=`` buffers) is seen once per storage, and a weak
reference to its storage tells when it is freed. It keeps the largest total of live bytes
(the tensors made inside the mode; the weights made before it are not counted), the live
tensors at that moment, and the largest single tensor made. Allocations an operation makes
inside its own kernel and frees before returning (workspaces) are not seen.

    with LiveTensors() as live:
        trainer.train()
    live.peak_bytes, live.at_peak[:10], live.largest
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class Seen:
    """One storage: its bytes and the first tensor made on it (shape, dtype, operation)."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    op: str

    def __str__(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        return f"{self.nbytes / 2**20:9.1f} MiB  {dt:8s} {list(self.shape)}  {self.op}"


class LiveTensors(TorchDispatchMode):
    """Peak live bytes of the tensors made while active, and what held them (see module)."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, Seen]] = {}
        self._bytes = 0  # live bytes, counting entries not yet found freed
        self.peak_bytes = 0
        self.at_peak: list[Seen] = []  # the storages alive at the peak
        self.largest: Seen | None = None  # the tensor with the most elements

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            if t.layout == torch.sparse_coo:  # its parts hold the memory
                self._see(t._indices(), func)
                self._see(t._values(), func)
            elif t.layout == torch.strided:
                self._see(t, func)
        return out

    def _see(self, t: torch.Tensor, func) -> None:
        if self.largest is None or t.numel() > _numel(self.largest):
            self.largest = Seen(t.numel() * t.element_size(), tuple(t.shape), t.dtype, str(func))
        st = t.untyped_storage()
        key = st.data_ptr()
        old = self._live.get(key)
        if old is not None and not old[0].expired() and old[1].nbytes == st.nbytes():
            return  # a view, an in-place result or the same buffer again
        if old is not None:
            self._bytes -= old[1].nbytes
        seen = Seen(st.nbytes(), tuple(t.shape), t.dtype, str(func))
        self._live[key] = (StorageWeakRef(st), seen)
        self._bytes += seen.nbytes
        if self._bytes > self.peak_bytes:
            self._sweep()
            if self._bytes > self.peak_bytes:
                self.peak_bytes = self._bytes
                self.at_peak = [s for _, s in self._live.values()]

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self._live.items() if ref.expired()]:
            self._bytes -= self._live.pop(key)[1].nbytes

    def live_bytes(self) -> int:
        """The bytes of the tracked tensors alive now."""
        self._sweep()
        return self._bytes

    def summary(self, top: int = 15) -> str:
        """The peak and the largest tensors alive at it, grouped by shape and operation."""
        groups: dict[tuple, list[int]] = {}
        for s in self.at_peak:
            g = groups.setdefault((s.shape, s.dtype, s.op), [0, 0])
            g[0] += 1
            g[1] += s.nbytes
        lines = [f"peak of tracked tensors: {self.peak_bytes / 2**30:.3f} GiB; largest at it:"]
        for (shape, dtype, op), (count, nbytes) in sorted(groups.items(), key=lambda kv: -kv[1][1])[
            :top
        ]:
            dt = str(dtype).replace("torch.", "")
            lines.append(
                f"  {count:4d} x {nbytes / count / 2**20:9.1f} MiB  {dt} {list(shape)}  {op}"
            )
        if self.largest is not None:
            lines.append(f"largest tensor made: {self.largest}")
        return "\n".join(lines)


def _numel(s: Seen) -> int:
    n = 1
    for d in s.shape:
        n *= d
    return n
