"""The files of a run: its staging directory, and what a dedicated uid left in the
world-writable temporary directories (the ``uid`` level cannot hide them)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

log = logging.getLogger("grpokit.sandbox")


def stage_root() -> str:
    """Where staging directories go: ``GRPOKIT_SANDBOX_TMPDIR``, else the temp dir."""
    root = os.environ.get("GRPOKIT_SANDBOX_TMPDIR") or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    return root


def rmtree(path: str) -> None:
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


def remove_files_of(uid: int) -> None:
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
                    rmtree(e.path)
                else:
                    os.unlink(e.path)
            except OSError:
                pass
