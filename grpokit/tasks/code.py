"""Code task: ~30 short stdin/stdout programming problems written for grpokit, graded by
running the completion's last ```python block in grpokit.sandbox (see docs/sandbox.md).

Grader: the ``binary_code`` reward's rule on the ``code`` reward's own score
(``grpokit.rewards.code.code_scores``, default limits): a pass rate above 0.99; ``is_formatted``: there is a ```python
block."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from grpokit.rewards.code import binary_score, code_scores, extract_code
from grpokit.tasks.base import SPLITS, Task, TaskDataError, holdout

DATA = Path(__file__).parent / "data" / "code_problems.jsonl"
SYSTEM = (
    "Solve the programming problem in Python. The program reads standard input and writes "
    "standard output. Give the complete program in one ```python code block."
)


@dataclass
class CodeTask(Task):
    default_reward_funcs: tuple[Any, ...] = ("code",)
    default_system_prompt: str | None = SYSTEM
    required_columns: tuple[str, ...] = ("verification_info",)
    param_defaults: ClassVar[dict[str, Any]] = {"test_size": 6}

    def load_rows(self, split: str) -> list[dict[str, Any]]:
        if split not in SPLITS:
            raise TaskDataError(f"task {self.name!r} has splits {SPLITS}, not {split!r}")
        path = Path(self.dataset_name).expanduser() if self.dataset_name else DATA
        rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        return holdout(rows, split, self.p["test_size"], self.seed)

    def make_user_message(self, row: dict[str, Any]) -> str:
        return row["problem"]

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        return binary_score(code_scores([completion], [row["verification_info"]])[0]) == 1.0

    def is_formatted(self, completion: str) -> bool:
        return extract_code(completion) is not None


def _register() -> None:
    from grpokit.tasks import register_task

    register_task("code", CodeTask)


_register()
