"""Where a task's rows come from: one split of a table, from a local file or directory,
or a hub dataset id, read through the ``datasets`` library (Arrow, memory-mapped).

Local sources:

- a file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``, ``.arrow``): all of its rows,
  whatever the split (a file has no splits; tasks that need a test split from one file hold
  out a seeded slice with ``test_size``);
- a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``: its split
  (a saved ``Dataset`` has none, so it serves as the train split, like a file);
- any other directory: the files for the split, found as ``<split>.<ext>``, ``<split>-*.<ext>``
  (hub shard names such as ``train-00000-of-00001.parquet``), also under ``data/``.

Anything else that is not an existing path is taken as a hub id and loaded with
``datasets.load_dataset(source, config, split=split)``.

``dataset_name`` may end in ``#N`` (ms-swift's syntax, ``'owner/name#50000'``): N rows of
the training split, drawn by ``sample_indices``.

A split is a ``Table``: rows are made into Python dicts only when they are read (one at a
time, or a batch at a time), never all at once; a local file is converted once to an Arrow
file in the ``datasets`` cache (``HF_DATASETS_CACHE``) and memory-mapped from there.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

EXTS = (".jsonl", ".json", ".parquet", ".csv", ".arrow")
BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}
BATCH = 1000  # rows converted to Python at a time when a whole split is scanned


class TaskDataError(ValueError):
    """A dataset does not have what the task needs (columns, rows, files, parameters).

    Defined here, in the module every task reads its data through, so that this module
    needs nothing from the rest of ``grpokit.tasks`` (``base`` imports it, not the reverse).
    """


class SplitNotFound(TaskDataError):
    """The source exists but has no such split."""


# ---------------------------------------------------------------------- tables
class RowSequence(Sequence):
    """A read-only sequence of row dicts that compares equal to any sequence (a list, say)
    holding the same rows; unhashable, as a list is."""

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]


class Table(RowSequence):
    """The rows of one split: an Arrow-backed ``datasets.Dataset`` (or a plain list of dicts)
    seen through an optional list of row indices. ``table[i]`` is one row as a dict;
    ``batches()`` yields lists of row dicts, ``BATCH`` at a time."""

    def __init__(self, data: Any, indices: Sequence[int] | None = None):
        self.data, self.indices = data, indices

    def __len__(self) -> int:
        return len(self.indices) if self.indices is not None else len(self.data)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        j = int(self.indices[i]) if self.indices is not None else i
        return dict(self.data[j])

    def select(self, indices: Sequence[int]) -> Table:
        """The rows at ``indices`` of this table (in that order; repeats allowed)."""
        if self.indices is not None:
            indices = [int(self.indices[int(i)]) for i in indices]
        return Table(self.data, [int(i) for i in indices])

    @property
    def column_names(self) -> list[str] | None:
        return list(self.data.column_names) if hasattr(self.data, "column_names") else None

    def with_columns(self, columns: Sequence[str]) -> Table:
        """This table reading only ``columns`` (Arrow leaves the others untouched), when it has
        every one of them; else (or for a list of dicts, or no columns given) this table."""
        have = self.column_names
        cols = list(dict.fromkeys(columns))
        if not cols or have is None or not set(cols) <= set(have) or len(cols) == len(have):
            return self
        return Table(self.data.select_columns(cols), self.indices)

    def batches(self) -> Iterator[list[dict[str, Any]]]:
        if not hasattr(self.data, "iter"):  # a list of dicts
            for s in range(0, len(self), BATCH):
                yield self[s : s + BATCH]
            return
        data = self.data if self.indices is None else self.data.select(self.indices)
        for cols in data.iter(batch_size=BATCH):
            keys = list(cols)
            yield [dict(zip(keys, vals)) for vals in zip(*cols.values())]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for b in self.batches():
            yield from b


def sample_indices(n: int, count: int, seed: int) -> list[int]:
    """ms-swift's ``dataset#count`` draw from ``n`` rows: every row ``count // n`` times, then
    ``count % n`` distinct rows, the first of a seeded permutation (numpy's
    ``RandomState(seed).permutation(n)``, as ms-swift draws them with its ``data_seed``)."""
    import numpy as np

    if n == 0:
        return []
    idx = list(range(n)) * (count // n)
    rest = count % n
    if rest:
        idx += np.random.RandomState(seed).permutation(n)[:rest].tolist()
    return idx


def parse_dataset_name(name: str) -> tuple[str, int | None]:
    """``'owner/name#500'`` -> ``('owner/name', 500)``; a name without ``#N`` (or an existing
    path that contains ``#``) -> ``(name, None)``."""
    if "#" not in name or Path(name).expanduser().exists():
        return name, None
    base, count = name.rsplit("#", 1)
    if not count.strip().isdigit() or int(count) <= 0 or not base:
        raise TaskDataError(
            f"dataset_name {name!r}: after '#' give the number of training rows to sample "
            "(ms-swift's syntax, e.g. 'owner/name#5000'), or remove the '#'"
        )
    return base, int(count)


