"""``countdown``: reach a target with + - * / using each given number exactly once.

Sources (``dataset_name``):

- None or ``"generate"``: our seeded generator. Each problem has 3 or 4 numbers (equally
  likely), each 1-99 (repeats allowed), and a target 10-100 that is reachable using every
  number exactly once with +, -, *, exact / and every intermediate value a non-negative
  integer (checked by exhaustive search; the ``solution`` column holds one such equation).
  Parameters: ``train_size`` (default 5000), ``test_size`` (default 500), and the problem
  shape for smaller models: ``count`` (how many numbers, an int or a list to draw from;
  default [3, 4]), ``max_number`` (default 99), ``target_range`` (default [10, 100]), and
  ``targets`` (``uniform``, the default: any reachable value; ``by_operation``: one of
  ``+ - * /`` drawn equally often, then a target an equation ending in it makes, so that no
  single operation is the answer to most problems), and ``operations`` (with ``by_operation``:
  the operations drawn from, default all four; ``["+", "-"]`` makes half the targets sums and
  half differences, a choice that a target's size against the numbers decides).
- rows with ``nums`` and ``target`` (the Countdown-Tasks-3to4 layout): a local
  json/jsonl/parquet/csv file or directory, or the hub id ``Jiayi-Pan/Countdown-Tasks-3to4``
  (train split only, so set ``test_size`` for a seeded held-out slice).

Grader: ``grpokit.rewards.countdown`` (ms-swift's countdown rule with + - * / only and
a 512-character bound; the rule is stated in docs/rewards.md). ``is_correct`` is its
``countdown_score == 1`` and ``is_formatted`` its ``is_think_answer_format``; the default
rewards ``countdown`` (alias ``countdown_correct``) and ``swift_format`` (ms-swift's
``format``, alias ``countdown_format``) call the same functions, so the format the task trains
on is the format it reports.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from grpokit.rewards.countdown import countdown_score, is_think_answer_format
from grpokit.tasks.base import Task, TaskDataError

SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer."
)
USER_TEMPLATE = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number must be used exactly once. Show your "
    "work in <think> </think> tags. And return the final equation in <answer> </answer> tags, "
    "for example <answer> (1 + 2) / 3 </answer>."
)
HUB_ID = "Jiayi-Pan/Countdown-Tasks-3to4"


# ---------------------------------------------------------------------- generator
def _results(x: int, y: int) -> list[tuple[str, int, bool]]:
    """(operation, value, swapped) for every non-negative integer result of combining x and y;
    ``swapped`` means the equation is ``y op x``. The one place the game's rules live."""
    out = [("+", x + y, False), ("*", x * y, False)]
    out.append(("-", x - y, False) if x >= y else ("-", y - x, True))
    if y and x % y == 0:
        out.append(("/", x // y, False))
    if x and y % x == 0 and x != y:
        out.append(("/", y // x, True))
    return out


def _combine(a: tuple[int, str], b: tuple[int, str]) -> list[tuple[int, str]]:
    """Every value reachable from two (value, expr) pairs with non-negative integer results."""
    (x, ex), (y, ey) = a, b
    return [(v, f"({ey} {op} {ex})" if swapped else f"({ex} {op} {ey})")
            for op, v, swapped in _results(x, y)]  # fmt: skip


@lru_cache(maxsize=1 << 18)
def reachable(values: tuple[int, ...]) -> frozenset[int]:
    """Every value made by using each of ``values`` (sorted) exactly once, all steps in N."""
    if len(values) == 1:
        return frozenset(values)
    out: set[int] = set()
    n = len(values)
    for i in range(n):
        for j in range(i + 1, n):
            rest = values[:i] + values[i + 1 : j] + values[j + 1 :]
            for v, _ in _combine((values[i], ""), (values[j], "")):
                out |= reachable(tuple(sorted(rest + (v,))))
    return frozenset(out)


OPERATIONS = ("+", "-", "*", "/")


def _splits(values: tuple[int, ...]):
    """Every way to split ``values`` into two non-empty parts (each unordered pair once)."""
    n = len(values)
    for mask in range(1, 2 ** (n - 1)):  # the last value always goes right: no mirror twice
        left = tuple(values[i] for i in range(n) if mask >> i & 1)
        right = tuple(values[i] for i in range(n) if not mask >> i & 1)
        yield left, right


@lru_cache(maxsize=1 << 16)
def reachable_by_last_operation(values: tuple[int, ...]) -> dict[str, frozenset[int]]:
    """For each of ``+ - * /``: the values whose equation can END with that operation (its
    outermost one), using each of ``values`` (sorted) exactly once, all steps in N."""
    out: dict[str, set[int]] = {op: set() for op in OPERATIONS}
    for left, right in _splits(values):
        for x in reachable(tuple(sorted(left))):
            for y in reachable(tuple(sorted(right))):
                for op, v, _ in _results(x, y):
                    out[op].add(v)
    return {op: frozenset(v) for op, v in out.items()}


def solve(nums: list[int], target: int) -> str | None:
    """One equation using each of ``nums`` once that makes ``target``, or None."""
    if target not in reachable(tuple(sorted(nums))):
        return None
    return _solve([(x, str(x)) for x in nums], target)[1:-1]  # drop the outermost parentheses


def _solve(items: list[tuple[int, str]], target: int) -> str:
    if len(items) == 1:
        return items[0][1]
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
            for v, e in _combine(items[i], items[j]):
                new = rest + [(v, e)]
                if target in reachable(tuple(sorted(x for x, _ in new))):
                    return _solve(new, target)
    raise AssertionError("unreachable: target was in the reachable set")


def generate_problem(
    rng: random.Random,
    counts: tuple[int, ...] = (3, 4),
    max_number: int = 99,
    target_range: tuple[int, int] = (10, 100),
    targets: str = "uniform",
    operations: tuple[str, ...] = OPERATIONS,
) -> dict[str, Any]:
    """One solvable problem: ``counts`` (one drawn) numbers in 1..``max_number``, a target in
    ``target_range`` (inclusive) reachable from them, and a solution. The defaults are the
    Countdown-Tasks-3to4 shape: 3 or 4 numbers in 1..99, targets 10..100.

    ``targets``: ``"uniform"`` draws the target uniformly from the reachable values in range;
    ``"by_operation"`` first draws one of ``+ - * /`` uniformly, then a target some equation
    ENDING in it makes, so that no one operation answers most problems (uniform targets from
    small numbers are sums about half the time, and a model can learn to always add); it draws
    from ``operations`` only (a target can still be reached by another operation too)."""
    lo, hi = target_range
    # by_operation: the operation is drawn once, before the numbers, so that operations whose
    # values fall in range less often (* with large numbers) are not redrawn away
    last = rng.choice(operations) if targets == "by_operation" else None
    for _ in range(20_000):
        nums = [rng.randint(1, max_number) for _ in range(rng.choice(counts))]
        key = tuple(sorted(nums))
        pool = reachable(key) if last is None else reachable_by_last_operation(key)[last]
        targets_in_range = sorted(t for t in pool if lo <= t <= hi)
        if targets_in_range:
            target = rng.choice(targets_in_range)
            return {"nums": nums, "target": target, "solution": solve(nums, target)}
    raise TaskDataError(
        f"task countdown: no target in [{lo}, {hi}] was reachable from {list(counts)} numbers "
        f"up to {max_number} in 20,000 draws; widen target_range or change max_number"
    )


# ---------------------------------------------------------------------- task
@dataclass
class CountdownTask(Task):
    known_datasets: ClassVar[tuple[str, ...]] = (HUB_ID,)
    default_reward_funcs: tuple = ("countdown", "swift_format")
    default_system_prompt: str | None = SYSTEM_PROMPT
    required_columns: tuple = ("nums", "target")

    param_defaults: ClassVar[dict[str, Any]] = {
        "train_size": 5000,
        "test_size": None,
        "count": [3, 4],
        "max_number": 99,
        "target_range": [10, 100],
        "targets": "uniform",
        "operations": list(OPERATIONS),
    }

    @property
    def generated(self) -> bool:
        return self.dataset_name in (None, "generate")

    def configure(self) -> None:
        self.shape = self._problem_shape()
        if self.generated:
            test = self.p["test_size"]
            self.sizes = {
                "train": int(self.p["train_size"]),
                "test": 500 if test is None else int(test),
            }
        else:
            for k in ("train_size", "count", "max_number", "target_range", "targets", "operations"):
                if self.p[k] != self.param_defaults[k]:
                    raise TaskDataError(
                        f"task countdown: {k} applies to generated problems only; "
                        "use max_train_samples to cap a dataset"
                    )

    def _problem_shape(self) -> dict[str, Any]:
        """The generator's parameters, checked: ``count`` (an int or a list of ints >= 2),
        ``max_number`` >= 1, ``target_range`` [lo, hi] with 0 <= lo <= hi."""
        count, top, rng = self.p["count"], self.p["max_number"], self.p["target_range"]
        counts = tuple(count) if isinstance(count, (list, tuple)) else (count,)
        if not counts or not all(isinstance(c, int) and 2 <= c <= 6 for c in counts):
            raise TaskDataError(f"task countdown: count={count!r}: use 2..6 or a list of them")
        if not isinstance(top, int) or top < 1:
            raise TaskDataError(f"task countdown: max_number={top!r}: use an integer >= 1")
        ok = isinstance(rng, (list, tuple)) and len(rng) == 2
        if not ok or not all(isinstance(v, int) for v in rng) or not 0 <= rng[0] <= rng[1]:
            raise TaskDataError(
                f"task countdown: target_range={rng!r}: use [lo, hi] with 0 <= lo <= hi"
            )
        if self.p["targets"] not in ("uniform", "by_operation"):
            raise TaskDataError(
                f"task countdown: targets={self.p['targets']!r}: use 'uniform' (any reachable "
                "value) or 'by_operation' (one of + - * / drawn first, then a target it makes)"
            )
        ops = self.p["operations"]
        if (
            not isinstance(ops, (list, tuple))
            or not ops
            or not set(ops) <= set(OPERATIONS)
            or len(set(ops)) != len(ops)
        ):
            raise TaskDataError(
                f"task countdown: operations={ops!r}: use a list of distinct operations from "
                '["+", "-", "*", "/"]'
            )
        if set(ops) != set(OPERATIONS) and self.p["targets"] != "by_operation":
            raise TaskDataError(
                "task countdown: operations applies with targets: by_operation (the operation "
                "each target is drawn for); set targets: by_operation or drop operations"
            )
        return {
            "counts": counts,
            "max_number": top,
            "target_range": (rng[0], rng[1]),
            "targets": self.p["targets"],
            "operations": tuple(ops),
        }

    def load_rows(self, split: str) -> list[dict[str, Any]]:
        if not self.generated:
            return super().load_rows(split)
        if split not in self.sizes:
            raise TaskDataError(f"task countdown has splits 'train' and 'test', not {split!r}")
        if split in self._cache:
            return self._cache[split]
        key = lambda r: (tuple(sorted(r["nums"])), r["target"])  # noqa: E731
        shown = self.demonstrated_questions()  # their answers are in the prompt: never drawn
        test_rng, test = random.Random(f"countdown-test-{self.seed}"), []
        while len(test) < self.sizes["test"]:
            r = generate_problem(test_rng, **self.shape)
            if self.make_user_message(r) not in shown:
                test.append(r)
        self._cache["test"] = test
        if split == "test":
            return test
        held = {key(r) for r in test}
        rng, train = random.Random(f"countdown-train-{self.seed}"), []
        while len(train) < self.sizes["train"]:
            r = generate_problem(rng, **self.shape)
            if key(r) not in held and self.make_user_message(r) not in shown:
                train.append(r)
        self._cache["train"] = train
        return train

    def process_row(self, row: dict[str, Any]) -> dict[str, Any]:
        if "nums" not in row or "target" not in row:
            raise TaskDataError(
                f"countdown rows need 'nums' and 'target' columns; got {sorted(row)}"
            )
        nums = row["nums"]
        if isinstance(nums, str):  # csv: "[1, 2, 3]" or "1 2 3"
            nums = re.findall(r"\d+", nums)
        out = {"nums": [int(n) for n in nums], "target": int(row["target"])}
        if row.get("solution") is not None:
            out["solution"] = row["solution"]
        return out

    def make_user_message(self, row: dict[str, Any]) -> str:
        return USER_TEMPLATE.format(nums=row["nums"], target=row["target"])

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        return countdown_score(completion, row["nums"], row["target"]) == 1.0

    def is_formatted(self, completion: str) -> bool:
        return is_think_answer_format(completion)
