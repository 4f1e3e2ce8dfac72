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
        self.sections: dict[str, Any] = {}  # written into every status.json (e.g. "health")

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
            **self.sections,
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


HEALTH_STOP_EXIT_CODE = 4  # grpokit train's exit code when health_checks: stop ended the run


class HealthAlerts:
    """The trainer's side of ``grpokit.health``: feeds it each step's metrics and each
    held-out evaluation; says each alert that fires or clears once (a logging warning, main
    process), keeps ``status.json``'s ``health`` section current, and under
    ``health_checks: stop`` holds the line that ends the run (``stop_line``). Every process
    runs the same detectors on the same reduced metrics, so all of them stop together."""

    def __init__(self, cfg, status: RunStatus, *, enabled: bool):
        from grpokit.health import HealthMonitor, health_mode

        self.mode, self.status = health_mode(cfg.health_checks), status
        self.enabled = enabled
        self.monitor = HealthMonitor(cfg.to_dict(), cfg.health_params)
        self.stop_line: str | None = None
        if self.mode != "off":
            status.sections["health"] = {"mode": self.mode, **self.monitor.summary()}

    def observe(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """A step's metrics in; the ``health/*`` metrics to log with them out."""
        if self.mode == "off":
            return {}
        self._say(step, self.monitor.observe(step, metrics))
        return self.monitor.metrics()

    def observe_eval(self, step: int, result: dict[str, Any]) -> None:
        if self.mode != "off":
            self._say(step, self.monitor.observe_eval(step, result))

    def _say(self, step: int, events) -> None:
        for e in events:
            line = e.line
            if e.fired and self.mode == "stop" and self.stop_line is None:
                self.stop_line = line
                line += (
                    f" [health_checks: stop: saving a checkpoint and ending the run, exit code "
                    f"{HEALTH_STOP_EXIT_CODE}]"
                )
            if self.enabled:
                log.warning("%s", line)
        if events:
            self.status.sections["health"] = {"mode": self.mode, **self.monitor.summary()}
            if self.stop_line:
                self.status.sections["health"]["stopped_by"] = self.stop_line
            if self.status.state is not None:
                self.status.set(self.status.state, step)

    def stop_now(self) -> bool:
        """Under ``stop``: whether an alert fired on any process (one collective a round when
        several train, so they all stop at the same step even if an evaluation differed)."""
        if self.mode != "stop":
            return False
        from grpokit import distributed as dist

        flag = float(self.stop_line is not None)
        if dist.world_size() > 1:
            import torch

            flag = dist.all_reduce_sum(torch.tensor(flag)).item()
        return flag > 0

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.monitor.load_state_dict(state)
        if self.mode != "off":
            self.status.sections["health"] = {"mode": self.mode, **self.monitor.summary()}


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
