"""A CPU tensor pool (``pool.cpp``): torch's CPU allocator for blocks of 256 KiB and more,
carved from one address range that holds nothing else (best fit, neighbouring free blocks
merged); smaller blocks go to the allocator it replaces (glibc's ``malloc``).

Why: ``./run`` keeps the glibc heap's freed memory (no page fault when a step reuses it), but
the heap also serves the small long-lived allocations a step makes (tensor metadata,
results kept for the loss and the metrics); they land between the activations' large blocks
and split the free space the next forward needs. Measured on config (a) of
``bench/speed.py`` (SmolLM2-135M, bf16 autocast, 32 completions of 128 tokens, AMD EPYC
family 26 model 2): at each training step's memory peak the heap held 3.85 GB in use and
5.06 GB in all, and grew over the first three steps, with the same shapes every forward.
With the pool the large blocks peak at 3.56 GB in use in 3.84 GB, from the first step on,
and the process's peak RSS fell from 5.72 to 4.85 GB (``docs/speed.md``).

The pool is process-wide and stays once installed (torch has one CPU allocator); a tensor
made before keeps its own deleter. Pages once touched stay resident, as in ``./run``'s heap;
:func:`release` returns the free blocks' pages (``speed/heap.py`` calls it when the process
has grown well past its warm size). Built on first use with the machine's C++ compiler
against torch's headers into ``$GRPOKIT_CACHE/kernels``; no compiler, a failed build, not
Linux, or ``GRPOKIT_NO_POOL=1`` leave torch's allocator in place (``cpu_memory_pool: false``
in a config does too)."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from grpokit.models import grpokit_cache
from grpokit.speed.kernels import build_library

log = logging.getLogger("grpokit")

SOURCE = Path(__file__).with_name("pool.cpp")
MIN_BLOCK_BYTES = 256 << 10
_lib: ctypes.CDLL | None | bool = None  # False: tried, unavailable


def _torch_dirs() -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    return root / "include", root / "lib"


def _flags() -> list[str]:
    include, lib = _torch_dirs()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ["-O2", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-I{include}", f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"]  # fmt: skip


def library_path() -> Path:
    """Where the build for this source, this torch and these flags lives."""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), " ".join(_flags()).encode()):
        h.update(part)
    return grpokit_cache() / "kernels" / f"pool-{h.hexdigest()[:16]}.so"


def _build(dest: Path) -> None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise RuntimeError("no C++ compiler (c++, g++ or $CXX)")
    flags = _flags()
    build_library(dest, lambda out: [cxx, str(SOURCE), "-o", str(out), *flags])


def _reserve_bytes() -> int:
    """Address range to reserve (not memory): twice the machine's RAM, at least 16 GiB, and
    at most a quarter of the process's address-space limit (``ulimit -v``) when it has one
    (the range counts against it; blocks the pool cannot hold go to torch's allocator)."""
    import resource

    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        ram = 0
    want = max(2 * ram, 16 << 30)
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return want if limit == resource.RLIM_INFINITY else min(want, limit // 4)


def install() -> bool:
    """Make the pool torch's CPU allocator (once per process); True when it is."""
    global _lib
    if _lib is None:
        _lib = False
        if os.environ.get("GRPOKIT_NO_POOL") or not sys.platform.startswith("linux"):
            return False
        try:
            path = library_path()
            if not path.exists():
                _build(path)
            lib = ctypes.CDLL(str(path))
            lib.grpokit_pool_install.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
            lib.grpokit_pool_install.restype = ctypes.c_int
            lib.grpokit_pool_stats.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
            lib.grpokit_pool_stats.restype = None
            lib.grpokit_pool_release.argtypes = []
            lib.grpokit_pool_release.restype = ctypes.c_size_t
            if not lib.grpokit_pool_install(_reserve_bytes(), MIN_BLOCK_BYTES):
                raise RuntimeError("could not reserve its address range")
            _lib = lib
            log.debug("CPU tensor pool installed (%s)", path.name)
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
            log.info("CPU tensor pool unavailable (%s); using torch's allocator", e)
    return bool(_lib)


def installed() -> bool:
    return bool(_lib)


def stats() -> dict[str, int] | None:
    """Bytes in use, the range's high-water mark (``top``), free blocks, bytes reserved;
    None when the pool is not installed."""
    if not _lib:
        return None
    out = (ctypes.c_size_t * 4)()
    _lib.grpokit_pool_stats(out)
    return {"in_use": out[0], "top": out[1], "free_blocks": out[2], "reserved": out[3]}


def release() -> int:
    """Give the free blocks' pages back to the system; the bytes released (0 without the
    pool)."""
    return int(_lib.grpokit_pool_release()) if _lib else 0
