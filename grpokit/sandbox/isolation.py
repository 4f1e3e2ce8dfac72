"""Which isolation level a run gets here: the requested one, or for ``auto`` the strongest
that runs a trivial program correctly on this machine, probed once per process."""

from __future__ import annotations

import logging
import os
import threading

from grpokit.sandbox.child import Limits, run_child
from grpokit.sandbox.hidden import hide_paths
from grpokit.sandbox.levels import ISOLATIONS, NS_LEVELS, PYTHON, SandboxError, is_root, refusal
from grpokit.sandbox.uids import UID_BASE, UID_COUNT

log = logging.getLogger("grpokit.sandbox")

_lock = threading.Lock()
_resolved: dict[str, str] = {}
_seccomp_on: dict[str, bool] = {}


def probe(mode: str) -> str | None:
    """None when a trivial program runs correctly under ``mode``; else why it does not.
    Records whether the seccomp filter was active in the program."""
    why = refusal(mode)
    if why is not None:
        return why
    code = "print(6 * 7)\nprint(open('/proc/self/status').read())"
    try:
        r = run_child(mode, code, "", Limits(timeout=20, cpu_seconds=10, seccomp=True))
    except Exception as e:  # pragma: no cover - machine-specific
        return f"{type(e).__name__}: {e}"
    lines = r.stdout.splitlines()
    if r.returncode != 0 or not lines or lines[0] != "42":
        return (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    _seccomp_on[mode] = any(ln.split() == ["Seccomp:", "2"] for ln in lines)
    return None


def _auto() -> str:
    """The first level of the machine's preference order whose probe passes."""
    why = {}
    for mode in ("namespaces", "uid") if is_root() else ("userns", "none"):
        why[mode] = probe(mode)
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
    return mode


def resolve_isolation(isolation: str | None = None) -> str:
    """The isolation level a run gets: the requested one (argument, else the
    ``GRPOKIT_SANDBOX_ISOLATION`` variable, else ``auto``), checked once per process."""
    req = isolation or os.environ.get("GRPOKIT_SANDBOX_ISOLATION") or "auto"
    if req not in ISOLATIONS:
        raise ValueError(f"sandbox isolation {req!r}: choose one of {ISOLATIONS}")
    with _lock:
        if req not in _resolved:
            if req == "auto":
                _resolved[req] = _auto()
            else:
                why = probe(req)
                if why is not None:
                    raise SandboxError(f"sandbox isolation {req!r} unavailable: {why}")
                _resolved[req] = req
        return _resolved[req]


def sandbox_info(isolation: str | None = None) -> dict:
    """What a run gets here: isolation level, whether the seccomp filter is active, python,
    the dedicated uids and the directories hidden (namespace levels)."""
    mode = resolve_isolation(isolation)
    return {
        "isolation": mode,
        "seccomp": _seccomp_on.get(mode, False),
        "python": PYTHON,
        "uids": (UID_BASE, UID_BASE + UID_COUNT - 1) if mode in ("namespaces", "uid") else None,
        "hidden": hide_paths() if mode in NS_LEVELS else [],
    }
