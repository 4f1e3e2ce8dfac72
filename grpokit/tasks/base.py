"""The Task interface: dataset rows -> chat prompts + the columns their rewards need.

A task owns its data and its grader side by side. The trainer sees only rows:

    {"prompt": [{"role": "system", ...}, {"role": "user", "content": ...}], <columns>...}

where every other key (``answer``, ``nums``, ``target``, ...) is passed to the reward
functions as a keyword argument, repeated for each of the prompt's G completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class TaskDataError(ValueError):
    """A dataset does not have what the task needs (columns, rows, files)."""


@dataclass
class Task:
    """Base class. Subclasses set ``name`` and implement ``load_rows``, ``make_user_message``
    and ``is_correct``.

    ``params`` holds task-specific options from the recipe's ``task_params``.
    """

    name: str = "task"
    dataset_name: str | None = None
    dataset_config: str | None = None
    system_prompt: str | None = None
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)

    # Reward functions a recipe gets when it names none, and their weights.
    default_reward_funcs: tuple[Any, ...] = ()
    default_reward_weights: tuple[float, ...] | None = None
    default_system_prompt: str | None = None
    # Columns each row must carry for the task's own rewards.
    required_columns: tuple[str, ...] = ()

    def load_rows(self, split: str) -> list[dict[str, Any]]:
        """Raw rows of ``split`` ("train" or "test"), each a dict of plain values."""
        raise NotImplementedError

    def make_user_message(self, row: dict[str, Any]) -> str:
        raise NotImplementedError

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        """The task's grader for evaluation accuracy (the same test as its main reward)."""
        raise NotImplementedError

    def is_formatted(self, completion: str) -> bool:
        """Whether the completion follows the output format the prompt asks for."""
        return True

    def build(self, split: str, limit: int | None = None) -> list[dict[str, Any]]:
        """Rows of ``split`` rendered as chat prompts: ``{"prompt": messages, **columns}``."""
        rows = self.load_rows(split)
        if limit is not None:
            rows = rows[:limit]
        if not rows:
            raise TaskDataError(
                f"task {self.name!r}: split {split!r} of {self.dataset_name or 'its dataset'} is empty; "
                "point dataset_name at a file or hub dataset with rows"
            )
        missing = [c for c in self.required_columns if c not in rows[0]]
        if missing:
            raise TaskDataError(
                f"task {self.name!r}: rows lack column(s) {missing} (have {sorted(rows[0])}); "
                "use a dataset with those columns or set task_params to map them"
            )
        system = (
            self.system_prompt if self.system_prompt is not None else self.default_system_prompt
        )
        out = []
        for row in rows:
            messages = []
            if system:
                messages.append({"role": "system", "content": system})
            messages.append({"role": "user", "content": self.make_user_message(row)})
            out.append({**row, "prompt": messages})
        return out
