"""Reading a run directory, tolerantly: a missing file or key, or a malformed line, becomes a
note instead of an error."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunData:
    """Everything the report shows, read from a run directory."""

    run_dir: Path
    train: list[dict[str, Any]] = field(default_factory=list)  # one row per step, sorted
    evals: list[dict[str, Any]] = field(default_factory=list)  # rows holding eval/<key>
    completions: list[dict[str, Any]] = field(default_factory=list)
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    config_text: str | None = None
    skipped: dict[str, int] = field(default_factory=dict)  # file -> malformed lines
    notes: list[str] = field(default_factory=list)
    status: dict[str, Any] | None = None  # status.json: running / finished / stopped / failed


def finite(v: Any) -> float | None:
    """``v`` as a float, or None when it is missing, not a number, NaN or infinite."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a jsonl file, and the number of lines that were not one."""
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(obj, dict) and finite(obj.get("step")) is not None:
            rows.append(obj)
        else:
            bad += 1
    return rows, bad


def read_json_object(path: Path, notes: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(errors="replace"))
    except ValueError as e:
        notes.append(f"{path.name} is not valid JSON ({e}); ignored")
        return None
    if not isinstance(obj, dict):
        notes.append(f"{path.name} does not hold a JSON object; ignored")
        return None
    return obj


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; never raises on missing or malformed files."""
    d = RunData(Path(run_dir))
    p = d.run_dir / "metrics.jsonl"
    if p.is_file():
        rows, d.skipped["metrics.jsonl"] = read_jsonl(p)
        by_step: dict[float, dict[str, Any]] = {}
        for r in rows:
            ev = {k: v for k, v in r.items() if k.startswith("eval/")}
            tr = {k: v for k, v in r.items() if not k.startswith("eval/")}
            if ev:
                d.evals.append({"step": r["step"], **ev})
            if len(tr) > 1:  # a resumed run may log a step twice: the last one wins
                by_step[r["step"]] = tr
        d.train = [by_step[s] for s in sorted(by_step)]
        d.evals.sort(key=lambda r: r["step"])
    else:
        d.notes.append("no metrics.jsonl: training curves are omitted")
    p = d.run_dir / "completions.jsonl"
    if p.is_file():
        d.completions, d.skipped["completions.jsonl"] = read_jsonl(p)
    summary = read_json_object(d.run_dir / "eval_summary.json", d.notes) or {}
    before, after = summary.get("before"), summary.get("after")
    d.before = (
        before
        if isinstance(before, dict)
        else read_json_object(d.run_dir / "eval_before.json", d.notes)
    )
    d.after = (
        after
        if isinstance(after, dict)
        else read_json_object(d.run_dir / "eval_after.json", d.notes)
    )
    st = d.run_dir / "status.json"
    if st.is_file():
        status = read_json_object(st, d.notes)
        d.status = status if isinstance(status, dict) else None
    p = d.run_dir / "config.yaml"
    if p.is_file():
        d.config_text = p.read_text(errors="replace")
        try:
            import yaml

            cfg = yaml.safe_load(d.config_text)
            d.config = cfg if isinstance(cfg, dict) else None
        except Exception as e:  # a broken config must not stop the report
            d.notes.append(f"config.yaml could not be parsed ({type(e).__name__}); shown raw")
    return d
