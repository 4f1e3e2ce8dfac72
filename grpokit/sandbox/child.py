"""One sandboxed run under a given level: stage the program, start the launcher (inside
``unshare`` for the namespace levels), pump its pipes against the clock and the output cap,
stop whatever is left, and clean up its uid and files."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grpokit.sandbox.files import remove_files_of, rmtree, stage_root
from grpokit.sandbox.hidden import hide_paths
from grpokit.sandbox.launcher import SETUP_FAILED, SETUP_TAG
from grpokit.sandbox.levels import (
    AS_CALLER,
    NS_LEVELS,
    PYTHON,
    SandboxError,
    is_root,
    unshare_path,
)
from grpokit.sandbox.pipes import pump
from grpokit.sandbox.reap import kill_uid, stop
from grpokit.sandbox.uids import UidLease

log = logging.getLogger("grpokit.sandbox")

LAUNCHER = str(Path(__file__).resolve().with_name("launcher.py"))
NS_FLAGS = ["--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child=SIGKILL"]


@dataclass
class Result:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    killed_reason: str | None  # "timeout", "output", a signal name, "setup", or None
    wall_time: float
    isolation: str = ""


@dataclass(frozen=True)
class Limits:
    """What one run may use (``run_python`` documents each)."""

    timeout: float
    cpu_seconds: int | None = None
    memory_mb: int = 512
    max_output_bytes: int = 1_000_000
    max_file_mb: int = 10
    max_procs: int = 16
    disk_mb: int = 64
    seccomp: bool = True
    hide: tuple[str, ...] = ()

    @property
    def cpu(self) -> int:
        """CPU seconds per process: ``cpu_seconds``, else ``timeout`` rounded up."""
        if self.cpu_seconds is not None:
            return self.cpu_seconds
        return max(1, int(-(-self.timeout // 1)))


def user_tasks() -> int:
    """Tasks (threads count for RLIMIT_NPROC) of the current user."""
    me, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == me:
                    n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                pass
    return n


def launcher_command(mode: str, stage: str, uid: int, nproc: int, lim: Limits) -> list[str]:
    """The command that runs ``stage``/prog.py under ``mode`` as ``uid`` (-1: the caller)."""
    args = {
        "mode": mode,
        "python": PYTHON,
        "prog": os.path.join(stage, "prog.py"),
        "uid": uid,
        "cpu": lim.cpu,
        "as": lim.memory_mb * 2**20,
        "fsize": lim.max_file_mb * 2**20,
        "nproc": nproc,
        "core": 0,
        "nofile": 256,
        "seccomp": int(lim.seccomp),
        "disk": lim.disk_mb,
        "hide": os.pathsep.join(hide_paths(lim.hide)) if mode in NS_LEVELS else "",
    }
    cmd = [PYTHON, "-I", "-S", LAUNCHER, *(f"{k}={v}" for k, v in args.items())]
    if mode in NS_LEVELS:
        ns = ["--user", "--map-root-user", *NS_FLAGS] if mode == "userns" else NS_FLAGS
        cmd = [unshare_path(), *ns, *cmd]
    return cmd


def environment(mode: str, stage: str) -> dict[str, str]:
    """The program's whole environment; its home and temp dir are its working directory."""
    home = "/tmp" if mode in NS_LEVELS else stage
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}


def outcome(mode: str, p: subprocess.Popen, err: bytes, reason: str | None):
    """Stop the run; (return code, killed reason) as ``Result`` reports them."""
    if stop(mode, p) and mode in NS_LEVELS:
        rc = -signal.SIGKILL  # unshare's own status after its child was killed means little
    else:
        rc = p.returncode
        if mode in NS_LEVELS and 128 < rc < 128 + 65:
            rc = 128 - rc  # the namespace's init reports a signal death as 128 + signal
    if rc == SETUP_FAILED and SETUP_TAG in err.decode(errors="replace"):
        # could be the program pretending, so only a warning; the probe run catches a
        # sandbox that really cannot be built
        log.warning("sandbox: %s", err.decode(errors="replace").strip()[-300:])
        reason = reason or "setup"
    if reason is None and rc is not None and rc < 0:
        try:
            reason = signal.Signals(-rc).name
        except ValueError:
            reason = f"signal {-rc}"
    return rc, reason


def run_child(mode: str, code: str, stdin: str, lim: Limits) -> Result:
    """Run ``code`` with ``stdin`` under the (already resolved) level ``mode``."""
    if mode in AS_CALLER and is_root():
        raise SandboxError(f"isolation {mode!r} refused as root: the program would run as root")
    stage = tempfile.mkdtemp(prefix="grpokit-sbx-", dir=stage_root())
    lease = p = None
    try:
        with open(os.path.join(stage, "prog.py"), "w") as f:
            f.write(code)
        if mode in AS_CALLER:  # RLIMIT_NPROC counts all of the user's tasks
            uid, nproc = -1, user_tasks() + lim.max_procs
        else:
            lease = UidLease()
            uid, nproc = lease.uid, lim.max_procs
            if mode == "uid":
                os.chown(stage, uid, uid)
        cmd = launcher_command(mode, stage, uid, nproc, lim)
        t0 = time.monotonic()
        p = subprocess.Popen(
            cmd,
            cwd=stage,
            env=environment(mode, stage),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        out, err, reason = pump(p, stdin.encode(), t0 + lim.timeout, lim.max_output_bytes)
        rc, reason = outcome(mode, p, err, reason)
        text = out.decode(errors="replace"), err.decode(errors="replace")
        return Result(*text, rc, reason == "timeout", reason, time.monotonic() - t0, mode)
    finally:
        clean_up(mode, p, lease, stage)


def clean_up(mode: str, p: subprocess.Popen | None, lease: UidLease | None, stage: str) -> None:
    """Whatever happened: nothing of the run left running, its uid free, its files gone."""
    if p is not None:
        if p.returncode is None:
            stop(mode, p)
        for f in (p.stdin, p.stdout, p.stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass
    if lease is not None:
        if mode == "uid":
            kill_uid(lease.uid)
            remove_files_of(lease.uid)
        lease.release()
    rmtree(stage)
