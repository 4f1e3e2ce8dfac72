"""Run untrusted Python (model-written code) with hard limits. See docs/sandbox.md.

Four isolation levels, chosen by ``isolation=`` or ``GRPOKIT_SANDBOX_ISOLATION``
(``auto`` picks the strongest that works on this machine, after one probe run):

- ``namespaces`` (root + ``unshare``): fresh net, pid, mount, ipc and uts namespaces. Inside,
  every mount is read-only, every top-level directory but the system ones (/usr, /etc, /lib,
  /bin, /dev, /sys, ...) is covered by an empty read-only tmpfs (so /home, /root, /var, /srv and
  a project anywhere outside the system directories are hidden; also the caller's cwd and
  home, wherever they are), /proc shows only the
  sandbox, and /tmp (its working directory) and /dev/shm are small private tmpfs. The
  program runs as a dedicated uid; when it ends, the namespace's init ends and the kernel kills
  everything the program left running.
- ``userns`` (not root, unprivileged user namespaces allowed): the same namespaces and mounts
  inside a new user namespace; the program is that namespace's root with every capability
  dropped, i.e. the caller's user outside, which cannot see or reach the caller's processes.
- ``uid`` (root, no namespaces): the dedicated uid, killed by uid and its files in the
  temporary directories removed after each run. Network, and files readable by everyone,
  are NOT isolated.
- ``none`` (not root, no user namespaces): rlimits and the seccomp filter only; the program
  runs as the caller's user and can read and write the caller's files. Not a security
  boundary.

``userns`` and ``none`` are refused as root. In every level: rlimits (CPU, address space,
file size, processes, core=0, open files), a seccomp filter (x86_64/aarch64: no signals to
other processes, no sockets, no new session or process group, no namespaces, no ptrace, no
SysV/POSIX IPC, no io_uring), a cleaned environment, a fresh staging directory removed
afterwards, a wall-clock limit and an output cap enforced while reading (the parent never holds
more than ``max_output_bytes`` + 64 KiB per stream). When ``run_python`` returns, no process of
the run is left (in ``none``: with the filter active).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import random
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
ISOLATIONS = ("auto", "namespaces", "userns", "uid", "none")
NS_LEVELS = ("namespaces", "userns")
# Dedicated uids, one per concurrent sandbox (a file lock makes each unique across processes
# of this machine). Anything running as one of them is treated as sandbox debris and killed.
UID_BASE = int(os.environ.get("GRPOKIT_SANDBOX_UID_BASE", 0x70000000))
UID_COUNT = 256
SETUP_FAILED = 125  # launcher exit status when it could not build the sandbox
_TAG = "grpokit-sandbox: setup failed"
# In the namespace levels, every top-level directory but these is covered by an empty tmpfs
# (an allow-list: a project checked out in /check, /data or /srv is hidden as surely as one
# in /home). /tmp gets the sandbox's own tmpfs; the interpreter's prefix always stays.
SYSTEM_DIRS = frozenset(
    ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc",
     "/sys", "/tmp")
)  # fmt: skip
HIDE_ALWAYS = ("/dev/mqueue",)


class SandboxError(RuntimeError):
    """The sandbox cannot run here (requested isolation unavailable, or setup failed)."""


@dataclass
class Result:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    killed_reason: str | None  # "timeout", "output", a signal name, "setup", or None
    wall_time: float
    isolation: str = ""


# The program that builds the sandbox. Runs as `python3 -I -S -c _LAUNCHER key=value...`:
# in `namespaces` mode as pid 1 (root) of the new namespaces, where it sets up the mounts,
# forks the program and waits for it (its exit takes every other process of the namespace
# with it); in the other modes it just sets limits and execs the program.
_LAUNCHER = r"""
import os, sys, resource
A = dict(s.split("=", 1) for s in sys.argv[1:])
UID = int(A["uid"])

def fail(msg):
    os.write(2, ("grpokit-sandbox: setup failed: %s\n" % msg).encode())
    os._exit(125)

