"""Built-in rewards. Each returns one float (or None: does not apply) per completion."""

from __future__ import annotations

import math

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import (
    after_last_open_tag,
    completion_text,
    last_number,
    last_tag_content,
    parse_number,
    single_number,
)


@register_reward("correctness")
def correctness(prompts, completions, answer, **kwargs) -> list[float]:
    """GRPO-from-scratch tutorial: 2.0 when the answer (after the last ``<answer>``, up to its
    ``</answer>``, stripped) equals the gold ``answer`` exactly; 1.5 when each holds exactly one
    number and the two are equal (72.0 = 72, 1,000 = 1000); else 0.0."""
    out = []
    for c, gold in zip(completions, answer):
        got = after_last_open_tag(completion_text(c), "answer")
        gold = "" if gold is None else str(gold).strip()
        if got is None:
            out.append(0.0)
        elif got == gold:
            out.append(2.0)
        else:
            a, b = single_number(got), single_number(gold)
            out.append(1.5 if a is not None and a == b else 0.0)
    return out


_XML_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
_XML_SCORES = (0.0, 0.2, 0.4, 0.6, 0.8)  # exact decimals, not sums of 0.2


@register_reward("xml_format")
def xml_format(prompts, completions, **kwargs) -> list[float]:
    """0.2 for each of <reasoning>, </reasoning>, <answer>, </answer> present (any order)."""
    out = []
    for c in completions:
        text = completion_text(c)
        out.append(_XML_SCORES[sum(tag in text for tag in _XML_TAGS)])
    return out


def final_answer(text: str) -> float | None:
    """The last <answer> content as a number if there is an answer tag, else the last number."""
    tagged = last_tag_content(text, "answer")
    if tagged is not None:
        return parse_number(tagged)
    return last_number(text)


def _gold_number(gold) -> float | None:
    g = parse_number(None if gold is None else str(gold))
    return g if g is not None and math.isfinite(g) else None


@register_reward("arithmetic_correct")
def arithmetic_correct(prompts, completions, answer, **kwargs) -> list[float | None]:
    """1.0 when the final answer (last <answer>, else the last number) equals the gold;
    None when the gold is not a finite number."""
    out = []
    for c, gold in zip(completions, answer):
        got, g = final_answer(completion_text(c)), _gold_number(gold)
        if g is None:
            out.append(None)
        else:
            out.append(1.0 if got is not None and math.isclose(got, g) else 0.0)
    return out


@register_reward("arithmetic_closeness")
def arithmetic_closeness(prompts, completions, answer, **kwargs) -> list[float | None]:
    """Partial credit 1 / (1 + |pred - gold| / max(1, |gold|) * 10); 0 when there is no number;
    None when the gold is not a finite number."""
    out = []
    for c, gold in zip(completions, answer):
        got, g = final_answer(completion_text(c)), _gold_number(gold)
        if g is None:
            out.append(None)
        elif got is None or not math.isfinite(got):
            out.append(0.0)
        else:
            rel = min(abs(got - g) / max(1.0, abs(g)), 1e6)
            out.append(1.0 / (1.0 + 10.0 * rel))
    return out


@register_reward("arithmetic_format")
def arithmetic_format(prompts, completions, **kwargs) -> list[float]:
    """1.0 for exactly one <answer>N</answer> holding only a number and nothing after it;
    0.5 for an answer tag holding a number elsewhere; 0.0 otherwise."""
    out = []
    for c in completions:
        t = completion_text(c)
        got = last_tag_content(t, "answer")
        if got is None or parse_number(got) is None:
            out.append(0.0)
        elif t.count("<answer>") == 1 and t.rstrip().endswith("</answer>"):
            out.append(1.0)
        else:
            out.append(0.5)
    return out


@register_reward("length_target", factory=True)
def length_target(target_length: int = 50):
    """The smoltldr demo's -|target - len(completion)|, in characters. A row's own
    ``target_length`` dataset column, when present and not None, overrides the parameter."""
    if isinstance(target_length, bool) or not isinstance(target_length, int) or target_length < 0:
        raise ValueError(f"length_target: target_length={target_length!r} must be an int >= 0")
    default = target_length

    def length_target(prompts, completions, target_length=None, **kwargs) -> list[float]:
        rows = target_length if target_length is not None else [None] * len(completions)
        out = []
        for c, t in zip(completions, rows):
            goal = default if t is None else int(t)
            out.append(-float(abs(goal - len(completion_text(c)))))
        return out

    return length_target
