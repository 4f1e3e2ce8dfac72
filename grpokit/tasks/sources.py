"""Where a task's rows come from: one split of a table, from a local file or directory,
or a hub dataset id.

Local sources (``.jsonl``, ``.json``, ``.parquet``, ``.csv``):

- a file: all of its rows, whatever the split (a file has no splits; tasks that need a
  test split from one file hold out a seeded slice with ``test_size``);
- a directory: the files for the split, found as ``<split>.<ext>``, ``<split>-*.<ext>``
  (hub shard names such as ``train-00000-of-00001.parquet``), also under ``data/``.

Anything else that is not an existing path is taken as a hub id and loaded with
``datasets.load_dataset(source, config, split=split)`` (``datasets`` is imported only then).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

EXTS = (".jsonl", ".json", ".parquet", ".csv")


class TaskDataError(ValueError):
    """A dataset does not have what the task needs (columns, rows, files, parameters).

    Defined here, in the module every task reads its data through, so that this module
    needs nothing from the rest of ``grpokit.tasks`` (``base`` imports it, not the reverse).
    """


class SplitNotFound(TaskDataError):
    """The source exists but has no such split."""


def read_file(path: str | Path) -> list[dict[str, Any]]:
    """All rows of one local file, as a list of dicts of plain Python values."""
    p = Path(path)
    if p.suffix == ".jsonl":
        rows = []
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise TaskDataError(f"{p}:{i + 1} is not valid JSON: {e}") from e
        return rows
    if p.suffix == ".json":
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise TaskDataError(f"{p} is not valid JSON: {e}") from e
        if isinstance(data, dict):  # {"data": [...]} or column-oriented {"col": [...]}
            if isinstance(data.get("data"), list):
                data = data["data"]
            elif data and all(isinstance(v, list) for v in data.values()):
                keys = list(data)
                data = [dict(zip(keys, vals)) for vals in zip(*data.values())]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise TaskDataError(
                f"{p}: expected a JSON list of objects (or {{'data': [...]}}); "
                "for one object a line, name the file .jsonl"
            )
        return data
    if p.suffix == ".csv":
        with open(p, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise TaskDataError(
                f"reading {p} needs pyarrow, which is not installed: pip install pyarrow"
            ) from e
        return pq.read_table(p).to_pylist()
    raise TaskDataError(f"{p}: unsupported file type {p.suffix!r}; use one of {', '.join(EXTS)}")


def split_files(directory: Path, split: str) -> list[Path]:
    """The files holding ``split`` in ``directory`` (first extension in EXTS order that has any)."""
    for base in (directory, directory / "data"):
        for ext in EXTS:
            files = sorted(base.glob(f"{split}{ext}")) or sorted(base.glob(f"{split}-*{ext}"))
            if files:
                return files
    return []


def looks_local(source: str) -> bool:
    """True when ``source`` is written as a path rather than a hub id ("owner/name")."""
    return (
        source.startswith((".", "/", "~"))
        or Path(source).suffix in EXTS
        or "\\" in source
        or source.count("/") > 1
    )


def load_table(source: str, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``split`` from a local file/directory or a hub dataset id."""
    p = Path(source).expanduser()
    if p.is_file():
        return read_file(p)
    if p.is_dir():
        files = split_files(p, split)
        if not files:
            have = sorted(f.name for f in p.iterdir() if f.suffix in EXTS)
            raise SplitNotFound(
                f"no {split!r} split in {p}: expected {split}.jsonl (or .json/.parquet/.csv, or "
                f"{split}-*.parquet shards); found {have or 'no data files'}"
            )
        return [r for f in files for r in read_file(f)]
    if looks_local(source):
        raise TaskDataError(
            f"dataset path {str(p)!r} does not exist; give an existing file or directory "
            f"({', '.join(EXTS)}), or a hub id such as 'owner/name'"
        )
    return load_hub(source, split, config)


def load_hub(source: str, split: str, config: str | None = None) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as e:
        raise TaskDataError(
            f"{source!r} is not a local path, so it is read as a hub dataset, which needs the "
            "`datasets` package: pip install datasets (or download the data and give its path)"
        ) from e
    try:
        ds = datasets.load_dataset(source, config, split=split)
    except ValueError as e:
        if "split" in str(e).lower():
            raise SplitNotFound(f"hub dataset {source!r} has no split {split!r}: {e}") from e
        raise TaskDataError(f"cannot load hub dataset {source!r} (config {config!r}): {e}") from e
    except Exception as e:  # network, auth, missing repo: one readable message
        raise TaskDataError(
            f"cannot load hub dataset {source!r} (config {config!r}, split {split!r}): {e}. "
            "If the hub is unreachable, download the dataset and set dataset_name to its path"
        ) from e
    return [dict(r) for r in ds]