def seccomp():
    import ctypes, struct
    m = os.uname().machine
    if m == "x86_64":
        arch, x32 = 0xC000003E, True
        deny = [62, 200, 234, 129, 297, 101, 310, 311, 41, 112, 109, 272, 308, 165, 166, 155,
                161, 250, 248, 249, 321, 298, 323, 29, 68, 64, 240]
        clone, fcntl_, ioctl, prlimit = 56, 72, 16, 302
    elif m == "aarch64":
        arch, x32 = 0xC00000B7, False
        deny = [129, 130, 131, 138, 240, 117, 270, 271, 198, 157, 154, 97, 268, 40, 39, 41,
                51, 219, 217, 218, 280, 241, 282, 194, 186, 190, 180]
        clone, fcntl_, ioctl, prlimit = 220, 25, 29, 261
    else:
        return
    # kill tkill tgkill rt_sigqueueinfo rt_tgsigqueueinfo ptrace process_vm_readv/writev socket
    # setsid setpgid unshare setns mount umount2 pivot_root chroot keyctl add_key request_key
    # bpf perf_event_open userfaultfd shmget msgget semget mq_open; then (same numbers on
    # both) pidfd_send_signal pidfd_getfd io_uring_setup/enter/register and the new mount API.
    deny += [424, 438, 425, 426, 427, 428, 429, 430, 431, 432, 433]
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, EPERM, ENOSYS, KILL = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000
    p = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, KILL), (LD, 0, 0, 0)]
    if x32:
        p += [(JGE, 0, 1, 0x40000000), (RET, 0, 0, EPERM)]
    for nr in deny:
        p += [(JEQ, 0, 1, nr), (RET, 0, 0, EPERM)]
    p += [(JEQ, 0, 1, 435), (RET, 0, 0, ENOSYS)]  # clone3: libc falls back to clone
    # clone with any CLONE_NEW* flag
    p += [(JEQ, 0, 4, clone), (LD, 0, 0, 16), (JSET, 0, 1, 0x7E020000), (RET, 0, 0, EPERM),
          (RET, 0, 0, ALLOW)]
    # prlimit64 on another process
    p += [(JEQ, 0, 4, prlimit), (LD, 0, 0, 16), (JEQ, 1, 0, 0), (RET, 0, 0, EPERM),
          (RET, 0, 0, ALLOW)]
    # fcntl F_SETOWN, F_SETSIG, F_SETOWN_EX (signals to other processes)
    p += [(JEQ, 0, 6, fcntl_), (LD, 0, 0, 24), (JEQ, 3, 0, 8), (JEQ, 2, 0, 10),
          (JEQ, 1, 0, 15), (RET, 0, 0, ALLOW), (RET, 0, 0, EPERM)]
    # ioctl TIOCSTI (typing into a terminal)
    p += [(JEQ, 0, 3, ioctl), (LD, 0, 0, 24), (JEQ, 0, 1, 0x5412), (RET, 0, 0, EPERM)]
    p += [(RET, 0, 0, ALLOW)]
    raw = b"".join(struct.pack("HBBI", *i) for i in p)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(p), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        fail("no_new_privs: errno %d" % ctypes.get_errno())
    if libc.prctl(22, 2, ctypes.addressof(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        fail("seccomp: errno %d" % ctypes.get_errno())

def run_program():
    try:
        for name in ("CPU", "AS", "FSIZE", "NPROC", "CORE", "NOFILE"):
            v = int(A[name.lower()])
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (v, v))
        if UID >= 0:
            os.setgroups([])
            os.setresgid(UID, UID, UID)
            os.setresuid(UID, UID, UID)
        if A["mode"] == "userns":  # root of its namespace: no capabilities after exec
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
            libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
            for cap in range(64):
                if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
                    fail("PR_CAPBSET_DROP %d: errno %d" % (cap, ctypes.get_errno()))
        if A["seccomp"] == "1":
            seccomp()
        py = A["python"]
        os.execve(py, [py, "-I", "-S", "-B", "prog.py"], os.environ)
    except BaseException as e:
        fail(repr(e))

def unescape(s):
    for a, b in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        s = s.replace(a, b)
    return s

def build_namespace():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]

    def mount(src, dst, fs, flags, data=None):
        if libc.mount(src, dst.encode(), fs, flags, data) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), dst)

    RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND = 1, 2, 4, 8, 32, 4096
    KEEP = {"nosuid": NOSUID, "nodev": NODEV, "noexec": NOEXEC, "noatime": 1024,
            "nodiratime": 2048, "relatime": 1 << 21}
    with open(A["prog"], "rb") as f:
        code = f.read()
    mount(None, "/", None, (1 << 14) | (1 << 18))  # MS_REC | MS_PRIVATE
    mount(b"proc", "/proc", b"proc", NOSUID | NODEV | NOEXEC)
    with open("/proc/self/mountinfo") as f:
        points = [(unescape(ln.split(" ")[4]), ln.split(" ")[5].split(",")) for ln in f]
    for mp, opts in points:
        flags = REMOUNT | BIND | RDONLY
        for o in opts:
            flags |= KEEP.get(o, 0)
        try:
            mount(None, mp, None, flags)
        except OSError:
            if mp == "/":
                raise
    for d in filter(None, A["hide"].split(os.pathsep)):
        mount(b"none", d, b"tmpfs", RDONLY | NOSUID | NODEV | NOEXEC, b"size=4k,mode=755")
    owner = max(UID, 0)  # userns: its root is the caller's user
    opts = "size=%sm,mode=700,uid=%d,gid=%d" % (A["disk"], owner, owner)
    mount(b"none", "/tmp", b"tmpfs", NOSUID | NODEV, opts.encode())
    if os.path.isdir("/dev/shm"):  # private, for multiprocessing's semaphores
        opts = "size=%sm,mode=1777" % A["disk"]
        mount(b"none", "/dev/shm", b"tmpfs", NOSUID | NODEV | NOEXEC, opts.encode())
    with open("/tmp/prog.py", "wb") as f:
        f.write(code)
    os.chdir("/tmp")

