"""The dedicated uids of the ``namespaces`` and ``uid`` levels: one per sandbox running at
once on this machine (an exclusive file lock makes each unique across processes). Anything
running as one of them is treated as sandbox debris and killed."""

from __future__ import annotations

import fcntl
import os
import random
import tempfile
import time

from grpokit.sandbox.files import remove_files_of
from grpokit.sandbox.levels import SandboxError
from grpokit.sandbox.reap import kill_uid

UID_BASE = int(os.environ.get("GRPOKIT_SANDBOX_UID_BASE", 0x70000000))
UID_COUNT = 256


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


class UidLease:
    """One dedicated uid, held through an exclusive file lock until ``release``."""

    cleaned: set[int] = set()  # uids this process has already swept for debris

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
                if uid not in UidLease.cleaned:  # a crashed earlier holder may have left debris
                    kill_uid(uid)
                    remove_files_of(uid)
                    UidLease.cleaned.add(uid)
                return
            time.sleep(0.05)

    def release(self) -> None:
        os.close(self.fd)
