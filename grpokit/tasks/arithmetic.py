"""``arithmetic``: seeded small arithmetic problems, for fast CPU runs where a small model learns.

Parameters (``task_params``):

- ``ops``: list drawn from "+", "-", "*" (default ["+"]); one is drawn per operator slot;
- ``digits``: digits per operand, an int or [min, max] (default 1; 1-digit operands are 0-9);
- ``num_operands``: default 2 (``*`` binds tighter than ``+``/``-``, as in Python);
- ``train_size``: default 5000 (drawn with replacement from the problems not in test);
- ``test_size``: distinct held-out problems (default: 500, or a fifth of all distinct
  problems when there are fewer than 2500, e.g. 20 of the 100 one-digit additions);
- ``question_template``: the user message, with ``{question}`` where the question goes
  (default "{question}"), e.g. "{question} Put the final number in <answer></answer>.":
  SmolLM2-135M follows an instruction in the user message more often than in the system
  prompt (recipes/default.yaml says what was measured).

``demonstrations`` (every task takes it, see ``grpokit.tasks.base``): worked problems as
earlier chat turns, e.g. with ``tools`` a question, an assistant ``tool_calls`` message, the
``tool`` result and the answer (recipes/calculator_tools.yaml: SmolLM2-135M calls the
calculator only when shown such turns).

Rows: ``question`` ("What is 23 + 45?"), ``expression`` ("23 + 45"), ``answer`` ("68").

Grader: ``grpokit.rewards.arithmetic``, which also holds the task's rewards
``arithmetic_correct``, ``arithmetic_closeness`` and ``arithmetic_format`` (partial credit,
because a 135M model on CPU starts at ~54% (1-digit) / ~18% (2-digit) by its last number
and never writes strict tag formats). ``is_correct`` is ``arithmetic_correct == 1`` and
``is_formatted`` is ``arithmetic_format > 0``, by calling the same functions; the rule for
reading numbers is in docs/rewards.md ("Reading numbers").
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from grpokit.rewards.arithmetic import correct_score, format_score
from grpokit.tasks.base import Task, TaskDataError

SYSTEM_PROMPT = (
    "You are a careful calculator. Reason briefly, then give the final number inside "
    "<answer></answer> tags, for example <answer>42</answer>."
)
OPS = ("+", "-", "*")


def evaluate_expression(nums: list[int], ops: list[str]) -> int:
    """Value of ``nums[0] ops[0] nums[1] ...`` with ``*`` before ``+``/``-``."""
    terms, signs, cur = [], [], nums[0]
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


@dataclass
class ArithmeticTask(Task):
    default_reward_funcs: tuple = (
        "arithmetic_correct",
        "arithmetic_closeness",
        "arithmetic_format",
    )
    default_reward_weights: tuple | None = (1.0, 0.5, 0.25)
    default_system_prompt: str | None = SYSTEM_PROMPT
    required_columns: tuple = ("question", "answer")

    param_defaults: ClassVar[dict[str, Any]] = {
        "ops": ["+"],
        "digits": 1,
        "num_operands": 2,
        "train_size": 5000,
        "test_size": None,
        "question_template": "{question}",
    }

    def configure(self) -> None:
        if self.dataset_name not in (None, "generate"):
            raise TaskDataError("task arithmetic generates its problems; leave dataset_name unset")
        ops = self.p["ops"]
        ops = [ops] if isinstance(ops, str) else list(ops)
        if not ops or any(o not in OPS for o in ops):
            raise TaskDataError(f"task arithmetic: ops={ops!r}; use a list drawn from {OPS}")
        d = self.p["digits"]
        lo, hi = (d, d) if isinstance(d, int) else (int(d[0]), int(d[1]))
        if not 1 <= lo <= hi <= 12:
            raise TaskDataError(f"task arithmetic: digits={d!r}; an int or [min, max] in 1..12")
        self.ops, self.digits = sorted(set(ops), key=OPS.index), (lo, hi)
        self.template = str(self.p["question_template"])
        try:
            self.template.format(question="")
        except (KeyError, IndexError, ValueError) as e:
            raise TaskDataError(
                f"task arithmetic: question_template={self.template!r} does not format ({e}); "
                "use {question} where the question goes and double any other braces"
            ) from e
        if "{question}" not in self.template:
            raise TaskDataError(
                f"task arithmetic: question_template={self.template!r} has no {{question}}; "
                "put {question} where the question goes"
            )
        self.num_operands = int(self.p["num_operands"])
        if self.num_operands < 2:
            raise TaskDataError("task arithmetic: num_operands must be >= 2")
        space = self.num_problems()
        test = self.p["test_size"]
        test = min(500, space // 5) if test is None else int(test)
        if not 1 <= test <= space // 2:
            raise TaskDataError(
                f"task arithmetic: test_size={test} but these settings have only {space} "
                f"distinct problems; use 1..{space // 2} (or more digits/operands)"
            )
        self.sizes = {"train": int(self.p["train_size"]), "test": test}

    def num_problems(self) -> int:
        """How many distinct expressions these settings can produce."""
        lo, hi = self.digits
        values = (10**hi) - (10 ** (lo - 1) if lo > 1 else 0)
        return values**self.num_operands * len(self.ops) ** (self.num_operands - 1)

    def _draw(self, rng: random.Random) -> dict[str, Any]:
        nums = []
        for _ in range(self.num_operands):
            k = rng.randint(*self.digits)
            nums.append(rng.randint(0 if k == 1 else 10 ** (k - 1), 10**k - 1))
        ops = [rng.choice(self.ops) for _ in range(self.num_operands - 1)]
        expr = str(nums[0]) + "".join(f" {o} {n}" for o, n in zip(ops, nums[1:]))
        value = evaluate_expression(nums, ops)
        return {"question": f"What is {expr}?", "expression": expr, "answer": str(value)}

    def load_rows(self, split: str) -> list[dict[str, Any]]:
        if split not in self.sizes:
            raise TaskDataError(f"task arithmetic has splits 'train' and 'test', not {split!r}")
        if split in self._cache:
            return self._cache[split]
        # Test: distinct problems from their own seeded stream; train: never one of them.
        # A problem asked in the demonstrations is in neither split: its answer is in the prompt.
        shown = self.demonstrated_questions()
        test_rng, test, held = random.Random(f"arith-test-{self.seed}"), [], set()
        while len(test) < self.sizes["test"]:
            r = self._draw(test_rng)
            if r["expression"] not in held and self.make_user_message(r) not in shown:
                held.add(r["expression"])
                test.append(r)
        rng, train = random.Random(f"arith-train-{self.seed}"), []
        while len(train) < self.sizes["train"]:
            r = self._draw(rng)
            if r["expression"] not in held and self.make_user_message(r) not in shown:
                train.append(r)
        self._cache.update(train=train, test=test)
        return self._cache[split]

    def make_user_message(self, row: dict[str, Any]) -> str:
        return self.template.format(question=row["question"])

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        return correct_score(completion, row["answer"]) == 1.0

    def is_formatted(self, completion: str) -> bool:
        return format_score(completion) > 0
