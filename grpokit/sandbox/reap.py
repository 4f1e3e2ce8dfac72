"""Finding and killing what a run left running: by parent, by process group, by uid.

All of it reads /proc; nothing here waits longer than its own stated limit.
"""

from __future__ import annotations

import functools
import logging
import os
import selectors
import shutil
import signal
import subprocess
import time

from grpokit.sandbox.levels import NS_LEVELS

log = logging.getLogger("grpokit.sandbox")


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            out.append(int(d))
                except (OSError, IndexError, ValueError):
                    pass
        return out


def pids_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real, effective, saved or fs uid is ``uid``."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                fields = dict(ln.split(":", 1) for ln in f if ":" in ln)
        except OSError:
            continue
        uids = fields.get("Uid", "").split()
        if str(uid) in uids and not fields.get("State", "").strip().startswith("Z"):
            out.append(int(d))
    return out


def tasks_by_uid(lo: int, hi: int) -> dict[int, int]:
    """How many processes each uid in ``[lo, hi)`` owns, zombies included: a killed
    process whose parent is gone waits for pid 1 to reap it (here about 1-2 s), and until
    then it still counts against its uid's RLIMIT_NPROC. One stat of each /proc entry (its
    owner is the process's effective uid, a zombie's too)."""
    out: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                uid = os.stat(f"/proc/{d}").st_uid
            except OSError:
                continue
            if lo <= uid < hi:
                out[uid] = out.get(uid, 0) + 1
    return out


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            if int(pgrp) == pgid and state != "Z":
                out.append(int(d))
    return out


def kill_uid(uid: int, deadline: float = 5.0) -> None:
    """SIGKILL every process running as ``uid``: kill(-1) as ``uid`` (one sweep reaches them
    all, no pid races), repeated until /proc shows none. Root only.

    Always at least one sweep, never "nothing in /proc, nothing to do": a program that forks
    a detached child as it exits can be missed by a look at /proc (the child is created after
    the listing, its parent is a zombie when its status is read), and that child would outlive
    the run. The sweep runs ``setpriv ... kill -KILL -1`` (spawned, not forked, so it costs a
    few milliseconds even from a trainer holding gigabytes); without those tools, a forked
    child of this process does it."""
    tools = _sweep_tools()
    if tools is None:
        return _kill_uid_forked(uid, deadline)
    setpriv, kill = tools
    cmd = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", kill, "-KILL", "-1"]
    end = time.monotonic() + deadline
    while True:
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if not pids_of(uid):
            return
        if time.monotonic() > end:
            log.warning("sandbox: processes of uid %d survived the cleanup", uid)
            return
        time.sleep(0.005)


@functools.cache
def _sweep_tools() -> tuple[str, str] | None:
    """(setpriv, kill) paths, looked up once; None when either is missing."""
    setpriv, kill = shutil.which("setpriv"), shutil.which("kill", path="/usr/bin:/bin")
    return (setpriv, kill) if setpriv and kill else None


def _kill_uid_forked(uid: int, deadline: float) -> None:
    """kill_uid's sweep from a forked child that became ``uid`` (the fallback)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            me = os.getpid()
            end = time.monotonic() + deadline
            while time.monotonic() < end:
                try:
                    os.kill(-1, signal.SIGKILL)
                except OSError:
                    pass
                if not [q for q in pids_of(uid) if q != me]:
                    os._exit(0)
                time.sleep(0.005)
            os._exit(1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        log.warning("sandbox: processes of uid %d survived the cleanup", uid)


def exited(p: subprocess.Popen) -> bool:
    """Whether the direct child has ended, without reaping it (its pid, and so its process
    group id, stays reserved until we kill the group)."""
    try:
        return os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def wait_draining(p: subprocess.Popen, limit: float) -> bool:
    """Wait for ``p`` to exit while reading (and dropping) what it still writes, so that
    nothing blocks on a full pipe; True once it has exited."""
    sel = selectors.DefaultSelector()
    for f in (p.stdout, p.stderr):
        if f is not None and not f.closed:
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ)
    end = time.monotonic() + limit
    try:
        while p.poll() is None and time.monotonic() < end:
            for key, _ in sel.select(0.05):
                try:
                    if not os.read(key.fd, 65536):
                        sel.unregister(key.fd)
                except BlockingIOError:
                    pass
    finally:
        sel.close()
    return p.returncode is not None


def stop(mode: str, p: subprocess.Popen) -> bool:
    """Kill whatever is left of the run and reap the direct child; True if we had to kill."""
    return (_stop_namespace if mode in NS_LEVELS else _stop_group)(p)


def _stop_namespace(p: subprocess.Popen) -> bool:
    # Kill the namespace's init, not unshare: unshare then returns only once the kernel
    # has torn the namespace down, so nothing of the run is left when it has exited.
    if p.poll() is not None:
        return False
    kids = children(p.pid)
    for k in kids:
        try:
            os.kill(k, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not kids:
        os.killpg(p.pid, signal.SIGKILL)
    if not wait_draining(p, 30):
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    return True


def _stop_group(p: subprocess.Popen) -> bool:
    # The seccomp filter keeps every descendant in this process group. p is not reaped yet,
    # so the group id cannot be reused while we kill and wait for the group to be empty.
    killed = not exited(p)
    end = time.monotonic() + 10
    while True:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        if not group_members(p.pid):
            break
        if time.monotonic() > end:
            log.warning("sandbox: process group %d survived the cleanup", p.pid)
            break
        time.sleep(0.002)
    p.wait()
    return killed
