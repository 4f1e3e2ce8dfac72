"""The run API: one program (``run_python``), and programs scored on stdin/stdout test
cases (``run_tests``, ``score_many``: open-r1's comparison, line by line, each stripped)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from grpokit.sandbox.child import Limits, Result, run_child
from grpokit.sandbox.isolation import resolve_isolation


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
    mode = resolve_isolation(isolation)
    limits = Limits(
        timeout=timeout,
        cpu_seconds=cpu_seconds,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_file_mb=max_file_mb,
        max_procs=max_procs,
        disk_mb=disk_mb,
        seccomp=seccomp,
        hide=hide,
    )
    return run_child(mode, code, stdin, limits)


def _lines(s: str) -> list[str]:
    return [ln.strip() for ln in s.strip().splitlines()]


def case_passes(code: str, case: dict, **limits) -> bool:
    """One stdin/stdout case (open-r1's comparison: line by line, each line stripped)."""
    r = run_python(code, str(case.get("input", "")), **limits)
    return r.returncode == 0 and _lines(r.stdout) == _lines(str(case.get("output", "")))


def run_tests(code: str, test_cases: list[dict], **limits) -> float:
    """Fraction of the stdin/stdout cases passed, one sandbox run per case."""
    return score_many([(code, test_cases)], max_workers=1, **limits)[0]


def default_workers() -> int:
    """The pool size ``score_many`` uses by default: the CPUs, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


def score_many(
    jobs: list[tuple[str, list[dict]]], max_workers: int | None = None, **limits
) -> list[float]:
    """Fraction of cases passed for each (code, test_cases) job. Every (job, case) pair is a
    task of one bounded thread pool, so a slow program holds one worker per case for at most
    its own time limit and never delays the others beyond that."""
    tasks = [(j, case) for j, (_, cases) in enumerate(jobs) for case in cases]
    passed = [0] * len(jobs)
    if tasks:
        with ThreadPoolExecutor(max_workers=max_workers or default_workers()) as ex:
            oks = ex.map(lambda t: case_passes(jobs[t[0]][0], t[1], **limits), tasks)
            for (j, _), ok in zip(tasks, oks):
                passed[j] += ok
    return [passed[j] / len(cases) if cases else 0.0 for j, (_, cases) in enumerate(jobs)]
