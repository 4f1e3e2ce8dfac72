"""A run's stdin, stdout and stderr: stdin written without blocking, output read as it
arrives and capped while reading, so the parent never holds more than the cap plus one
64 KiB read per stream, whatever the program prints."""

from __future__ import annotations

import os
import selectors
import subprocess
import time

from grpokit.sandbox.reap import exited

CHUNK = 65536


class _Streams:
    """The pipes of one run, registered on one selector."""

    def __init__(self, p: subprocess.Popen, data: bytes, cap: int) -> None:
        self.p, self.cap = p, cap
        self.reason: str | None = None  # "output" once a stream passed the cap
        self.bufs = {p.stdout.fileno(): bytearray(), p.stderr.fileno(): bytearray()}
        self.sel = selectors.DefaultSelector()
        for fd in self.bufs:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.win = p.stdin.fileno()
        self.pending = memoryview(data)
        if self.pending:
            os.set_blocking(self.win, False)
            self.sel.register(self.win, selectors.EVENT_WRITE)
        else:
            p.stdin.close()

    def read(self, fd: int) -> bool | None:
        """Read one chunk: True if data came, False at end of file, None if none is there."""
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return None
        if not chunk:
            return False
        buf = self.bufs[fd]
        room = self.cap - len(buf)
        buf += chunk[: max(room, 0)]
        if len(chunk) > room:
            self.reason = "output"
        return True

    def write(self) -> None:
        """Write the next chunk of stdin; close it when all is written or the program
        closed its end."""
        try:
            self.pending = self.pending[os.write(self.win, self.pending[:CHUNK]) :]
        except BlockingIOError:
            return
        except OSError:  # the program closed its stdin
            self.pending = self.pending[:0]
        if not self.pending:
            self.sel.unregister(self.win)
            self.p.stdin.close()

    def serve(self, wait: float) -> None:
        """Handle what is ready within ``wait`` seconds; stop early past the cap."""
        for key, _ in self.sel.select(wait) if self.sel.get_map() else ():
            if key.fd == self.win:
                self.write()
            elif self.read(key.fd) is False:
                self.sel.unregister(key.fd)
            if self.reason:
                break

    def drain(self) -> None:
        """Take what the output pipes hold now, without waiting for end of file."""
        for fd in list(self.sel.get_map()):
            if fd != self.win:
                while self.reason is None and self.read(fd):
                    pass


def pump(p: subprocess.Popen, data: bytes, deadline: float, cap: int):
    """Feed stdin, read stdout/stderr as they come, keep at most ``cap`` bytes of each.
    Returns (stdout, stderr, reason) with reason "timeout", "output" or None."""
    s = _Streams(p, data, cap)
    nap = 0.001
    try:
        while s.reason is None:
            left = deadline - time.monotonic()
            if left <= 0:
                s.reason = "timeout"
                break
            if not s.sel.get_map():  # both pipes closed; the program may still run
                time.sleep(min(left, nap))
                nap = min(nap * 2, 0.05)
            s.serve(min(left, 0.1))
            if s.reason is None and exited(p):
                # Its output is all in the pipes now; something it left behind may still
                # hold them open, so take what is there instead of waiting for end of file.
                s.drain()
                break
    finally:
        s.sel.close()
    out, err = s.bufs.values()
    return bytes(out), bytes(err), s.reason
