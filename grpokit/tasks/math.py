"""``math``: competition math with a checkable final answer (OpenR1-Math-220k layout).

Sources: rows with ``problem`` and ``answer`` and/or ``solution`` — a local file or
directory, or the hub id ``open-r1/OpenR1-Math-220k`` (config ``default``; train split
only, so set ``test_size`` for a seeded held-out slice).

Rows: ``problem``, ``answer`` (may be empty), ``solution``. The ``solution`` column, which
open-r1-style ``accuracy`` rewards parse for the gold, is ``$<answer>$`` when the row has
an answer (so the gold is exactly the final answer), else the worked solution (its
``\\boxed{}`` is found first).

Grader: the ``accuracy`` reward's own rule (``grpokit.rewards.mathgrade``, math-verify in a
time-bounded worker process, as open-r1's accuracy reward uses it): the gold is parsed from
``solution``; the completion's answer is the first LaTeX answer found, ``\\boxed{}`` first,
with no anchor-less fallback; rows whose gold cannot be parsed are never counted correct.
``is_formatted``: ``<think>...</think>`` then ``<answer>...</answer>`` and nothing after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from grpokit.rewards.countdown import is_think_answer_format
from grpokit.rewards.mathgrade import GRADER
from grpokit.tasks.base import Task, TaskDataError

SYSTEM_PROMPT = (
    "You are a helpful AI Assistant that provides well-reasoned and detailed responses. You "
    "first think about the reasoning process as an internal monologue and then provide the "
    "user with the answer. Respond in the following format: <think>\n...\n</think>\n"
    "<answer>\n...\n</answer>. Put the final answer within \\boxed{}."
)
HUB_ID = "open-r1/OpenR1-Math-220k"


def verify_answer(completion: str, solution: str) -> bool:
    """True when the ``accuracy`` reward scores ``completion`` 1.0 against ``solution``."""
    return GRADER.grade([("accuracy", completion, solution)])[0] == 1.0


@dataclass
class MathTask(Task):
    default_reward_funcs: tuple = ("accuracy",)
    default_system_prompt: str | None = SYSTEM_PROMPT
    required_columns: tuple = ("problem", "solution")

    param_defaults: ClassVar[dict[str, Any]] = {"test_size": None}
    default_dataset: ClassVar[str | None] = HUB_ID
    source_prompt_column: ClassVar[str | None] = "problem"
    source_columns: ClassVar[tuple[str, ...]] = ("problem", "answer", "solution")
    known_datasets: ClassVar[tuple[str, ...]] = ("open-r1/OpenR1-Math-220k",)
    default_dataset_config: ClassVar[str | None] = "default"

    def process_row(self, row: dict[str, Any]) -> dict[str, Any]:
        if "problem" not in row or not ("answer" in row or "solution" in row):
            raise TaskDataError(
                f"math rows need 'problem' and 'answer' and/or 'solution'; got {sorted(row)}"
            )
        answer = str(row.get("answer") or "").strip()
        solution = f"${answer}$" if answer else str(row.get("solution") or "")
        return {"problem": row["problem"], "answer": answer, "solution": solution}

    def make_user_message(self, row: dict[str, Any]) -> str:
        return row["problem"]

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        return verify_answer(completion, row["solution"])

    def is_formatted(self, completion: str) -> bool:
        return is_think_answer_format(completion)
