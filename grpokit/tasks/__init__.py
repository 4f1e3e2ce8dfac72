"""Tasks: dataset rows -> chat prompts + the columns their rewards need.

    task = get_task("gsm8k")                      # or "countdown", "math", "tldr", ...
    rows = task.build("train", limit=1000)        # [{"prompt": messages, "answer": ...}, ...]
    task.default_reward_funcs                     # reward names for grpokit.rewards
    task.is_correct(completion_text, row)         # the evaluation grader

See docs/tasks.md for each task's data, parameters, rewards and grader.
"""

from __future__ import annotations

import difflib
from typing import Any

from grpokit.tasks.arithmetic import ArithmeticTask
from grpokit.tasks.base import Task, TaskDataError
from grpokit.tasks.countdown import CountdownTask
from grpokit.tasks.custom import CustomTask
from grpokit.tasks.gsm8k import GSM8KTask
from grpokit.tasks.math import MathTask
from grpokit.tasks.tldr import TLDRTask

__all__ = [
    "Task",
    "TaskDataError",
    "get_task",
    "register_task",
    "registered_tasks",
    "task_for_dataset",
]

_TASKS: dict[str, type[Task]] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "custom": CustomTask,
    "generic": CustomTask,
    "gsm8k": GSM8KTask,
    "math": MathTask,
    "tldr": TLDRTask,
}


def register_task(name: str, cls: type[Task]) -> None:
    """Make ``cls`` (a Task subclass) available to ``get_task(name)`` and recipes."""
    if name in _TASKS and _TASKS[name] is not cls:
        raise ValueError(f"task {name!r} is registered twice")
    _TASKS[name] = cls


def task_for_dataset(dataset_name: str | None) -> str | None:
    """The task whose layout the dataset ``dataset_name`` has, when grpokit knows it: a hub
    id such as ``open-r1/OpenR1-Math-220k``, or a local path whose last component is that
    id's name (``/data/OpenR1-Math-220k``). None when unknown."""
    if not dataset_name:
        return None
    name = str(dataset_name).rsplit("#", 1)[0].rstrip("/").replace("\\", "/").split("/")[-1].lower()
    for task, cls in _TASKS.items():
        if any(k.split("/")[-1].lower() == name for k in cls.known_datasets):
            return task
    return None


def registered_tasks() -> list[str]:
    return sorted(_TASKS)


def get_task(
    name: str,
    *,
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    dataset_prompt_column: str | None = None,
    train_split: str = "train",
    **params: Any,
) -> Task:
    """The task ``name`` configured with a dataset, system prompt, seed and its own params.

    ``dataset_name`` may end in ``#N``: N rows of ``train_split`` drawn by ``seed``
    (ms-swift's sample count; see ``grpokit.tasks.sources.sample_indices``)."""
    if name not in _TASKS:
        close = difflib.get_close_matches(name, list(_TASKS), n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown task {name!r}{hint} Known: {', '.join(registered_tasks())}")
    return _TASKS[name](
        name=name,
        dataset_name=dataset_name,
        dataset_config=dataset_config,
        system_prompt=system_prompt,
        seed=seed,
        params=params,
        prompt_column=dataset_prompt_column,
        train_split=train_split,
    )


from grpokit.tasks import code as _code  # noqa: E402,F401  (registers task 'code')
