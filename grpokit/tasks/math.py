"""``math``: competition math with a checkable final answer (OpenR1-Math-220k layout).

Sources: rows with ``problem`` and ``answer`` and/or ``solution`` — a local file or
directory, or the hub id ``open-r1/OpenR1-Math-220k`` (config ``default``; train split
only, so set ``test_size`` for a seeded held-out slice).

Rows: ``problem``, ``answer`` (may be empty), ``solution``. The ``solution`` column, which
open-r1-style ``accuracy`` rewards parse for the gold, is ``$<answer>$`` when the row has
an answer (so the gold is exactly the final answer), else the worked solution (its
``\\boxed{}`` is found first).

Grader: math-verify (imported lazily), as open-r1's accuracy reward uses it: the gold is
parsed from ``solution``; the completion's answer is the first LaTeX answer found,
``\\boxed{}`` first, with no anchor-less fallback; rows whose gold cannot be parsed are
never counted correct.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from grpokit.tasks.base import Task, TaskDataError

SYSTEM_PROMPT = (
    "You are a helpful AI Assistant that provides well-reasoned and detailed responses. You "
    "first think about the reasoning process as an internal monologue and then provide the "
    "user with the answer. Respond in the following format: <think>\n...\n</think>\n"
    "<answer>\n...\n</answer>. Put the final answer within \\boxed{}."
)
HUB_ID = "open-r1/OpenR1-Math-220k"


def _math_verify():
    try:
        import math_verify
    except ImportError as e:
        raise ImportError(
            "the math task's grader needs math-verify: pip install math-verify"
        ) from e
    return math_verify


def _timeouts() -> tuple[dict, dict]:
    """math-verify's timeouts use signal.alarm, which only works in the main thread."""
    if threading.current_thread() is threading.main_thread():
        return {}, {}
    return {"parsing_timeout": None}, {"timeout_seconds": None}


def parse_gold(solution: str) -> list:
    mv = _math_verify()
    return mv.parse(solution, extraction_mode="first_match", **_timeouts()[0])


def verify_answer(completion: str, solution: str) -> bool:
    """True when the completion's answer equals the gold in ``solution`` (math-verify)."""
    mv = _math_verify()
    from math_verify import LatexExtractionConfig
    from math_verify.parser import NormalizationConfig

    gold = parse_gold(solution)
    if not gold:
        return False
    config = LatexExtractionConfig(
        normalization_config=NormalizationConfig(
            nits=False,
            malformed_operators=False,
            basic_latex=True,
            boxed="all",
            units=True,
        ),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    )
    parse_kw, verify_kw = _timeouts()
    pred = mv.parse(
        completion, extraction_config=[config], extraction_mode="first_match", **parse_kw
    )
    try:
        return bool(mv.verify(gold, pred, **verify_kw))
    except Exception:
        return False


@dataclass
class MathTask(Task):
    default_reward_funcs: tuple = ("accuracy",)
    default_system_prompt: str | None = SYSTEM_PROMPT
    required_columns: tuple = ("problem", "solution")

    param_defaults: ClassVar[dict[str, Any]] = {"test_size": None}
    default_dataset: ClassVar[str | None] = HUB_ID
    source_prompt_column: ClassVar[str | None] = "problem"
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
        from grpokit.tasks.countdown import is_think_answer_format

        return is_think_answer_format(completion)
