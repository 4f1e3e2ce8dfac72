"""The run API: one program (``run_python``, ``run_cpp``), and programs scored on
stdin/stdout test cases (``run_tests``, ``score_many``: open-r1's comparison, line by line,
each stripped), in Python or C++ (compiled once per program, inside the sandbox)."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

from grpokit.sandbox.child import Limits, Program, Result, python_program, run_child
from grpokit.sandbox.cpp import (
    COMPILE_CPU_SECONDS,
    COMPILE_MEMORY_MB,
    COMPILE_OUTPUT_BYTES,
    COMPILE_TIMEOUT,
    Compiled,
    binary_program,
    compile_cpp,
)
from grpokit.sandbox.isolation import resolve_isolation

# language names as datasets write them -> the two the sandbox runs
LANGUAGES = {"python": "python", "python3": "python", "py": "python", "cpp": "cpp",
             "c++": "cpp", "cxx": "cpp", "cc": "cpp"}  # fmt: skip


def language_of(name: str | None) -> str:
    """``"python"`` or ``"cpp"`` for a dataset's language name; a clear error otherwise."""
    key = str(name if name is not None else "python").strip().lower()
    if key not in LANGUAGES:
        raise ValueError(f"sandbox: language {name!r} is not supported; use python or cpp (c++)")
    return LANGUAGES[key]


def _limits(timeout=5.0, cpu_seconds=None, memory_mb=512, max_output_bytes=1_000_000,
            max_file_mb=10, max_procs=16, disk_mb=64, isolation=None, seccomp=True,
            hide=()) -> tuple[str, Limits]:  # fmt: skip
    lim = Limits(timeout, cpu_seconds, memory_mb, max_output_bytes, max_file_mb, max_procs,
                 disk_mb, seccomp, tuple(hide))  # fmt: skip
    return resolve_isolation(isolation), lim


def compile_limits(run: Limits, timeout: float, memory_mb: int) -> Limits:
    """The compiler's limits: the run's, with its own clock (CPU: the wall clock, at most
    ``COMPILE_CPU_SECONDS``), memory and output cap."""
    return Limits(
        timeout=timeout,
        cpu_seconds=max(1, min(COMPILE_CPU_SECONDS, math.ceil(timeout))),
        memory_mb=memory_mb,
        max_output_bytes=COMPILE_OUTPUT_BYTES,
        max_file_mb=run.max_file_mb,
        max_procs=run.max_procs,
        disk_mb=run.disk_mb,
        seccomp=run.seccomp,
        hide=run.hide,
    )


def compile_program(
    code: str,
    *,
    compile_timeout: float = COMPILE_TIMEOUT,
    compile_memory_mb: int = COMPILE_MEMORY_MB,
    extra_files: dict[str, str] | None = None,
    flags: tuple[str, ...] | None = None,
    **limits,
) -> Compiled:
    """Compile C++ ``code`` inside the sandbox (limits as ``run_python``'s, plus the
    compiler's own wall clock ``compile_timeout`` and address space ``compile_memory_mb``)."""
    mode, lim = _limits(**limits)
    kw = {"extra_files": extra_files} | ({"flags": tuple(flags)} if flags is not None else {})
    return compile_cpp(code, mode, compile_limits(lim, compile_timeout, compile_memory_mb), **kw)


def run_binary(binary: bytes, stdin: str = "", **limits) -> Result:
    """Run a binary from ``compile_program`` with ``stdin``; limits as ``run_python``'s."""
    return run_program(binary_program(binary), stdin, **limits)


def run_program(program: Program, stdin: str = "", **limits) -> Result:
    mode, lim = _limits(**limits)
    return run_child(mode, program, stdin, lim)


