"""Load a split of a table: a local file or directory (jsonl, json, parquet, csv) or a hub id."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from grpokit.tasks.base import TaskDataError

_EXTS = (".jsonl", ".json", ".parquet", ".csv")


def _read_file(p: Path) -> list[dict[str, Any]]:
    if p.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(p.read_text().splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskDataError(f"{p}:{i + 1} is not valid JSON: {e}") from e
        return rows
    if p.suffix == ".json":
        data = json.loads(p.read_text())
        return data if isinstance(data, list) else data.get("data", [])
    if p.suffix == ".csv":
        with open(p, newline="") as f:
            return list(csv.DictReader(f))
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise TaskDataError(f"reading {p} needs pyarrow: pip install pyarrow") from e
        return pq.read_table(p).to_pylist()
    raise TaskDataError(f"{p}: unsupported file type; use one of {_EXTS}")


def load_table(source: str, split: str, config: str | None = None) -> list[dict[str, Any]]:
    p = Path(source).expanduser()
    if p.is_file():
        return _read_file(p)
    if p.is_dir():
        for ext in _EXTS:
            files = sorted(p.glob(f"{split}*{ext}")) or sorted(p.glob(f"*{split}*{ext}"))
            if files:
                return [r for f in files for r in _read_file(f)]
        raise TaskDataError(f"no {split}.* file ({', '.join(_EXTS)}) in {p}")
    if source.startswith((".", "/", "~")) or Path(source).suffix in _EXTS:
        raise TaskDataError(f"dataset path {source!r} does not exist")
    try:
        import datasets
    except ImportError as e:
        raise TaskDataError(f"loading hub dataset {source!r} needs `pip install datasets`") from e
    try:
        ds = datasets.load_dataset(source, config, split=split)
    except Exception as e:
        raise TaskDataError(f"cannot load hub dataset {source!r} split {split!r}: {e}") from e
    return list(ds)
