"""The Task interface: dataset rows -> chat prompts + the columns their rewards need.

A task owns its data and its grader side by side. The trainer sees only rows:

    {"prompt": [{"role": "system", ...}, {"role": "user", "content": ...}], <columns>...}

where every other key (``answer``, ``nums``, ``target``, ...) is passed to the reward
functions as a keyword argument, repeated for each of the prompt's G completions.

Held-out data is always explicit: split "test" is either the source's own test split, or,
when the task parameter ``test_size`` is set, a seeded slice of the source's train split
that the "train" split then leaves out.

Rows read from a dataset are made when they are read (``SourceRows``): building a split
checks every row once, a batch at a time, and keeps only their positions, so a 220k-row
source is never held as Python dicts.
"""

from __future__ import annotations

import difflib
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from grpokit.tasks.sources import (
    RowSequence,
    SplitNotFound,
    Table,
    TaskDataError,
    load_table,
    parse_dataset_name,
    sample_indices,
)

SPLITS = ("train", "test")
log = logging.getLogger("grpokit")


DEMO_ROLES = ("user", "assistant", "tool")


def check_demonstrations(value: Any, task: str) -> list[dict[str, Any]]:
    """``task_params.demonstrations``: worked problems as earlier chat turns, placed after the
    system prompt and before the question (few-shot prompting: the way a small model is shown
    an output format it never writes from an instruction). A list of chat messages, each a
    mapping with a ``role`` of ``DEMO_ROLES`` and a string ``content`` (an assistant message
    may have ``tool_calls`` instead; a tool message may have a ``name``)."""
    if not isinstance(value, list):
        raise TaskDataError(
            f"task {task}: demonstrations={value!r}; give a list of chat messages "
            '({role: user|assistant|tool, content: "..."})'
        )
    for i, m in enumerate(value):
        ok = isinstance(m, dict) and m.get("role") in DEMO_ROLES
        ok = ok and (isinstance(m.get("content"), str) or bool(m.get("tool_calls")))
        ok = ok and (m.get("role") == "assistant" or isinstance(m.get("content"), str))
        if not ok:
            raise TaskDataError(
                f"task {task}: demonstrations[{i}]={m!r} is not a chat message; give "
                f"role (one of {list(DEMO_ROLES)}) and string content (or tool_calls for an "
                "assistant message)"
            )
    return value


