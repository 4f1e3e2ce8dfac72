"""The program that builds the sandbox, run by path in the child (never imported there):

    python3 -I -S launcher.py mode=... uid=... stage=... argv=... cpu=... as=... ... hide=...

``stage`` is the directory holding the run's files (a Python program, a C++ source, a
compiled binary); ``argv`` the command to run there, its words joined by ``ARGV_SEP``. In the
namespace levels it is pid 1 (root) of the new namespaces: it reads the staged files, makes
every mount read-only, covers the hidden directories, mounts a private /tmp and /dev/shm,
copies the files into that /tmp, forks the command and waits for it; its exit takes every
other process of the namespace with it. In the other levels the stage is the working
directory: it sets the limits and execs the command.

Standard library only, and readable by the system ``python3`` of any supported version: it
runs outside grpokit's environment. grpokit imports it only for ``SETUP_FAILED`` and
``SETUP_TAG``.
"""

import os
import resource
import signal
import sys

SETUP_FAILED = 125  # exit status when the sandbox could not be built
SETUP_TAG = "grpokit-sandbox: setup failed"
ARGV_SEP = "\x1f"  # between the words of argv=
LIMITS = ("CPU", "AS", "FSIZE", "NPROC", "CORE", "NOFILE")

# Denied syscalls (EPERM), by architecture: kill tkill tgkill rt_sigqueueinfo
# rt_tgsigqueueinfo ptrace process_vm_readv/writev socket setsid setpgid unshare setns mount
# umount2 pivot_root chroot keyctl add_key request_key bpf perf_event_open userfaultfd shmget
# msgget semget mq_open; then (same numbers on both) pidfd_send_signal pidfd_getfd
# io_uring_setup/enter/register and the new mount API. (audit arch, x32 abi, denied,
# clone, fcntl, ioctl, prlimit64)
# fmt: off
ARCHES = {
    "x86_64": (0xC000003E, True,
               [62, 200, 234, 129, 297, 101, 310, 311, 41, 112, 109, 272, 308, 165, 166, 155,
                161, 250, 248, 249, 321, 298, 323, 29, 68, 64, 240],
               56, 72, 16, 302),
    "aarch64": (0xC00000B7, False,
                [129, 130, 131, 138, 240, 117, 270, 271, 198, 157, 154, 97, 268, 40, 39, 41,
                 51, 219, 217, 218, 280, 241, 282, 194, 186, 190, 180],
                220, 25, 29, 261),
}
# fmt: on
COMMON_DENY = [424, 438, 425, 426, 427, 428, 429, 430, 431, 432, 433]


def fail(msg):
    os.write(2, f"{SETUP_TAG}: {msg}\n".encode())
    os._exit(SETUP_FAILED)


def filter_program(machine):
    """The seccomp BPF program for ``machine`` as (code, jt, jf, k) tuples, or None when
    there is none for this architecture."""
    if machine not in ARCHES:
        return None
    arch, x32, deny, clone, fcntl_, ioctl, prlimit = ARCHES[machine]
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, EPERM, ENOSYS, KILL = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000
    p = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, KILL), (LD, 0, 0, 0)]
    if x32:
        p += [(JGE, 0, 1, 0x40000000), (RET, 0, 0, EPERM)]
    for nr in deny + COMMON_DENY:
        p += [(JEQ, 0, 1, nr), (RET, 0, 0, EPERM)]
    p += [(JEQ, 0, 1, 435), (RET, 0, 0, ENOSYS)]  # clone3: libc falls back to clone
    # fmt: off
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
    # fmt: on
    p += [(RET, 0, 0, ALLOW)]
    return p


