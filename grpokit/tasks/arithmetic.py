"""``arithmetic``: a seeded generator of small arithmetic problems, for fast CPU runs.

Parameters (``task_params``): ``ops`` (list from "+", "-", "*"; default ["+"]), ``digits``
(an int, or [min, max] digits per operand; default 1), ``num_operands`` (default 2),
``train_size`` (default 5000), ``test_size`` (default 500). The test problems are a
separate seeded draw, and any test problem that also occurs in train is dropped from train,
so the held-out set is never trained on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from grpokit.rewards.builtin import final_answer
from grpokit.rewards.text import last_tag_content, parse_number
from grpokit.tasks.base import Task, TaskDataError

SYSTEM_PROMPT = (
    "You are a careful calculator. Work out the answer briefly, then give the final number "
    "inside <answer></answer> tags, for example <answer>42</answer>."
)
_PARAMS = {"ops", "digits", "num_operands", "train_size", "test_size"}


@dataclass
class ArithmeticTask(Task):
    default_reward_funcs: tuple = (
        "arithmetic_correct",
        "arithmetic_closeness",
        "arithmetic_format",
    )
    default_reward_weights: tuple = (1.0, 0.5, 0.25)
    default_system_prompt: str | None = SYSTEM_PROMPT
    required_columns: tuple = ("question", "answer")

    def __post_init__(self) -> None:
        bad = set(self.params) - _PARAMS
        if bad:
            raise TaskDataError(
                f"task arithmetic: unknown task_params {sorted(bad)}; it takes {sorted(_PARAMS)}"
            )
        ops = self.params.get("ops", ["+"])
        if isinstance(ops, str):
            ops = [ops]
        if not ops or any(o not in ("+", "-", "*") for o in ops):
            raise TaskDataError(
                f"task arithmetic: ops={ops!r}; use a list drawn from '+', '-', '*'"
            )
        d = self.params.get("digits", 1)
        lo, hi = (d, d) if isinstance(d, int) else (int(d[0]), int(d[1]))
        if not 1 <= lo <= hi <= 12:
            raise TaskDataError(
                f"task arithmetic: digits={d!r}; use an int or [min, max] within 1..12"
            )
        self.ops, self.digits = list(ops), (lo, hi)
        self.num_operands = int(self.params.get("num_operands", 2))
        self.sizes = {
            "train": int(self.params.get("train_size", 5000)),
            "test": int(self.params.get("test_size", 500)),
        }

    def _draw(self, rng: random.Random) -> dict[str, Any]:
        nums = []
        for _ in range(self.num_operands):
            k = rng.randint(*self.digits)
            nums.append(rng.randint(0 if k == 1 else 10 ** (k - 1), 10**k - 1))
        ops = [rng.choice(self.ops) for _ in range(self.num_operands - 1)]
        expr = str(nums[0]) + "".join(f" {o} {n}" for o, n in zip(ops, nums[1:]))
        value = nums[0]
        # left to right with * binding tighter, as Python does
        value = _evaluate(nums, ops)
        return {"question": f"What is {expr}?", "expression": expr, "answer": str(value)}

    def load_rows(self, split: str) -> list[dict[str, Any]]:
        if split not in self.sizes:
            raise TaskDataError(f"task arithmetic has splits 'train' and 'test', not {split!r}")
        test_rng = random.Random(self.seed * 7919 + 1)
        test = [self._draw(test_rng) for _ in range(self.sizes["test"])]
        if split == "test":
            return test
        held = {r["expression"] for r in test}
        rng = random.Random(self.seed * 7919 + 2)
        rows: list[dict[str, Any]] = []
        tries = 0
        while len(rows) < self.sizes["train"] and tries < 50 * self.sizes["train"]:
            r = self._draw(rng)
            tries += 1
            if r["expression"] not in held:
                rows.append(r)
        return rows

    def make_user_message(self, row: dict[str, Any]) -> str:
        return row["question"]

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        got = final_answer(completion)
        return got is not None and abs(got - float(row["answer"])) < 1e-9

    def is_formatted(self, completion: str) -> bool:
        return parse_number(last_tag_content(completion, "answer")) is not None


def _evaluate(nums: list[int], ops: list[str]) -> int:
    terms, cur = [], nums[0]
    signs = []
    for o, n in zip(ops, nums[1:]):
        if o == "*":
            cur *= n
        else:
            terms.append(cur)
            signs.append(o)
            cur = n
    terms.append(cur)
    total = terms[0]
    for s, t in zip(signs, terms[1:]):
        total = total + t if s == "+" else total - t
    return total
