"""Bound the heap's growth between training steps without giving back the pages the next
step needs (glibc ``malloc_trim``, run rarely)."""

from __future__ import annotations

import logging
import os

from grpokit.speed import pool

log = logging.getLogger("grpokit")

TRIM_SLACK_BYTES = 1 << 30
TRIM_WARMUP_STEPS = 4
_LIBC = None


def rss_bytes() -> int | None:
    """This process's resident set size, or None where /proc is not there."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


class HeapRelease:
    """Checked once a step (``after_step``).

    ``./run`` keeps freed memory in the heap (``MALLOC_TRIM_THRESHOLD_`` at 16 GB,
    ``MALLOC_MMAP_MAX_=0`` so that blocks over 32 MB are not mmapped and unmapped on free)
    because fresh pages cost a page fault each (training 20 s -> 15 s a step). Tensors of a
    different size every step then fragment the heap, and the default run's RSS grew by
    ~0.12 GB a step (8.9 GB after 40 steps). Trimming returns every free page, which the next
    step faults in again: measured on the speed bench's (a) rollouts, 200-600 thousand page
    faults and 1.3-1.4 s more training time in a step after a trim (6.4 -> 7.9 s,
    7.8 -> 9.2 s). So the base is the highest RSS after any of the first
    ``TRIM_WARMUP_STEPS`` steps (a step's working set with its heap, over several lengths),
    and a trim runs only when the RSS after a step is ``max(TRIM_SLACK_BYTES, base / 4)``
    above it: the heap stays bounded at 1.25 x the warm working set and trims are rare.
    No-op off glibc/Linux."""

    def __init__(self) -> None:
        self.base: int | None = None

    def after_step(self, step: int) -> None:
        rss = rss_bytes()
        if rss is None:
            return
        if self.base is None or step <= TRIM_WARMUP_STEPS:
            self.base = max(self.base or 0, rss)
            return
        if rss < self.base + max(TRIM_SLACK_BYTES, self.base // 4):
            return
        libc = _libc()
        if libc or pool.installed():
            if libc:
                libc.malloc_trim(0)
            pool.release()  # the pool's free pages (speed/pool.py)
            log.info(
                "released freed heap memory: RSS %.2f -> %.2f GB",
                rss / 1e9,
                (rss_bytes() or 0) / 1e9,
            )