if A["mode"] in ("namespaces", "userns"):
    try:
        build_namespace()
    except BaseException as e:
        fail(repr(e))
    child = os.fork()
    if child == 0:
        run_program()
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(125)
        if pid == child:
            break
    rc = os.waitstatus_to_exitcode(status)
    os._exit(rc if rc >= 0 else 128 - rc)
run_program()
"""


# ---------------------------------------------------------------- isolation level


_lock = threading.Lock()
_resolved: dict[str, str] = {}
_seccomp_on: dict[str, bool] = {}
_warned: set[str] = set()


def _root() -> bool:
    return os.geteuid() == 0


@functools.cache
def _unshare() -> str | None:
    return shutil.which("unshare")


def _probe(mode: str) -> str | None:
    """None when a trivial program runs correctly under ``mode``; else why it does not."""
    if mode in ("namespaces", "uid") and not _root():
        return "needs root"
    if mode in ("userns", "none") and _root():
        return "refused as root: the program would run as root"
    if mode in NS_LEVELS and not _unshare():
        return "unshare not found"
    code = "print(6 * 7)\nprint(open('/proc/self/status').read())"
    try:
        r = _run(mode, code, "", timeout=20, cpu_seconds=10, seccomp=True)
    except Exception as e:  # pragma: no cover - machine-specific
        return f"{type(e).__name__}: {e}"
    lines = r.stdout.splitlines()
    if r.returncode != 0 or not lines or lines[0] != "42":
        return (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    _seccomp_on[mode] = any(ln.split() == ["Seccomp:", "2"] for ln in lines)
    return None


def resolve_isolation(isolation: str | None = None) -> str:
    """The isolation level a run gets: the requested one (argument, else the
    ``GRPOKIT_SANDBOX_ISOLATION`` variable, else ``auto``), checked once per process."""
    req = isolation or os.environ.get("GRPOKIT_SANDBOX_ISOLATION") or "auto"
    if req not in ISOLATIONS:
        raise ValueError(f"sandbox isolation {req!r}: choose one of {ISOLATIONS}")
    with _lock:
        if req not in _resolved:
            if req == "auto":
                why = {}
                for mode in ("namespaces", "uid") if _root() else ("userns", "none"):
                    why[mode] = _probe(mode)
                    if why[mode] is None:
                        break
                else:
                    raise SandboxError(f"no sandbox works here: {why}")
                if mode not in NS_LEVELS:
                    log.warning(
                        "sandbox: isolation %r (namespaces unavailable: %s); files%s are NOT "
                        "isolated, see docs/sandbox.md",
                        mode,
                        "; ".join(f"{k}: {v}" for k, v in why.items() if v),
                        "" if _seccomp_on.get(mode) else ", network, signals",
                    )
                _resolved[req] = mode
            else:
                why = _probe(req)
                if why is not None:
                    raise SandboxError(f"sandbox isolation {req!r} unavailable: {why}")
                _resolved[req] = req
        return _resolved[req]


def sandbox_info(isolation: str | None = None) -> dict:
    """What a run gets here: isolation level, whether the seccomp filter is active, python."""
    mode = resolve_isolation(isolation)
    return {
        "isolation": mode,
        "seccomp": _seccomp_on.get(mode, False),
        "python": PYTHON,
        "uids": (UID_BASE, UID_BASE + UID_COUNT - 1) if mode in ("namespaces", "uid") else None,
        "hidden": _hide_paths() if mode in NS_LEVELS else [],
    }


# ---------------------------------------------------------------- helpers


def _prefixes() -> list[str]:
    """Directories the interpreter needs (its prefix), which must never be hidden."""
    real = os.path.realpath(PYTHON)
    return [os.path.dirname(os.path.dirname(real)), os.path.dirname(real)]


def _hide_paths(extra: tuple[str, ...] = ()) -> list[str]:
    env = tuple(p for p in os.environ.get("GRPOKIT_SANDBOX_HIDE", "").split(os.pathsep) if p)
    top = [os.path.join("/", d) for d in _listdir("/")]
    top = [d for d in top if d not in SYSTEM_DIRS and os.path.realpath(d) not in SYSTEM_DIRS]
    cands = [*top, *HIDE_ALWAYS, os.path.expanduser("~"), os.getcwd(), *env, *extra]
    keep = _prefixes()
    out: list[str] = []
    for c in sorted({os.path.realpath(c) for c in cands if os.path.isabs(c)}):
        if c == "/" or os.pathsep in c or not os.path.isdir(c):
            continue
        if any(k == c or k.startswith(c + "/") for k in keep):
            if c not in _warned:
                _warned.add(c)
                log.warning("sandbox: %s holds the interpreter; it stays visible", c)
            continue
        if c == "/tmp" or c.startswith("/tmp/") or c == "/proc" or c.startswith("/proc/"):
            continue  # /tmp gets the sandbox's own tmpfs anyway
        if not any(c.startswith(o + "/") for o in out):
            out.append(c)
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _stage_root() -> str:
    root = os.environ.get("GRPOKIT_SANDBOX_TMPDIR") or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    return root


def _children(pid: int) -> list[int]:
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


def _pids_of(uid: int) -> list[int]:
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


def sandbox_processes() -> list[int]:
    """Live (not zombie) processes running as one of the sandbox's dedicated uids: empty
    whenever no ``run_python`` is in progress."""
    lo, hi = UID_BASE, UID_BASE + UID_COUNT
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/status") as f:
                    st = dict(ln.split(":", 1) for ln in f if ":" in ln)
            except OSError:
                continue
            if st["State"].split()[0] != "Z" and lo <= int(st["Uid"].split()[0]) < hi:
                out.append(int(d))
    return out


def _group_members(pgid: int) -> list[int]:
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


def _kill_uid(uid: int, deadline: float = 5.0) -> None:
    """SIGKILL every process running as ``uid``: kill(-1) from a child that became ``uid``
    (one sweep reaches them all, no pid races), repeated until /proc shows none."""
    if not _pids_of(uid):
        return
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
                if not [q for q in _pids_of(uid) if q != me]:
                    os._exit(0)
                time.sleep(0.005)
            os._exit(1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        log.warning("sandbox: processes of uid %d survived the cleanup", uid)


def _rmtree(path: str) -> None:
    """Remove a directory tree; never touches anything outside it."""
    root = os.path.abspath(path)
    if not os.path.lexists(root):
        return

    def retry(func, p, exc_info):
        if isinstance(exc_info[1], FileNotFoundError):
            return
        try:  # a program running as the caller may have made its own directories unreadable
            parent = os.path.dirname(p)
            if parent == root or parent.startswith(root + "/"):
                os.chmod(parent, 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(root, onerror=retry)
    if os.path.lexists(root):
        log.warning("sandbox: could not remove %s", root)


def _remove_files_of(uid: int) -> None:
    """Remove what ``uid`` left at the top of the world-writable temporary directories."""
    for d in {"/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir()}:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if e.is_dir(follow_symlinks=False):
                    _rmtree(e.path)
                else:
                    os.unlink(e.path)
            except OSError:
                pass


class _Slot:
    """One dedicated uid, held through an exclusive file lock for the length of a run."""

    cleaned: set[int] = set()

    def __init__(self) -> None:
        d = os.path.join(tempfile.gettempdir(), "grpokit-sandbox-uids")
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
        if st.st_uid != 0 or st.st_mode & 0o077:
            raise SandboxError(f"{d} must be a directory owned by root with mode 700")
        start = random.randrange(UID_COUNT)
        while True:
            for i in range(UID_COUNT):
                uid = UID_BASE + (start + i) % UID_COUNT
                fd = os.open(os.path.join(d, str(uid)), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self.uid, self.fd = uid, fd
                if uid not in _Slot.cleaned:  # a crashed earlier holder may have left debris
                    _kill_uid(uid)
                    _remove_files_of(uid)
                    _Slot.cleaned.add(uid)
                return
            time.sleep(0.05)

    def release(self) -> None:
        os.close(self.fd)


def _user_tasks() -> int:
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


def _exited(p: subprocess.Popen) -> bool:
    """Whether the direct child has ended, without reaping it (its pid, and so its process
    group id, stays reserved until we kill the group)."""
    try:
        return os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _pump(p: subprocess.Popen, data: bytes, deadline: float, cap: int):
    """Feed stdin, read stdout/stderr as they come, keep at most ``cap`` bytes of each.
    Returns (stdout, stderr, reason) with reason "timeout", "output" or None."""
    fds = {p.stdout.fileno(): bytearray(), p.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in fds:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    win = p.stdin.fileno()
    pending = memoryview(data)
    if pending:
        os.set_blocking(win, False)
        sel.register(win, selectors.EVENT_WRITE)
    else:
        p.stdin.close()
    reason = None

    def read(fd: int) -> bool | None:
        """Read one chunk: True if data came, False at end of file, None if none is there."""
        nonlocal reason
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return None
        if not chunk:
            return False
        buf = fds[fd]
        room = cap - len(buf)
        buf += chunk[: max(room, 0)]
        if len(chunk) > room:
            reason = "output"
        return True

    nap = 0.001
    try:
        while reason is None:
            left = deadline - time.monotonic()
            if left <= 0:
                reason = "timeout"
                break
            if not sel.get_map():  # both pipes closed; the program may still run
                time.sleep(min(left, nap))
                nap = min(nap * 2, 0.05)
            for key, _ in sel.select(min(left, 0.1)) if sel.get_map() else ():
                if key.fd == win:
                    try:
                        pending = pending[os.write(win, pending[:65536]) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # the program closed its stdin
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(win)
                        p.stdin.close()
                elif read(key.fd) is False:
                    sel.unregister(key.fd)
                if reason:
                    break
            if reason is None and _exited(p):
                # Its output is all in the pipes now; something it left behind may still hold
                # them open, so take what is there instead of waiting for end of file.
                for fd in list(sel.get_map()):
                    if fd != win:
                        while reason is None and read(fd):
                            pass
                break
    finally:
        sel.close()
    out, err = fds.values()
    return bytes(out), bytes(err), reason


def _wait_draining(p: subprocess.Popen, limit: float) -> bool:
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


def _stop(mode: str, p: subprocess.Popen) -> bool:
    """Kill whatever is left of the run and reap the direct child; True if we had to kill."""
    if mode in NS_LEVELS:
        # Kill the namespace's init, not unshare: unshare then returns only once the kernel
        # has torn the namespace down, so nothing of the run is left when it has exited.
        if p.poll() is not None:
            return False
        kids = _children(p.pid)
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not kids:
            os.killpg(p.pid, signal.SIGKILL)
        if not _wait_draining(p, 30):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        return True
    # The seccomp filter keeps every descendant in this process group. p is not reaped yet,
    # so the group id cannot be reused while we kill and wait for the group to be empty.
    killed = not _exited(p)
    end = time.monotonic() + 10
    while True:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        if not _group_members(p.pid):
            break
        if time.monotonic() > end:
            log.warning("sandbox: process group %d survived the cleanup", p.pid)
            break
        time.sleep(0.002)
    p.wait()
    return killed


# ---------------------------------------------------------------- running


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
    """Run ``code`` as a Python program with ``stdin``; see the module docstring.

    ``timeout`` is wall-clock seconds, ``cpu_seconds`` the CPU limit per process (default:
    ``timeout`` rounded up), ``memory_mb`` the address space per process, ``max_file_mb``
    the largest file it may write, ``max_procs`` its processes and threads, ``disk_mb`` the
    size of its /tmp (namespaces only). ``seccomp=False`` drops the syscall filter (tests use
    it to check the other layers alone); ``hide`` adds directories to cover.
    """
    mode = resolve_isolation(isolation)
    return _run(
        mode,
        code,
        stdin,
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


def _run(
    mode: str,
    code: str,
    stdin: str,
    *,
    timeout: float,
    cpu_seconds: int | None = None,
    memory_mb: int = 512,
    max_output_bytes: int = 1_000_000,
    max_file_mb: int = 10,
    max_procs: int = 16,
    disk_mb: int = 64,
    seccomp: bool = True,
    hide: tuple[str, ...] = (),
) -> Result:
    if mode in ("userns", "none") and _root():
        raise SandboxError(f"isolation {mode!r} refused as root: the program would run as root")
    stage = tempfile.mkdtemp(prefix="grpokit-sbx-", dir=_stage_root())
    slot = p = None
    t0 = time.monotonic()
    try:
        with open(os.path.join(stage, "prog.py"), "w") as f:
            f.write(code)
        if mode in ("userns", "none"):  # RLIMIT_NPROC counts all of the user's tasks
            uid, nproc = -1, _user_tasks() + max_procs
        else:
            slot = _Slot()
            uid, nproc = slot.uid, max_procs
            if mode == "uid":
                os.chown(stage, uid, uid)
        home = "/tmp" if mode in NS_LEVELS else stage
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}
        cpu = cpu_seconds if cpu_seconds is not None else max(1, int(-(-timeout // 1)))
        args = {
            "mode": mode,
            "python": PYTHON,
            "prog": os.path.join(stage, "prog.py"),
            "uid": uid,
            "cpu": cpu,
            "as": memory_mb * 2**20,
            "fsize": max_file_mb * 2**20,
            "nproc": nproc,
            "core": 0,
            "nofile": 256,
            "seccomp": int(seccomp),
            "disk": disk_mb,
            "hide": os.pathsep.join(_hide_paths(hide)) if mode in NS_LEVELS else "",
        }
        cmd = [PYTHON, "-I", "-S", "-c", _LAUNCHER, *(f"{k}={v}" for k, v in args.items())]
        if mode in NS_LEVELS:
            ns = ["--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child=SIGKILL"]
            if mode == "userns":
                ns = ["--user", "--map-root-user", *ns]
            cmd = [_unshare(), *ns, *cmd]
        t0 = time.monotonic()
        p = subprocess.Popen(
            cmd,
            cwd=stage,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        out, err, reason = _pump(p, stdin.encode(), t0 + timeout, max_output_bytes)
        if _stop(mode, p) and mode in NS_LEVELS:
            rc = -signal.SIGKILL  # unshare's own status after its child was killed means little
        else:
            rc = p.returncode
            if mode in NS_LEVELS and 128 < rc < 128 + 65:
                rc = 128 - rc  # the namespace's init reports a signal death as 128 + signal
        if rc == SETUP_FAILED and _TAG in err.decode(errors="replace"):
            # could be the program pretending, so only a warning; the probe run catches a
            # sandbox that really cannot be built
            log.warning("sandbox: %s", err.decode(errors="replace").strip()[-300:])
            reason = reason or "setup"
        if reason is None and rc is not None and rc < 0:
            try:
                reason = signal.Signals(-rc).name
            except ValueError:
                reason = f"signal {-rc}"
        return Result(
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            rc,
            reason == "timeout",
            reason,
            time.monotonic() - t0,
            mode,
        )
    finally:
        if p is not None:
            if p.returncode is None:
                _stop(mode, p)
            for f in (p.stdin, p.stdout, p.stderr):
                try:
                    f.close()
                except (OSError, ValueError):
                    pass
        if slot is not None:
            if mode == "uid":
                _kill_uid(slot.uid)
                _remove_files_of(slot.uid)
            slot.release()
        _rmtree(stage)


# ---------------------------------------------------------------- scoring


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
