"""One sandboxed run under a given level: stage the program's files, start the launcher
(inside ``unshare`` for the namespace levels), pump its pipes against the clock and the
output cap, stop whatever is left, and clean up its uid and files. A ``Program`` is what
runs: files for its working directory and the command (``python_program``: a Python source
run by the system interpreter; ``grpokit.sandbox.cpp`` builds the C++ ones)."""

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
from grpokit.sandbox.launcher import ARGV_SEP, SETUP_FAILED, SETUP_TAG
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
class Program:
    """What one run executes: ``files`` (name -> content, mode) staged in its working
    directory, and ``argv`` run there (a relative ``./name`` is one of the files)."""

    files: dict[str, tuple[bytes, int]]
    argv: tuple[str, ...]


def python_program(code: str) -> Program:
    """``code`` as prog.py, run by the system interpreter (-I -S -B: no site, no env)."""
    return Program({"prog.py": (code.encode(), 0o644)}, (PYTHON, "-I", "-S", "-B", "prog.py"))


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


def launcher_command(
    mode: str, stage: str, argv: tuple[str, ...], uid: int, nproc: int, lim: Limits
) -> list[str]:
    """The command that runs ``argv`` on the files in ``stage`` under ``mode`` as ``uid``
    (-1: the caller)."""
    if any(ARGV_SEP in w or "\0" in w for w in argv):
        raise ValueError("sandbox: a word of the command holds a separator character")
    args = {
        "mode": mode,
        "stage": stage,
        "argv": ARGV_SEP.join(argv),
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


def stage_files(stage: str, files: dict[str, tuple[bytes, int]]) -> None:
    """Write a run's files (plain names only) into its fresh staging directory."""
    for name, (data, perm) in files.items():
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"sandbox: staged file name {name!r} must be a plain name")
        path = os.path.join(stage, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, perm), "wb") as f:
            f.write(data)
        os.chmod(path, perm)  # whatever the umask


def run_child(mode: str, program: Program | str, stdin: str, lim: Limits) -> Result:
    """Run ``program`` (a ``Program``, or Python source) with ``stdin`` under the (already
    resolved) level ``mode``."""
    if mode in AS_CALLER and is_root():
        raise SandboxError(f"isolation {mode!r} refused as root: the program would run as root")
    if isinstance(program, str):
        program = python_program(program)
    stage = tempfile.mkdtemp(prefix="grpokit-sbx-", dir=stage_root())
    lease = p = None
    try:
        stage_files(stage, program.files)
        if mode in AS_CALLER:  # RLIMIT_NPROC counts all of the user's tasks
            uid, nproc = -1, user_tasks() + lim.max_procs
        else:
            lease = UidLease()
            uid, nproc = lease.uid, lim.max_procs + lease.debris  # zombies still count
            if mode == "uid":
                os.chown(stage, uid, uid)
        cmd = launcher_command(mode, stage, program.argv, uid, nproc, lim)
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
