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
from grpokit.sandbox.reap import kill_uid, tasks_by_uid

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
    """One dedicated uid, held through an exclusive file lock until ``release``.

    A uid is taken only if it owns no process at all, zombies included: the killed children
    of the last run on it (a program that forked) wait for pid 1 to reap them, about 1-2 s
    here, and until then they count against the uid's RLIMIT_NPROC, so a correct program
    run on it could not fork and would score 0. Only when every free uid still has some is
    one taken anyway, with ``debris`` (its leftover count) added to the run's process limit.
    """

    cleaned: set[int] = set()  # uids this process has already swept for debris

    def __init__(self) -> None:
        d = os.path.join(tempfile.gettempdir(), "grpokit-sandbox-uids")
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
        if st.st_uid != 0 or st.st_mode & 0o077:
            raise SandboxError(f"{d} must be a directory owned by root with mode 700")
        start = random.randrange(UID_COUNT)
        while True:
            owned = tasks_by_uid(UID_BASE, UID_BASE + UID_COUNT)
            for clean_only in (True, False):
                for i in range(UID_COUNT):
                    uid = UID_BASE + (start + i) % UID_COUNT
                    if clean_only and owned.get(uid) or not self._take(d, uid, clean_only):
                        continue
                    return
            time.sleep(0.05)

    def _take(self, d: str, uid: int, clean_only: bool) -> bool:
        """Lock ``uid`` if no one holds it (and, with ``clean_only``, if it owns nothing)."""
        fd = os.open(os.path.join(d, str(uid)), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        if uid not in UidLease.cleaned:  # a crashed earlier holder may have left debris
            kill_uid(uid)
            remove_files_of(uid)
            UidLease.cleaned.add(uid)
        debris = tasks_by_uid(uid, uid + 1).get(uid, 0)  # counted after the lock: final
        if clean_only and debris:
            os.close(fd)
            return False
        self.uid, self.fd, self.debris = uid, fd, debris
        return True

    def release(self) -> None:
        os.close(self.fd)