# ---------------------------------------------------------------------- local files
def _datasets():
    try:
        import datasets
    except ImportError as e:
        raise TaskDataError(
            "reading datasets needs the `datasets` package, which is not installed: "
            "pip install datasets"
        ) from e
    datasets.disable_progress_bars()
    return datasets


def _bad_json_line(path: Path) -> str | None:
    """Where a JSON-lines file stops parsing (``path:line: error``), or None."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as e:
                    return f"{path}:{i + 1} is not valid JSON: {e}"
    return None


def _json_document(path: Path):
    """A ``.json`` file holding one JSON document that is not a list of objects: its rows as
    an in-memory Dataset ({"data": [...]} or columns {"col": [...]}), else None (a list, or
    JSON lines, which the ``json`` builder reads itself)."""
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if not head.startswith("{"):
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None  # perhaps one object a line: the builder decides
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    elif isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        keys = list(data)
        data = [dict(zip(keys, vals)) for vals in zip(*data.values())]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise TaskDataError(
            f"{path}: expected a JSON list of objects (or {{'data': [...]}}); "
            "for one object a line, name the file .jsonl"
        )
    return _datasets().Dataset.from_list(data)


def _load_files(files: list[Path]):
    """The rows of ``files`` (all of one type) as one Dataset, through the ``datasets`` builder
    for their type (converted once into the ``datasets`` cache, then memory-mapped)."""
    datasets = _datasets()
    ext = files[0].suffix
    if ext not in BUILDERS:
        raise TaskDataError(
            f"{files[0]}: unsupported file type {ext!r}; use one of {', '.join(EXTS)}"
        )
    if ext == ".json" and len(files) == 1:
        doc = _json_document(files[0])
        if doc is not None:
            return doc
    kwargs: dict[str, Any] = {}
    if ext == ".csv":  # every field a string, empty ones "" (as csv.DictReader reads them)
        with open(files[0], encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        kwargs = dict(
            features=datasets.Features({c: datasets.Value("string") for c in header}),
            keep_default_na=False,
        )
    try:
        return datasets.load_dataset(
            BUILDERS[ext], data_files={"train": [str(f) for f in files]}, split="train", **kwargs
        )
    except Exception as e:
        if "corresponds to no data" in str(e):
            return []  # empty files: the task says the split is empty
        if ext in (".jsonl", ".json"):
            for f in files:
                where = _bad_json_line(f)
                if where:
                    raise TaskDataError(where) from e
        raise TaskDataError(f"cannot read {', '.join(map(str, files))}: {e}") from e


def read_file(path: str | Path) -> list[dict[str, Any]]:
    """All rows of one local file, as a list of dicts of plain Python values."""
    return list(Table(_load_files([Path(path)])))


def split_files(directory: Path, split: str) -> list[Path]:
    """The files holding ``split`` in ``directory`` (first extension in EXTS order that has any)."""
    for base in (directory, directory / "data"):
        for ext in EXTS:
            files = sorted(base.glob(f"{split}{ext}")) or sorted(base.glob(f"{split}-*{ext}"))
            if files:
                return files
    return []


def is_saved_dataset(p: Path) -> bool:
    """A directory written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return (p / "dataset_dict.json").is_file() or (p / "state.json").is_file()