@dataclass
class Task:
    """Base class. Subclasses implement ``make_user_message`` and ``is_correct``, and either
    ``process_row`` (tasks read from a dataset) or ``load_rows`` (generated tasks).

    ``params`` holds task-specific options from the recipe's ``task_params``; the keys a
    task accepts, with their defaults, are its ``param_defaults``. Unknown keys are errors.
    """

    name: str = "task"
    dataset_name: str | None = None
    dataset_config: str | None = None
    system_prompt: str | None = None
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    # A dataset column to read the prompt text from instead of the task's own column
    # (TRL/open-r1's ``dataset_prompt_column``); None keeps ``source_prompt_column``.
    prompt_column: str | None = None
    # The split that ``dataset_name``'s ``#N`` (ms-swift's sample count) applies to.
    train_split: str = "train"

    # Reward functions a recipe gets when it names none, and their weights.
    default_reward_funcs: tuple[Any, ...] = ()
    default_reward_weights: tuple[float, ...] | None = None
    default_system_prompt: str | None = None
    # Columns each built row must carry for the task's own rewards and grader.
    required_columns: tuple[str, ...] = ()

    param_defaults: ClassVar[dict[str, Any]] = {"test_size": None}
    # task_params every task accepts besides its own ``param_defaults``.
    common_params: ClassVar[dict[str, Any]] = {"demonstrations": []}
    default_dataset: ClassVar[str | None] = None  # used when dataset_name is None
    # The source column the task reads its prompt text from; None for tasks whose prompts
    # are built from other columns or generated (dataset_prompt_column does not apply).
    source_prompt_column: ClassVar[str | None] = None
    # The source columns ``process_row`` reads; a source that has them all is read with only
    # those (Arrow skips the others, e.g. OpenR1-Math's long ``generations``). () = all.
    source_columns: ClassVar[tuple[str, ...]] = ()
    # Hub datasets in the task's layout: a recipe naming one (or a local copy with the same
    # directory name) and no ``task`` gets this task (see ``task_for_dataset``).
    known_datasets: ClassVar[tuple[str, ...]] = ()
    default_dataset_config: ClassVar[str | None] = None

    _cache: dict[str, list[dict[str, Any]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.sample_count: int | None = None
        if self.dataset_name is not None:
            self.dataset_name, self.sample_count = parse_dataset_name(str(self.dataset_name))
        known = {**self.common_params, **self.param_defaults}
        unknown = [k for k in self.params if k not in known]
        if unknown:
            hints = []
            for k in unknown:
                close = difflib.get_close_matches(k, list(known), n=1)
                hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise TaskDataError(
                f"task {self.name!r}: unknown task_params {', '.join(hints)}; "
                f"it takes {sorted(known)}"
            )
        self.p: dict[str, Any] = {**known, **self.params}
        self.demonstrations = check_demonstrations(self.p["demonstrations"], self.name)
        self.configure()
        if self.prompt_column is not None and self.prompt_source_column() is None:
            raise TaskDataError(
                f"task {self.name!r} builds its prompts from other columns or generates them, "
                f"so dataset_prompt_column ({self.prompt_column!r}) does not apply; remove it"
            )

    def prompt_source_column(self) -> str | None:
        """The column ``process_row`` reads the prompt from (None: not one column)."""
        return self.source_prompt_column

    def configure(self) -> None:
        """Validate and unpack ``self.p`` (hook for subclasses)."""

    # ------------------------------------------------------------------ data
    @property
    def source(self) -> str | None:
        return self.dataset_name if self.dataset_name is not None else self.default_dataset

    def load_rows(self, split: str) -> Sequence[dict[str, Any]]:
        """Rows of ``split`` ("train" or "test") as the task's columns, each a dict of plain
        values, made when read; every row is processed once here to check it."""
        return SourceRows.scan(self, self.source_rows(split), split)

    def task_row(self, r: dict[str, Any], i: int, split: str) -> dict[str, Any] | None:
        """Source row ``r`` (row ``i`` of ``split``) -> the task's columns (None drops it)."""
        target = self.prompt_source_column()
        if self.prompt_column is not None and self.prompt_column != target:
            if self.prompt_column not in r:
                raise TaskDataError(
                    f"task {self.name!r}: dataset_prompt_column {self.prompt_column!r} is "
                    f"not a column of row {i} of split {split!r} (it has {sorted(r)}); set "
                    "it to the column that holds the prompt text"
                )
            r = {**r, target: r[self.prompt_column]}
        return self.process_row(r)

    def process_row(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """One source row -> the task's columns (None drops the row)."""
        return dict(row)

    def columns_read(self) -> tuple[str, ...]:
        """``source_columns``, with ``dataset_prompt_column`` in place of the prompt column."""
        target = self.prompt_source_column()
        if self.prompt_column is None:
            return self.source_columns
        return tuple(self.prompt_column if c == target else c for c in self.source_columns)

    def source_rows(self, split: str) -> Table:
        """Raw rows of ``split`` from ``self.source``, with the ``test_size`` hold-out and the
        ``#N`` sample (training split only) applied."""
        source = self.source
        if source is None:
            raise TaskDataError(f"task {self.name!r} needs dataset_name (a path or hub id)")
        config = self.dataset_config or self.default_dataset_config
        test_size = self.p.get("test_size")
        if test_size is not None:
            if split not in SPLITS:
                raise TaskDataError(
                    f"task {self.name!r} with test_size has splits {SPLITS}, not {split!r}"
                )
            table = self._read(source, "train", config)
            return self._sampled(
                table.select(holdout_indices(len(table), split, test_size, self.seed)), split
            )
        p = Path(source).expanduser()
        if p.is_file() and split != "train" and not p.name.startswith(split):
            raise SplitNotFound(
                f"task {self.name!r}: {p} is one file, which serves as the 'train' split; for a "
                f"held-out {split!r} split set task_params test_size (a count or a fraction, "
                f"held out by seed), or give a directory with {split}.jsonl"
            )
        try:
            return self._sampled(self._read(source, split, config), split)
        except SplitNotFound as e:
            raise SplitNotFound(
                f"{e}. Set task_params test_size (e.g. 500 or 0.05) to hold out a seeded "
                "slice of the train split instead"
            ) from e

    def _sampled(self, table: Table, split: str) -> Table:
        if self.sample_count is None or split != self.train_split:
            return table
        if self.sample_count > len(table):
            log.warning(
                "%s#%d: %d rows sampled from %d, so rows repeat (as ms-swift does)",
                self.source,
                self.sample_count,
                self.sample_count,
                len(table),
            )
        return table.select(sample_indices(len(table), self.sample_count, self.seed))

    def _read(self, source: str, split: str, config: str | None) -> Table:
        key = f"{source}|{config}|{split}"
        if key not in self._cache:
            self._cache[key] = load_table(source, split, config)
        return self._cache[key]

    # ------------------------------------------------------------------ prompts
    def make_user_message(self, row: dict[str, Any]) -> str:
        raise NotImplementedError

    def effective_system_prompt(self) -> str | None:
        return self.system_prompt if self.system_prompt is not None else self.default_system_prompt

    def make_prompt(self, row: dict[str, Any]) -> str | list[dict[str, str]]:
        """The model input for ``row``: chat messages (rendered through the chat template), or
        a plain string used as it is (TRL's "standard" format). Messages by default."""
        return self.make_messages(row)

    def demonstrated_questions(self) -> set[str]:
        """The user messages of the ``demonstrations``: a task never uses a row whose question
        is one of them (its worked answer is in every prompt): a generated task never draws
        it, a dataset's row is left out of every split (counted in a warning)."""
        return {m["content"] for m in self.demonstrations if m["role"] == "user"}

    def make_messages(self, row: dict[str, Any]) -> list[dict[str, str]]:
        """System prompt (if any), the ``demonstrations`` turns, then the question."""
        messages = []
        system = self.effective_system_prompt()
        if system:
            messages.append({"role": "system", "content": system})
        messages += [dict(m) for m in self.demonstrations]
        messages.append({"role": "user", "content": self.make_user_message(row)})
        return messages

    # ------------------------------------------------------------------ grading
    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        """The task's grader for evaluation accuracy (the same test as its main reward)."""
        raise NotImplementedError

    def is_formatted(self, completion: str) -> bool:
        """Whether the completion follows the output format the prompt asks for."""
        return True

    # ------------------------------------------------------------------ build
    def build(self, split: str, limit: int | None = None) -> Sequence[dict[str, Any]]:
        """Rows of ``split`` with their model input: ``{"prompt": messages or text, **columns}``."""
        rows = self.load_rows(split)
        if limit is not None:
            rows = rows[:limit]
        if not len(rows):
            raise TaskDataError(
                f"task {self.name!r}: split {split!r} of {self.source or 'its dataset'} is "
                "empty; point dataset_name at a file or hub dataset with rows"
            )
        if isinstance(rows, SourceRows):  # checked row by row when scanned
            return rows.with_prompts()
        for i, row in enumerate(rows):
            self.check_columns(row, i, split)
        return [{**row, "prompt": self.make_prompt(row)} for row in rows]

    def check_columns(self, row: dict[str, Any], i: int, split: str) -> None:
        missing = [c for c in self.required_columns if c not in row]
        if missing:
            raise TaskDataError(
                f"task {self.name!r}: row {i} of split {split!r} lacks column(s) {missing} "
                f"(has {sorted(row)}); use a dataset with those columns or set task_params "
                "to map them"
            )


class SourceRows(RowSequence):
    """A split's rows as the task makes them from its source table, made when read.

    ``scan`` processes every source row once, a batch at a time, to check it and to note
    which rows the task keeps; only those positions are held. Reading row ``i`` processes
    its source row again (``process_row`` is a pure function of the row).
    """

    def __init__(self, task: Task, table: Table, keep: Sequence[int], split: str, prompts=False):
        self.task, self.table, self.keep, self.split, self.prompts = (
            task,
            table,
            keep,
            split,
            prompts,
        )

    @classmethod
    def scan(cls, task: Task, table: Table, split: str) -> SourceRows:
        table = table.with_columns(task.columns_read())
        shown, shown_rows = task.demonstrated_questions(), 0
        keep: list[int] = []
        i = 0
        for batch in table.batches():
            for r in batch:
                row = task.task_row(r, i, split)
                if row is not None and shown and task.make_user_message(row) in shown:
                    row, shown_rows = None, shown_rows + 1
                if row is not None:
                    task.check_columns(row, len(keep), split)
                    keep.append(i)
                i += 1
        if shown_rows:
            log.warning(
                "task %r: %d row(s) of split %r left out: their question is one of the "
                "demonstrations, whose worked answer is in every prompt",
                task.name, shown_rows, split,
            )  # fmt: skip
        return cls(task, table, range(i) if len(keep) == i else keep, split)

    def with_prompts(self) -> SourceRows:
        return SourceRows(self.task, self.table, self.keep, self.split, prompts=True)

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return SourceRows(self.task, self.table, self.keep[i], self.split, self.prompts)
        j = self.keep[i]
        row = self.task.task_row(self.table[j], j, self.split)
        if self.prompts:
            row = {**row, "prompt": self.task.make_prompt(row)}
        return row


def holdout_indices(n: int, split: str, test_size: int | float, seed: int) -> list[int]:
    """Positions of ``split`` in a seeded train/test partition of ``n`` rows; ``test_size``
    is a count or a fraction in (0, 1).

    Both parts keep the source order; the same (n, test_size, seed) always gives the same
    partition, and the two parts never share a row.
    """
    if isinstance(test_size, float) and 0 < test_size < 1:
        k = max(1, round(n * test_size))
    elif isinstance(test_size, (int, float)) and not isinstance(test_size, bool):
        k = int(test_size)
    else:
        raise TaskDataError(f"test_size={test_size!r}; use a row count or a fraction in (0, 1)")
    if not 0 < k < n:
        raise TaskDataError(f"test_size={test_size!r} leaves no train or no test rows of {n}")
    test_idx = set(random.Random(seed).sample(range(n), k))
    if split == "test":
        return sorted(test_idx)
    return [i for i in range(n) if i not in test_idx]


def holdout(
    rows: Sequence[dict[str, Any]], split: str, test_size: int | float, seed: int
) -> list[dict[str, Any]]:
    """The rows of ``split`` in the seeded partition ``holdout_indices`` makes of ``rows``."""
    return [rows[i] for i in holdout_indices(len(rows), split, test_size, seed)]
