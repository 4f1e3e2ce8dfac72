"""The run as seen from outside while it trains: ``status.json`` and ``report.html`` in the
output directory, and Ctrl-C / SIGTERM turned into "stop after this step, with a checkpoint"."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("grpokit")


class RunStatus:
    """Writes ``status.json`` (what the run is doing, for the report: a running run's page
    reloads) and ``report.html``, on the main process only (``enabled``)."""

    def __init__(self, out: Path, total_steps: int, *, enabled: bool, report: bool):
        self.out, self.total_steps = Path(out), total_steps
        self.enabled, self.report_enabled = enabled, report
        self.state: str | None = None
        self._report_warned = False

    def set(self, state: str, step: int, **extra: Any) -> None:
        self.state = state
        if not self.enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "state": state,
            "step": step,
            "total_steps": self.total_steps,
            "updated": time.time(),
            **extra,
        }
        tmp = self.out / ".status.json.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.out / "status.json")

    def write_report(self, step: int) -> Path | None:
        """report.html of the run so far; a failure here is logged, never fatal."""
        if not (self.report_enabled and self.enabled):
            return None
        try:
            from grpokit.report import write_report

            if self.state == "running":
                self.set("running", step)  # the page shows the step it was written at
            return write_report(self.out)
        except ImportError as e:
            if not self._report_warned:
                log.warning("report.html not written (%s); pip install matplotlib", e)
                self._report_warned = True
        except Exception as e:  # noqa: BLE001 - the run matters more than its report
            log.warning("report.html not written: %s: %s", type(e).__name__, e)
        return None


class StopRequests:
    """While entered: the first SIGINT/SIGTERM sets ``requested`` (the loop stops after the
    step, with a checkpoint), a second one stops at once (KeyboardInterrupt)."""

    def __init__(self, say) -> None:
        self.say, self.requested = say, False
        self._old: dict = {}

    def _handler(self, signum, frame) -> None:
        if self.requested:  # second press: stop now
            raise KeyboardInterrupt
        self.requested = True
        self.say(
            f"\n{signal.Signals(signum).name}: finishing this step, then saving "
            "a checkpoint (press again to stop at once)"
        )

    def __enter__(self) -> StopRequests:
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}