def _load_saved(p: Path, split: str):
    try:
        saved = _datasets().load_from_disk(str(p))
    except TaskDataError:
        raise
    except Exception as e:
        raise TaskDataError(f"cannot read the saved dataset {p}: {e}") from e
    if not hasattr(saved, "keys"):  # one Dataset: no splits, like one file
        if split != "train":
            raise SplitNotFound(
                f"{p} is one saved Dataset, which serves as the 'train' split; it has no "
                f"{split!r} split"
            )
        return saved
    if split not in saved:
        raise SplitNotFound(f"no {split!r} split in the saved dataset {p} (it has {list(saved)})")
    return saved[split]


def looks_local(source: str) -> bool:
    """True when ``source`` is written as a path rather than a hub id ("owner/name")."""
    return (
        source.startswith((".", "/", "~"))
        or Path(source).suffix in EXTS
        or "\\" in source
        or source.count("/") > 1
    )


def load_table(source: str, split: str, config: str | None = None) -> Table:
    """Rows of ``split`` from a local file/directory or a hub dataset id."""
    p = Path(source).expanduser()
    if p.is_file():
        return Table(_load_files([p]))
    if p.is_dir():
        if is_saved_dataset(p):
            return Table(_load_saved(p, split))
        files = split_files(p, split)
        if not files:
            have = sorted(f.name for f in p.iterdir() if f.suffix in EXTS)
            raise SplitNotFound(
                f"no {split!r} split in {p}: expected {split}.jsonl (or .json/.parquet/.csv/"
                f".arrow, or {split}-*.parquet shards); found {have or 'no data files'}"
            )
        return Table(_load_files(files))
    if looks_local(source):
        raise TaskDataError(
            f"dataset path {str(p)!r} does not exist; give an existing file or directory "
            f"({', '.join(EXTS)}), or a hub id such as 'owner/name'"
        )
    return Table(load_hub(source, split, config))


def load_hub(source: str, split: str, config: str | None = None):
    try:
        import datasets
    except ImportError as e:
        raise TaskDataError(
            f"{source!r} is not a local path, so it is read as a hub dataset, which needs the "
            "`datasets` package: pip install datasets (or download the data and give its path)"
        ) from e
    hub_down(source)
    try:
        ds = datasets.load_dataset(source, config, split=split)
    except ValueError as e:
        if "split" in str(e).lower():
            raise SplitNotFound(f"hub dataset {source!r} has no split {split!r}: {e}") from e
        raise TaskDataError(f"cannot load hub dataset {source!r} (config {config!r}): {e}") from e
    except Exception as e:  # network, auth, missing repo: one readable message
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TaskDataError(
            f"cannot load hub dataset {source!r} (config {config!r}, split {split!r}): {first}. "
            "If the hub is unreachable, download the dataset and set dataset_name to its path"
        ) from e
    return ds if hasattr(ds, "iter") else list(ds)


def hub_down(source: str, timeout: float = 3.0) -> None:
    """Fail at once, in one line, when the hub is unreachable (``datasets`` would retry for
    half a minute, logging each try); with ``HF_HUB_OFFLINE=1`` ``datasets`` is asked anyway,
    so a copy already in its cache loads."""
    from grpokit.models import _offline, hub_reachable

    if not _offline() and not hub_reachable(timeout):
        raise TaskDataError(
            f"cannot load hub dataset {source!r}: the hub is unreachable (no connection within "
            f"{timeout:.0f}s). Download the dataset and set dataset_name to its path (a copy "
            "already in the datasets cache loads with HF_HUB_OFFLINE=1)"
        )
