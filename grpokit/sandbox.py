"""Run untrusted Python with hard limits (issue 8, first version). See docs/sandbox.md.

Layers: unshare (net, pid, mount namespaces; tmpfs over /work, /home, /root) when root and
available; uid 65534 via setpriv so RLIMIT_NPROC binds; rlimits (CPU, AS, FSIZE, NPROC);
wall-clock kill of the whole process group; a fresh temp dir; a cleaned environment.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)
NOBODY = 65534
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")


@dataclass
class Result:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    killed_reason: str | None
    wall_time: float


def _command(workdir: str) -> list[str]:
    py = [PYTHON, "-I", "-S", "-B", "prog.py"]
    if os.geteuid() != 0:
        log.warning("sandbox: not root; no namespaces or uid drop, rlimits only")
        return py
    if not (shutil.which("unshare") and shutil.which("setpriv")):
        log.warning("sandbox: unshare/setpriv missing; rlimits only, network NOT isolated")
        return py
    hide = " ".join(
        f"mount -t tmpfs -o size=1m none {d} 2>/dev/null;"
        for d in ("/work", "/home", "/root")
        if os.path.isdir(d) and not workdir.startswith(d)
    )
    drop = f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups"
    script = f'{hide} cd "$0" && exec {drop} "$@"'
    return ["unshare", "--net", "--pid", "--fork", "--mount", "sh", "-c", script, workdir, *py]


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout: float = 5.0,
    cpu_seconds: int = 5,
    memory_mb: int = 512,
    max_output_bytes: int = 1_000_000,
    max_file_mb: int = 10,
    max_procs: int = 16,
) -> Result:
    workdir = tempfile.mkdtemp(prefix="grpokit-sbx-")
    os.chmod(workdir, 0o777)
    with open(os.path.join(workdir, "prog.py"), "w") as f:
        f.write(code)

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        mem = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        fs = max_file_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (fs, fs))
        resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir}
    t0 = time.monotonic()
    reason = None
    try:
        p = subprocess.Popen(
            _command(workdir),
            cwd=workdir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=limits,
            start_new_session=True,
        )
        try:
            out, err = p.communicate(stdin.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            reason = "timeout"
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
        if len(out) > max_output_bytes:
            reason = reason or "output"
            out = out[:max_output_bytes]
        rc = p.returncode
        if rc is not None and rc < 0 and reason is None:
            reason = signal.Signals(-rc).name
        return Result(
            out.decode(errors="replace"),
            err[:max_output_bytes].decode(errors="replace"),
            rc,
            reason == "timeout",
            reason,
            time.monotonic() - t0,
        )
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except Exception:
            pass
        shutil.rmtree(workdir, ignore_errors=True)


def _lines(s: str) -> list[str]:
    return [ln.strip() for ln in s.strip().splitlines()]


def run_tests(code: str, test_cases: list[dict], **limits) -> float:
    """Fraction of stdin/stdout cases passed (open-r1 line-by-line strip comparison)."""
    if not test_cases:
        return 0.0
    passed = 0
    for case in test_cases:
        r = run_python(code, case.get("input", ""), **limits)
        if r.returncode == 0 and _lines(r.stdout) == _lines(str(case.get("output", ""))):
            passed += 1
    return passed / len(test_cases)


def score_many(jobs: list[tuple[str, list[dict]]], max_workers: int = 2, **limits) -> list[float]:
    with ThreadPoolExecutor(max_workers=max_workers) as ex:
        return list(ex.map(lambda j: run_tests(j[0], j[1], **limits), jobs))
