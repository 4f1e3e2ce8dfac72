"""The four isolation levels by name, what each needs, and the interpreter every run uses
(docs/sandbox.md has the table of what each level isolates)."""

from __future__ import annotations

import functools
import os
import shutil

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
ISOLATIONS = ("auto", "namespaces", "userns", "uid", "none")
NS_LEVELS = ("namespaces", "userns")  # fresh namespaces, hidden files, private /tmp
AS_CALLER = ("userns", "none")  # run as the caller's user: refused as root


class SandboxError(RuntimeError):
    """The sandbox cannot run here (requested isolation unavailable, or setup failed)."""


def is_root() -> bool:
    return os.geteuid() == 0


@functools.cache
def unshare_path() -> str | None:
    return shutil.which("unshare")


def refusal(mode: str) -> str | None:
    """Why ``mode`` cannot even be tried by this process, or None."""
    if mode in ("namespaces", "uid") and not is_root():
        return "needs root"
    if mode in AS_CALLER and is_root():
        return "refused as root: the program would run as root"
    if mode in NS_LEVELS and not unshare_path():
        return "unshare not found"
    return None
