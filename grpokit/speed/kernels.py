"""A C kernel for the decode loop's attention (``decode_attention.c``), compiled on first use
with the machine's C compiler for the machine's own CPU, and loaded with ctypes.

Why: one decode step attends one query token per row over the cache, 30 times a step for
SmolLM2-135M. torch's CPU attention (``scaled_dot_product_attention``) blocks its queries
for prefill-sized work and spent 34% of a bench generation phase there (config (a), AMD
EPYC family 26 model 2, 1.66 of 4.86 s profiled). The kernel reads each row's keys and
values once for the g query heads that share them, with an online softmax in float32;
measured at 32 rows x 3 key/value heads x 3 queries x 64 dims, bf16, 2 threads: 0.18 -> 0.06
ms at 60 slots, 0.38 -> 0.22 ms at 200 (``bench/decode_attention.py``).

Nothing here is required: no compiler, a failed build, another platform, or
``GRPOKIT_NO_KERNELS=1`` leave ``decode_attention`` returning None, and the caller keeps
torch's attention (the same numbers up to float summation order). The build runs once per
source and CPU into ``$GRPOKIT_CACHE`` (default ``~/.cache/grpokit``) ``/kernels``: the flag
``-march=native`` makes the library specific to the CPU that built it, so the CPU's model
and flags are part of the file name. It links OpenMP by the name torch's own runtime has
(``libgomp.so.1``), so the kernel's threads are torch's thread pool, not a second one.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from grpokit.models import grpokit_cache

log = logging.getLogger("grpokit")

SOURCE = Path(__file__).with_name("decode_attention.c")
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fassociative-math",
         "-fno-signed-zeros", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC"]  # fmt: skip
_lib: ctypes.CDLL | None | bool = None  # False: tried, unavailable


def _cpu_key() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    keep = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("model name", "flags")]
    return "\n".join(sorted(set(keep)))


def library_path() -> Path:
    """Where the build for this source, these flags and this CPU lives."""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), _cpu_key().encode()):
        h.update(part)
    return grpokit_cache() / "kernels" / f"decode_attention-{h.hexdigest()[:16]}.so"


def _build(dest: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc, gcc or $CC)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        out = Path(tmp) / dest.name
        cmd = [cc, *FLAGS, str(SOURCE), "-o", str(out), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
        os.replace(out, dest)  # atomic: a concurrent build or load sees a whole file


def _load() -> ctypes.CDLL | None:
    global _lib
    if _lib is None:
        _lib = False
        if os.environ.get("GRPOKIT_NO_KERNELS") or not sys.platform.startswith("linux"):
            return None
        try:
            path = library_path()
            if not path.exists():
                _build(path)
            lib = ctypes.CDLL(str(path))
            ptr, i, long_, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
            for fn in (lib.decode_attention_bf16, lib.decode_attention_f32):
                fn.argtypes = [ptr, long_, ptr, ptr, ptr, long_, ptr, i, i, i, i, long_, long_, f]
                fn.restype = None
            _lib = lib
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
            log.info("decode attention kernel unavailable (%s); using torch's attention", e)
    return _lib or None


MAX_G, MAX_D = 16, 256  # decode_attention.c's MAX_G, MAX_D


def decode_attention(
    q: torch.Tensor,  # (n, KV, g, D): the step's queries, g query heads per key/value head
    keys: torch.Tensor,  # (n, KV, T, D) the cache
    values: torch.Tensor,
    attend: torch.Tensor,  # (n, S) bool, S <= T: which of the first S slots each row sees
    scale: float,
) -> torch.Tensor | None:
    """``scaled_dot_product_attention(q, keys[:, :, :S], values[:, :, :S], attn_mask=attend[:,
    None, None], scale=scale)`` from the C kernel, or None when it does not apply (no kernel,
    another dtype or device, shapes past its limits, layouts it does not read)."""
    n, KV, g, D = q.shape
    S = attend.shape[1]
    dt = q.dtype
    if (
        dt not in (torch.bfloat16, torch.float32)
        or q.device.type != "cpu"
        or keys.dtype != dt
        or values.dtype != dt
        or attend.dtype != torch.bool
        or g > MAX_G
        or D > MAX_D
        or not (keys.is_contiguous() and values.is_contiguous() and attend.is_contiguous())
        or keys.shape != values.shape
        or keys.shape[:2] != (n, KV)
        or keys.shape[3] != D
        or attend.shape[0] != n
        or S > keys.shape[2]
        or q.stride()[1:] != (g * D, D, 1)
    ):
        return None
    lib = _load()
    if lib is None:
        return None
    out = torch.empty((n, KV, g, D), dtype=dt)
    fn = lib.decode_attention_bf16 if dt == torch.bfloat16 else lib.decode_attention_f32
    fn(q.data_ptr(), q.stride(0), keys.data_ptr(), values.data_ptr(), attend.data_ptr(), S,
       out.data_ptr(), n, KV, g, D, keys.shape[2], S, scale)  # fmt: skip
    return out
