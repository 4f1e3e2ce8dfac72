"""What this CPU computes natively: bf16 products need AVX512-BF16 or AMX-BF16; without
either (AVX2-only CPUs, many laptops and older servers) torch emulates them. Measured on an
AMD EPYC (Zen 3, AVX2): bf16 matmul 0.29 GFLOP/s against 169 GFLOP/s in float32 (2048^3,
2 threads, idle), one default-recipe step 371 s with bf16 against 18-21 s in float32.
``bf16: auto`` (config.py) uses this to choose."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("grpokit")

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str] | None:
    """The first processor's feature flags, or None where /proc/cpuinfo is not readable
    (not Linux) or has no flags line (not x86)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def has_native_bf16(flags: set[str] | None) -> bool | None:
    """True/False when the flags say; None when they are unknown."""
    return None if flags is None else any(f in flags for f in BF16_FLAGS)


def warn_if_bf16_is_emulated(
    uses_bf16: bool, device_type: str, flags=None, fix: str = "--bf16 false"
) -> bool:
    """One warning line when a CPU run computes in bf16 that this CPU only emulates, naming
    ``fix``; True when it warned. ``flags``: the CPU's flags (/proc/cpuinfo's when None)."""
    if not uses_bf16 or device_type != "cpu":
        return False
    if has_native_bf16(cpu_flags() if flags is None else flags) is not False:
        return False
    log.warning(
        "this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16): bf16 products are "
        "emulated, ~500x slower than float32 on an AVX2 AMD EPYC; add %s to train in float32",
        fix,
    )
    return True
