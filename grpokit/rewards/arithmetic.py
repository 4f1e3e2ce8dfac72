"""The arithmetic task's grader and its three rewards, written once.

``ArithmeticTask.is_correct`` is ``correct_score(...) == 1.0`` and ``is_formatted`` is
``format_score(...) > 0``: the reward that trains and the accuracy that is logged read a
completion through the same functions (numbers as in ``grpokit.rewards.text``).

The *final answer* of a completion is the content of its last ``<answer>...</answer>`` read
as one number if the text has an answer tag ("1,234", "$5", ".5" and "7." are numbers;
"x = 5" and "inf" are not, and then there is no final answer), else the last number
anywhere in the text.

- ``arithmetic_correct``: 1.0 when the final answer equals the gold, else 0.0;
- ``arithmetic_closeness``: ``1 / (1 + 10 * |pred - gold| / max(1, |gold|))``, 0.0 with no
  final answer (1.0 when exact, 0.5 when off by a tenth of the gold);
- ``arithmetic_format``: 1.0 for exactly one ``<answer>N</answer>`` holding only a number
  and ending the completion (trailing whitespace allowed); 0.5 for an answer tag holding a
  number otherwise (text after it, several tags); 0.0 otherwise.
- ``arithmetic_tagged_closeness``: ``arithmetic_format * arithmetic_closeness``: the format
  credit scaled by how close the tagged answer is, so a tag is worth nothing unless it holds
  the model's own (near-)answer. SmolLM2-135M copies a prompt's example tag
  ("<answer>7</answer>") far more often than it tags its own result; plain
  ``arithmetic_format`` rewards the copy. It is positive exactly when ``arithmetic_format``
  is, so the held-out format rate (``is_formatted``) counts what it rewards.

The two gold-based rewards give None (does not apply) when the gold is not a number.
"""

from __future__ import annotations

import math

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text, last_number, last_tag_content, parse_number

_MAX_RELATIVE_ERROR = 1e6  # closeness of a wildly wrong answer: 1 / (1 + 1e7), not 0


def final_answer(text: str) -> float | None:
    """The last ``<answer>`` content as one number if there is an answer tag, else the last
    number in the text; None when there is no such number."""
    tagged = last_tag_content(text, "answer")
    return parse_number(tagged) if tagged is not None else last_number(text)


def gold_number(gold) -> float | None:
    """A gold column value as a number (``"68"``, ``68``, ``"1,000"``), else None."""
    return parse_number(None if gold is None else str(gold))


def correct_score(text: str, gold) -> float | None:
    """1.0 when the final answer equals the gold, 0.0 when not, None when the gold is not a
    number."""
    g = gold_number(gold)
    if g is None:
        return None
    got = final_answer(text)
    return 1.0 if got is not None and math.isclose(got, g) else 0.0


def closeness_score(text: str, gold) -> float | None:
    """``1 / (1 + 10 * |pred - gold| / max(1, |gold|))``; 0.0 with no final answer; None when
    the gold is not a number."""
    g = gold_number(gold)
    if g is None:
        return None
    got = final_answer(text)
    if got is None:
        return 0.0
    rel = min(abs(got - g) / max(1.0, abs(g)), _MAX_RELATIVE_ERROR)
    return 1.0 / (1.0 + 10.0 * rel)


def format_score(text: str) -> float:
    """1.0 one final ``<answer>N</answer>``; 0.5 another numeric answer tag; else 0.0."""
    if parse_number(last_tag_content(text, "answer")) is None:
        return 0.0
    if text.count("<answer>") == 1 and text.rstrip().endswith("</answer>"):
        return 1.0
    return 0.5


@register_reward("arithmetic_correct")
def arithmetic_correct(prompts, completions, answer, **kwargs) -> list[float | None]:
    """1.0 when the final answer (last <answer>, else the last number) equals the gold;
    None when the gold is not a number."""
    return [correct_score(completion_text(c), g) for c, g in zip(completions, answer)]


@register_reward("arithmetic_closeness")
def arithmetic_closeness(prompts, completions, answer, **kwargs) -> list[float | None]:
    """Partial credit 1 / (1 + 10 |pred - gold| / max(1, |gold|)); 0 when there is no final
    answer; None when the gold is not a number."""
    return [closeness_score(completion_text(c), g) for c, g in zip(completions, answer)]


@register_reward("arithmetic_format")
def arithmetic_format(prompts, completions, **kwargs) -> list[float]:
    """1.0 for exactly one <answer>N</answer> holding only a number and nothing after it;
    0.5 for an answer tag holding a number elsewhere; 0.0 otherwise."""
    return [format_score(completion_text(c)) for c in completions]


def tagged_closeness_score(text: str, gold) -> float | None:
    """``format_score * closeness_score``; None when the gold is not a number."""
    close = closeness_score(text, gold)
    return None if close is None else format_score(text) * close


@register_reward("arithmetic_tagged_closeness")
def arithmetic_tagged_closeness(prompts, completions, answer, **kwargs) -> list[float | None]:
    """arithmetic_format times arithmetic_closeness: format credit only for a tag holding a
    number near the gold (a copied example earns ~0); None when the gold is not a number."""
    return [tagged_closeness_score(completion_text(c), g) for c, g in zip(completions, answer)]
