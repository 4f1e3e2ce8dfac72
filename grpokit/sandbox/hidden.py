"""Which directories the namespace levels cover with an empty read-only tmpfs.

An allow-list: every top-level directory but the system ones is covered, so a project
checked out in /check, /data or /srv is hidden as surely as one in /home; so are the
caller's home and cwd wherever they are, and ``GRPOKIT_SANDBOX_HIDE``. /tmp is not listed
because it gets the sandbox's own private tmpfs (which hides everything under it); the
interpreter's prefix always stays visible.
"""

from __future__ import annotations

import logging
import os

from grpokit.sandbox.levels import PYTHON

log = logging.getLogger("grpokit.sandbox")

SYSTEM_DIRS = frozenset(
    ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc",
     "/sys", "/tmp")
)  # fmt: skip
HIDE_ALWAYS = ("/dev/mqueue",)
_warned: set[str] = set()


def interpreter_prefixes() -> list[str]:
    """Directories the interpreter needs (its prefix), which must never be hidden."""
    real = os.path.realpath(PYTHON)
    return [os.path.dirname(os.path.dirname(real)), os.path.dirname(real)]


def hide_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """The directories to cover, outermost only, for a run that also hides ``extra``."""
    env = tuple(p for p in os.environ.get("GRPOKIT_SANDBOX_HIDE", "").split(os.pathsep) if p)
    top = [os.path.join("/", d) for d in _listdir("/")]
    top = [d for d in top if d not in SYSTEM_DIRS and os.path.realpath(d) not in SYSTEM_DIRS]
    cands = [*top, *HIDE_ALWAYS, os.path.expanduser("~"), os.getcwd(), *env, *extra]
    keep = interpreter_prefixes()
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
