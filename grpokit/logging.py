"""Metric sinks: metrics.jsonl (the source of truth), the console, completions table."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO


def _fmt_time(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class MetricsLogger:
    """Appends one JSON object per logged step to ``metrics.jsonl`` and prints a progress line.

    The console line is plain text (no control characters) unless the stream is a TTY,
    where the previous progress line is overwritten.
    """

    def __init__(
        self,
        output_dir: str | Path,
        total_steps: int,
        stream: TextIO | None = None,
        enabled: bool = True,
        trackers: list | None = None,
    ):
        self.dir = Path(output_dir)
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self.trackers = trackers or []
        self.t0: float | None = (
            None  # set by start(), so evaluation before training is not in the ETA
        )
        self.step0 = 0
        if enabled:
            self.dir.mkdir(parents=True, exist_ok=True)

    def start(self, step: int) -> None:
        """Start the ETA clock at the first training step (``step`` steps already done)."""
        self.t0, self.step0 = time.time(), step

    def log(self, step: int, metrics: dict[str, Any], *, resumed_from: int = 0) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        for t in self.trackers:
            t.log(row, step)
        if self.t0 is None:
            self.start(resumed_from)
        done = step - self.step0
        elapsed = time.time() - self.t0
        eta = elapsed / max(done, 1) * (self.total - step)
        frac = min(1.0, step / max(self.total, 1))
        bar = "#" * round(20 * frac) + "." * (20 - round(20 * frac))
        parts = [f"[{bar}] step {step}/{self.total}"]
        for key, label in (
            ("reward", "reward"),
            ("accuracy", "acc"),
            ("kl", "kl"),
            ("loss", "loss"),
            ("completions/mean_length", "len"),
        ):
            if key in row and row[key] is not None:
                parts.append(f"{label} {row[key]:.4g}")
        if "time/step" in row:
            parts.append(
                f"{row['time/step']:.1f}s/step (gen {row.get('time/generation', 0):.1f}"
                f" score {row.get('time/scoring', 0):.2f} train {row.get('time/training', 0):.1f})"
            )
        parts.append(f"ETA {_fmt_time(eta)}")
        self.print(" | ".join(parts))

    def print(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def log_completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with open(self.dir / "completions.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps({"step": step, **r}) + "\n")
        for t in self.trackers:
            t.log_completions(step, rows)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def truncate_logs(run_dir: Path, step: int) -> None:
    """Drop what a killed run logged after its last checkpoint (at ``step``): keep only the
    rows of metrics.jsonl and completions.jsonl whose step is <= ``step``."""
    for name in ("metrics.jsonl", "completions.jsonl"):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        kept = [
            ln
            for ln in path.read_text().splitlines()
            if ln.strip() and json.loads(ln).get("step", 0) <= step
        ]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(ln + "\n" for ln in kept))
        tmp.replace(path)
