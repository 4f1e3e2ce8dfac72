"""Tasks: dataset rows -> chat prompts + the columns their rewards need."""

from __future__ import annotations

import difflib

from grpokit.tasks.arithmetic import ArithmeticTask
from grpokit.tasks.base import Task, TaskDataError
from grpokit.tasks.gsm8k import GSM8KTask

_TASKS: dict[str, type[Task]] = {"arithmetic": ArithmeticTask, "gsm8k": GSM8KTask}

__all__ = ["Task", "TaskDataError", "get_task", "register_task", "registered_tasks"]


def register_task(name: str, cls: type[Task]) -> None:
    _TASKS[name] = cls


def registered_tasks() -> list[str]:
    return sorted(_TASKS)


def get_task(
    name: str, *, dataset_name=None, dataset_config=None, system_prompt=None, seed=0, **params
) -> Task:
    if name not in _TASKS:
        close = difflib.get_close_matches(name, list(_TASKS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown task {name!r}{hint} Known: {', '.join(registered_tasks())}")
    return _TASKS[name](
        name=name,
        dataset_name=dataset_name,
        dataset_config=dataset_config,
        system_prompt=system_prompt,
        seed=seed,
        params=params,
    )
