"""The Countdown grader (ms-swift's ``CountdownORM`` rule, bounded), written once.

``CountdownTask.is_correct`` is ``countdown_score(...) == 1.0`` and its ``is_formatted`` is
``is_think_answer_format``; the rewards ``countdown`` (and its alias ``countdown_correct``)
and ``swift_format`` (ms-swift's ``format``; alias ``countdown_format``) call the same
functions.

Rule: take the FIRST ``<answer>...</answer>`` on one line; drop everything from the first
``=``; the integers written (``\\d+`` runs) must equal the ``nums`` column as a multiset; only
digits, ``+ - * / ( ) .`` and whitespace may appear; 1.0 when the value is within 1e-5 of the
``target`` column, else 0.0.

The game allows + - * / only, so the expression is evaluated by walking its ``ast`` -- never
``eval`` -- allowing only numeric constants, binary ``+ - * /`` and unary ``-`` / ``+`` (as
Python's ``eval`` does). ``**`` and ``//`` are refused before anything is computed
(ms-swift's ``eval`` accepts them, and ``9**9**9`` would hang it). Equations longer than
``MAX_EQUATION_CHARS`` score 0.0, which bounds the work: with only + - * /, the size of
every intermediate integer grows at most with the length of the text.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections import Counter

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text

MAX_EQUATION_CHARS = 512

_ANSWER = re.compile(r"<answer>(.*?)</answer>")  # no DOTALL, as in ms-swift
_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")
# ms-swift's Format reward: <think>...</think> then <answer>...</answer> and nothing after
_FORMAT = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>(?![\s\S])", re.DOTALL)
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def arith_eval(expr: str) -> float | int:
    """Value of ``expr`` built from numbers, ``+ - * /``, unary ``- +`` and parentheses.

    Raises ValueError for anything else (names, calls, ``**``, ``//``, ``%``, too long),
    ZeroDivisionError, OverflowError or SyntaxError as the arithmetic or the text demands.
    """
    if len(expr) > MAX_EQUATION_CHARS:
        raise ValueError(f"expression longer than {MAX_EQUATION_CHARS} characters")
    return _walk(ast.parse(expr.strip(), mode="eval").body)


def _walk(node: ast.AST) -> float | int:
    # Each node's kind is checked before its children are computed, so "9**9**9" is
    # refused at the top without evaluating anything.
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _walk(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_walk(node.left), _walk(node.right))
    raise ValueError(f"not allowed in an equation: {type(node).__name__}")


def first_answer(text: str) -> str | None:
    """Content of the first one-line ``<answer>...</answer>``, stripped, else None."""
    m = _ANSWER.search(text)
    return m.group(1).strip() if m else None


def equation_value(equation: str, nums) -> float | None:
    """The value of ``equation`` (text from the first '=' dropped) when it is an expression
    of + - * / and parentheses that uses exactly ``nums`` (each once) and has a finite value;
    else None. Never raises."""
    equation = equation.split("=", 1)[0]
    try:
        if len(equation) > MAX_EQUATION_CHARS:
            return None
        used = sorted(int(n) for n in re.findall(r"\d+", equation))
        if used != sorted(int(n) for n in nums):
            return None
        if not _ALLOWED.match(equation):
            return None
        value = float(arith_eval(equation))
        return value if math.isfinite(value) else None
    except (ValueError, TypeError, ArithmeticError, SyntaxError, RecursionError, MemoryError):
        return None


def equation_score(equation: str, nums, target) -> float:
    """1.0 when ``equation`` (text from the first '=' dropped) uses exactly ``nums`` and
    evaluates within 1e-5 of ``target``; else 0.0. Never raises."""
    value = equation_value(equation, nums)
    try:
        return 1.0 if value is not None and abs(value - float(target)) < 1e-5 else 0.0
    except (ValueError, TypeError):
        return 0.0


def equation_closeness(equation: str, nums, target) -> float:
    """Partial credit for the value: ``1 / (1 + 10 |value - target| / max(1, |target|))``
    (as ``arithmetic_closeness``) when ``equation`` uses exactly ``nums``, else 0.0; 1.0
    exactly when ``equation_score`` is 1.0 (up to its 1e-5). Never raises."""
    value = equation_value(equation, nums)
    try:
        t = float(target)
    except (ValueError, TypeError):
        return 0.0
    if value is None or not math.isfinite(t):
        return 0.0
    if abs(value - t) < 1e-5:
        return 1.0
    return 1.0 / (1.0 + 10.0 * abs(value - t) / max(1.0, abs(t)))


def numbers_overlap(equation: str, nums) -> float:
    """How well ``equation`` (text from the first '=' dropped) keeps to the given numbers:
    the size of the multiset intersection of the integers it writes and ``nums``, over the
    larger of the two counts (1.0: exactly ``nums``, each once). 0.0 unless it is an
    expression of + - * / and parentheses with a finite value. Never raises."""
    equation = equation.split("=", 1)[0]
    try:
        if len(equation) > MAX_EQUATION_CHARS or not _ALLOWED.match(equation):
            return 0.0
        used = Counter(int(n) for n in re.findall(r"\d+", equation))
        given = Counter(int(n) for n in nums)
        if not used or not math.isfinite(float(arith_eval(equation))):
            return 0.0
        return sum((used & given).values()) / max(used.total(), given.total())
    except (ValueError, TypeError, ArithmeticError, SyntaxError, RecursionError, MemoryError):
        return 0.0


def countdown_score(text: str, nums, target) -> float:
    """The grader for one completion's text: 1.0 or 0.0 (module rule)."""
    equation = first_answer(text)
    return 0.0 if equation is None else equation_score(equation, nums, target)


def is_think_answer_format(text: str) -> bool:
    """``<think>...</think>`` then ``<answer>...</answer>`` and nothing after (ms-swift's
    format reward; the countdown task's ``is_formatted``)."""
    return _FORMAT.match(text) is not None


def _scores(completions, nums, target) -> list[float]:
    return [countdown_score(completion_text(c), n, t) for c, n, t in zip(completions, nums, target)]


@register_reward("countdown")
def countdown(prompts, completions, nums, target, **kwargs) -> list[float]:
    """1.0 for a correct Countdown equation in the first ``<answer>`` (see module doc)."""
    return _scores(completions, nums, target)


@register_reward("countdown_correct")
def countdown_correct(prompts, completions, nums, target, **kwargs) -> list[float]:
    """The same reward as ``countdown``, under the name the countdown task gave it."""
    return _scores(completions, nums, target)


@register_reward("countdown_numbers")
def countdown_numbers(prompts, completions, nums, **kwargs) -> list[float]:
    """Partial credit (grpokit's, not ms-swift's): how well the first ``<answer>`` keeps to
    the given numbers, whatever its value (``numbers_overlap``: 1.0 for an equation of
    + - * / that uses exactly them). For models too small to ever hit the target at first
    (``countdown`` then never fires), so that GRPO has a signal that leads towards it;
    weight it below ``countdown``."""
    texts = (first_answer(completion_text(c)) for c in completions)
    return [0.0 if e is None else numbers_overlap(e, n) for e, n in zip(texts, nums)]


@register_reward("countdown_closeness")
def countdown_closeness(prompts, completions, nums, target, **kwargs) -> list[float]:
    """Partial credit (grpokit's, not ms-swift's) for how near the first ``<answer>``'s
    value comes to the target, given that it uses exactly the given numbers
    (``equation_closeness``): so that choosing the operators pays before the target is hit,
    where ``countdown_numbers`` rewards only keeping to the numbers. 1.0 when ``countdown``
    is 1.0; weight it below ``countdown``."""
    texts = (first_answer(completion_text(c)) for c in completions)
    return [
        0.0 if e is None else equation_closeness(e, n, t) for e, n, t in zip(texts, nums, target)
    ]


_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_STEP = re.compile(r"(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)")
_STEP_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def steps_score(text: str, nums) -> float:
    """The share of the ``<think>`` block's ``x op y = z`` steps (integers, one of
    ``+ - * /``) that are true and whose operands ``x`` and ``y`` are given numbers or results
    of earlier true steps; 0.0 when the block is missing or has no step. Never raises."""
    m = _THINK.search(text)
    steps = _STEP.findall(m.group(1)) if m else []
    if not steps:
        return 0.0
    known, good = {int(n) for n in nums}, 0
    for x, op, y, z in steps:
        a, b, c = int(x), int(y), int(z)
        value = _STEP_OPS[op](a, b) if op != "/" or b else None
        if value is not None and value == c and a in known and b in known:
            good += 1
            known.add(c)
    return good / len(steps)


@register_reward("countdown_steps")
def countdown_steps(prompts, completions, nums, **kwargs) -> list[float]:
    """Partial credit (grpokit's, not ms-swift's) for the arithmetic in ``<think>``: the share
    of its ``x op y = z`` steps that are true and start from the given numbers (or earlier
    true steps' results), ``steps_score``. For a model whose worked steps are wrong ("7 + 3 =
    12") the choice of operators it makes from them cannot be right; weight it below
    ``countdown``."""
    return [steps_score(completion_text(c), n) for c, n in zip(completions, nums)]


@register_reward("swift_format")
def swift_format(prompts, completions, **kwargs) -> list[float]:
    """ms-swift's ``format`` reward: 1.0 for ``<think>...</think>``, optional whitespace,
    then ``<answer>...</answer>`` and nothing after (any text inside the tags, newlines or
    not), else 0.0. open-r1's ``format`` also demands newlines around every tag."""
    return [float(is_think_answer_format(completion_text(c))) for c in completions]


@register_reward("countdown_format")
def countdown_format(prompts, completions, **kwargs) -> list[float]:
    """The same reward as ``swift_format``, under the name the countdown task gave it."""
    return swift_format(prompts, completions)
