"""Running one tool call: in this process, under a time limit, every failure turned into the
tool message the model reads (never an exception out of the rollout).

Failure kinds (counted per completion, logged as ``tools/failures/<kind>``): ``malformed``
(the block is not a call: bad JSON, no name), ``unknown`` (no tool of that name), ``raised``
(the tool raised, wrong arguments included), ``timeout`` (still running after
``tool_timeout`` seconds).

The time limit: in the main thread, a SIGALRM timer raises inside the tool (a Python loop
stops there; a C call that never returns to Python cannot be interrupted this way); in
another thread, the tool runs in a daemon thread that is abandoned when it overruns.
Code the model wrote belongs in ``grpokit.sandbox`` (the ``python`` built-in tool), not here.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpokit.tools.parse import MalformedCall, ToolCall
from grpokit.tools.template import tool_content

FAILURE_KINDS = ("malformed", "unknown", "raised", "timeout")


class ToolTimeout(BaseException):
    """Raised inside an overrunning tool (a BaseException: a tool's ``except Exception``
    does not swallow it)."""


@dataclass(frozen=True)
class Outcome:
    name: str  # the tool's name as called ("unknown" when none could be read)
    content: str  # the tool message's text
    failure: str | None  # one of FAILURE_KINDS, or None


def _error(name: str, kind: str, text: str) -> Outcome:
    return Outcome(name, tool_content({"error": text}), kind)


def _with_alarm(fn: Callable[[], Any], seconds: float) -> Any:
    def ring(_sig, _frame):
        raise ToolTimeout

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _in_thread(fn: Callable[[], Any], seconds: float) -> Any:
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="grpokit-tool")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise ToolTimeout
    if "error" in box:
        raise box["error"]
    return box["value"]


def call_with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()``, or ToolTimeout after ``seconds``."""
    main = threading.current_thread() is threading.main_thread()
    if main and hasattr(signal, "setitimer"):
        return _with_alarm(fn, seconds)
    return _in_thread(fn, seconds)


def _invoke(fn: Callable, arguments: dict[str, Any]) -> Any:
    """``fn(**arguments)``; an ``async def`` tool's coroutine is run to its end (TRL awaits
    async tools)."""
    out = fn(**arguments)
    if inspect.isawaitable(out):
        out = asyncio.run(_awaited(out))
    return out


async def _awaited(awaitable):
    return await awaitable


def run_call(call: ToolCall | MalformedCall, tools: dict[str, Callable], timeout: float) -> Outcome:
    """The tool message for ``call`` against ``tools`` (name -> function)."""
    if isinstance(call, MalformedCall):
        return _error(call.name, "malformed", call.why)
    fn = tools.get(call.name)
    if fn is None:
        known = ", ".join(sorted(tools)) or "none"
        return _error(call.name, "unknown", f"no tool named {call.name!r} (tools: {known})")
    try:
        result = call_with_timeout(lambda: _invoke(fn, call.arguments), timeout)
    except ToolTimeout:
        return _error(call.name, "timeout", f"{call.name} did not finish within {timeout:g} s")
    except Exception as e:
        return _error(call.name, "raised", f"{type(e).__name__}: {e}")
    return Outcome(call.name, tool_content(result), None)