def run_cpp(code: str, stdin: str = "", *, compile_timeout: float = COMPILE_TIMEOUT,
            compile_memory_mb: int = COMPILE_MEMORY_MB, **limits) -> Result:  # fmt: skip
    """Compile C++ ``code`` and run it with ``stdin``. A failed compile returns the
    compiler's ``Result`` with ``killed_reason="compile"`` (its diagnostics on stderr)."""
    c = compile_program(
        code, compile_timeout=compile_timeout, compile_memory_mb=compile_memory_mb, **limits
    )
    if not c.ok:
        r = c.result
        return Result("", c.error, r.returncode, r.timed_out, "compile", r.wall_time, r.isolation)
    return run_binary(c.binary, stdin, **limits)


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout: float = 5.0,
    cpu_seconds: int | None = None,
    memory_mb: int = 512,
    max_output_bytes: int = 1_000_000,
    max_file_mb: int = 10,
    max_procs: int = 16,
    disk_mb: int = 64,
    isolation: str | None = None,
    seccomp: bool = True,
    hide: tuple[str, ...] = (),
) -> Result:
    """Run ``code`` as a Python program with ``stdin``; see docs/sandbox.md.

    ``timeout`` is wall-clock seconds, ``cpu_seconds`` the CPU limit per process (default:
    ``timeout`` rounded up), ``memory_mb`` the address space per process, ``max_file_mb``
    the largest file it may write, ``max_procs`` its processes and threads, ``disk_mb`` the
    size of its /tmp (namespaces only). ``seccomp=False`` drops the syscall filter (tests use
    it to check the other layers alone); ``hide`` adds directories to cover.
    """
    return run_program(
        python_program(code),
        stdin,
        timeout=timeout,
        cpu_seconds=cpu_seconds,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_file_mb=max_file_mb,
        max_procs=max_procs,
        disk_mb=disk_mb,
        isolation=isolation,
        seccomp=seccomp,
        hide=hide,
    )


def _lines(s: str) -> list[str]:
    return [ln.strip() for ln in s.strip().splitlines()]


def output_matches(r: Result, expected: str) -> bool:
    """open-r1's verdict for one case: exit status 0 and the same lines, each stripped."""
    return r.returncode == 0 and _lines(r.stdout) == _lines(str(expected))


def _build(code: str, language: str, compile_kw: dict, limits: dict) -> Program | None:
    """The program to run for ``code``: Python as is, C++ compiled (None if that failed)."""
    if language_of(language) == "python":
        return python_program(code)
    c = compile_program(code, **compile_kw, **limits)
    return binary_program(c.binary) if c.ok else None


def case_passes(code: str, case: dict, language: str = "python", **limits) -> bool:
    """One stdin/stdout case (open-r1's comparison: line by line, each line stripped). C++
    is compiled for this one case; ``score_many`` compiles once per program."""
    compile_kw = {k: limits.pop(k) for k in ("compile_timeout", "compile_memory_mb") if k in limits}
    program = _build(code, language, compile_kw, limits)
    if program is None:
        return False
    return output_matches(
        run_program(program, str(case.get("input", "")), **limits), case.get("output", "")
    )


def run_tests(code: str, test_cases: list[dict], language: str = "python", **limits) -> float:
    """Fraction of the stdin/stdout cases passed, one sandbox run per case."""
    return score_many([(code, test_cases, language)], max_workers=1, **limits)[0]


def default_workers() -> int:
    """The pool size ``score_many`` uses by default: the CPUs, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


def score_many(
    jobs: list[tuple],
    max_workers: int | None = None,
    *,
    compile_timeout: float = COMPILE_TIMEOUT,
    compile_memory_mb: int = COMPILE_MEMORY_MB,
    **limits,
) -> list[float]:
    """Fraction of cases passed for each ``(code, test_cases)`` or ``(code, test_cases,
    language)`` job (language ``python`` by default, or ``cpp``). C++ programs are compiled
    first, one pool task each (a failed compile scores 0.0); then every (job, case) pair is a
    task of the same bounded thread pool, so a slow program holds one worker per case for at
    most its own time limit and never delays the others beyond that."""
    jobs = [(j[0], j[1], language_of(j[2] if len(j) > 2 else "python")) for j in jobs]
    compile_kw = {"compile_timeout": compile_timeout, "compile_memory_mb": compile_memory_mb}
    passed = [0] * len(jobs)
    if any(cases for _, cases, _ in jobs):
        with ThreadPoolExecutor(max_workers=max_workers or default_workers()) as ex:
            programs = list(ex.map(
                lambda j: _build(j[0], j[2], compile_kw, limits) if j[1] else None, jobs
            ))  # fmt: skip
            tasks = [(j, c) for j, (_, cases, _) in enumerate(jobs) if programs[j] for c in cases]

            def passes(t):
                r = run_program(programs[t[0]], str(t[1].get("input", "")), **limits)
                return output_matches(r, t[1].get("output", ""))

            for (j, _), ok in zip(tasks, ex.map(passes, tasks)):
                passed[j] += ok
    return [passed[j] / len(cases) if cases else 0.0 for j, (_, cases, _) in enumerate(jobs)]
