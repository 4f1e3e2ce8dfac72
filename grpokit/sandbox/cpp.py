"""C++ in the sandbox: the compiler runs inside it, like the program it builds.

``compile_cpp`` stages the sources, runs ``g++`` under the same isolation and limits as any
program (its own wall clock, CPU and memory, the output cap, the file-size limit) and takes
the binary out through its stdout (base64: the compiler's tmpfs dies with the run); the
binary then runs in a fresh sandbox per test case (``binary_program``). Nothing the source
does at compile time escapes the sandbox either: ``#include "/dev/zero"`` hits the memory
limit, template bombs the CPU limit or the output cap, ``#include`` of a hidden file finds
nothing.
"""

from __future__ import annotations

import base64
import binascii
import os
import shlex
import shutil
from dataclasses import dataclass

from grpokit.sandbox.child import Limits, Program, Result, run_child
from grpokit.sandbox.levels import SandboxError

CXX = shutil.which("g++") or "/usr/bin/g++"
CXX_FLAGS = ("-std=gnu++17", "-O2", "-pipe", "-fmax-errors=20")
COMPILE_TIMEOUT = 60.0  # wall-clock seconds: <bits/stdc++.h> at -O2 took 3 s of CPU, 10 s of
# wall clock at load 8 on this 2-core machine
COMPILE_CPU_SECONDS = 20  # CPU seconds per compiler process (at most the wall clock)
COMPILE_MEMORY_MB = 1024  # cc1plus on <bits/stdc++.h> at -O2: ~200 MB resident here
COMPILE_OUTPUT_BYTES = 16_000_000  # the binary (base64) and the diagnostics, each
BINARY = "prog"


@dataclass(frozen=True)
class Compiled:
    """A compile's outcome: the binary (None when it failed) and the compiler's run."""

    binary: bytes | None
    result: Result

    @property
    def ok(self) -> bool:
        return self.binary is not None

    @property
    def error(self) -> str:
        """Why it failed, one short text (the end of the diagnostics, or the kill reason)."""
        if self.ok:
            return ""
        r = self.result
        why = f"compiler killed ({r.killed_reason})" if r.killed_reason else "compile error"
        tail = r.stderr.strip()[-2000:]
        return f"{why}: {tail}" if tail else why


def compile_command(sources: list[str], flags: tuple[str, ...]) -> tuple[str, ...]:
    """g++ on ``sources`` in the working directory, then the binary as base64 on stdout."""
    cxx = " ".join(shlex.quote(w) for w in (CXX, *flags, "-o", BINARY, *sources))
    return ("/bin/sh", "-c", f"{cxx} </dev/null >&2 && base64 -w0 {BINARY}")


def compile_cpp(
    code: str,
    mode: str,
    limits: Limits,
    *,
    extra_files: dict[str, str] | None = None,
    flags: tuple[str, ...] = CXX_FLAGS,
) -> Compiled:
    """Compile ``code`` (prog.cpp) with the ``.cpp`` files of ``extra_files`` (name ->
    text: graders, headers) under the (resolved) level ``mode`` and ``limits``."""
    if not os.access(CXX, os.X_OK):  # else every program would score 0 as a compile error
        raise SandboxError(f"C++ needs g++, not found at {CXX}: install it (apt install g++)")
    files = {"prog.cpp": (code.encode(), 0o644)}
    for name, text in (extra_files or {}).items():
        if name in files or name == BINARY:
            raise ValueError(f"C++ sandbox: extra file {name!r} clashes with prog.cpp / {BINARY}")
        files[name] = (text.encode(), 0o644)
    sources = [
        "prog.cpp",
        *sorted(n for n in files if n.endswith((".cpp", ".cc")) and n != "prog.cpp"),
    ]
    r = run_child(mode, Program(files, compile_command(sources, flags)), "", limits)
    binary = None
    if r.returncode == 0 and r.killed_reason is None:
        try:
            binary = base64.b64decode(r.stdout.strip(), validate=True) or None
        except (binascii.Error, ValueError):
            binary = None
    return Compiled(binary, r)


def binary_program(binary: bytes) -> Program:
    """A compiled binary, run as ./prog in the run's working directory."""
    return Program({BINARY: (binary, 0o755)}, ("./" + BINARY,))