def seccomp():
    """Install the filter (after no_new_privs); nothing on an architecture without one."""
    import ctypes
    import struct

    p = filter_program(os.uname().machine)
    if p is None:
        return
    raw = b"".join(struct.pack("HBBI", *i) for i in p)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(p), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        fail(f"no_new_privs: errno {ctypes.get_errno()}")
    if libc.prctl(22, 2, ctypes.addressof(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        fail(f"seccomp: errno {ctypes.get_errno()}")


def drop_capabilities():
    """userns: the program is root of its namespace; it keeps no capability after exec."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    for cap in range(64):
        if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            fail(f"PR_CAPBSET_DROP {cap}: errno {ctypes.get_errno()}")


def run_program(a):
    """Limits, the dedicated uid, capabilities, the filter; then exec the program."""
    try:
        for name in LIMITS:
            v = int(a[name.lower()])
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (v, v))
        uid = int(a["uid"])
        if uid >= 0:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        if a["mode"] == "userns":
            drop_capabilities()
        if a["seccomp"] == "1":
            seccomp()
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; exec keeps that
            signal.signal(sig, signal.SIG_DFL)
        argv = a["argv"].split(ARGV_SEP)
        os.execve(argv[0], argv, os.environ)
    except BaseException as e:
        fail(repr(e))


def unescape(s):
    """A path as /proc/self/mountinfo writes it (octal escapes) back to the path."""
    for a, b in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        s = s.replace(a, b)
    return s


RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND = 1, 2, 4, 8, 32, 4096
KEEP = {"nosuid": NOSUID, "nodev": NODEV, "noexec": NOEXEC, "noatime": 1024,
        "nodiratime": 2048, "relatime": 1 << 21}  # fmt: skip


def mounter():
    """mount(2) through libc, raising OSError with the target path."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]

    def mount(src, dst, fs, flags, data=None):
        if libc.mount(src, dst.encode(), fs, flags, data) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), dst)

    return mount


def remount_read_only(mount):
    """Every mount point read-only, keeping its nosuid/nodev/noexec/atime flags."""
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


def read_stage(stage):
    """The staged files as (name, mode, bytes), read before the host's /tmp is covered."""
    files = []
    for name in sorted(os.listdir(stage)):
        path = os.path.join(stage, name)
        with open(path, "rb") as f:
            files.append((name, os.stat(path).st_mode & 0o755, f.read()))
    return files


def build_namespace(a):
    """Mounts of the new mount namespace; leaves the program in a private /tmp."""
    mount = mounter()
    files = read_stage(a["stage"])
    mount(None, "/", None, (1 << 14) | (1 << 18))  # MS_REC | MS_PRIVATE
    mount(b"proc", "/proc", b"proc", NOSUID | NODEV | NOEXEC)
    remount_read_only(mount)
    for d in filter(None, a["hide"].split(os.pathsep)):
        mount(b"none", d, b"tmpfs", RDONLY | NOSUID | NODEV | NOEXEC, b"size=4k,mode=755")
    owner = max(int(a["uid"]), 0)  # userns: its root is the caller's user
    opts = f"size={a['disk']}m,mode=700,uid={owner},gid={owner}"
    mount(b"none", "/tmp", b"tmpfs", NOSUID | NODEV, opts.encode())
    if os.path.isdir("/dev/shm"):  # private, for multiprocessing's semaphores
        opts = f"size={a['disk']}m,mode=1777"
        mount(b"none", "/dev/shm", b"tmpfs", NOSUID | NODEV | NOEXEC, opts.encode())
    for name, mode, data in files:
        fd = os.open(os.path.join("/tmp", name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with open(fd, "wb") as f:
            f.write(data)
    os.chdir("/tmp")


def init(a):
    """pid 1 of the namespaces: build them, fork the program, exit with its status."""
    try:
        build_namespace(a)
    except BaseException as e:
        fail(repr(e))
    child = os.fork()
    if child == 0:
        run_program(a)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if pid == child:
            break
    rc = os.waitstatus_to_exitcode(status)
    os._exit(rc if rc >= 0 else 128 - rc)


def main(argv):
    a = dict(s.split("=", 1) for s in argv)
    if a["mode"] in ("namespaces", "userns"):
        init(a)
    run_program(a)


if __name__ == "__main__":
    main(sys.argv[1:])
