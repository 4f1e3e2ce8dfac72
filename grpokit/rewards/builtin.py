"""Built-in rewards. Each returns one float (or None: does not apply) per completion."""

from __future__ import annotations

import math

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text, last_number, last_tag_content, parse_number


@register_reward("correctness")
def correctness(prompts, completions, answer, **kwargs) -> list[float]:
    """GRPO-from-scratch tutorial: 2.0 when the last <answer> equals the gold answer exactly,
    1.5 when both are the same single number, else 0.0."""
    out = []
    for c, gold in zip(completions, answer):
        got = last_tag_content(completion_text(c), "answer")
        gold = str(gold).strip()
        if got is None:
            out.append(0.0)
        elif got == gold:
            out.append(2.0)
        else:
            a, b = parse_number(got), parse_number(gold)
            out.append(1.5 if a is not None and b is not None and math.isclose(a, b) else 0.0)
    return out


@register_reward("xml_format")
def xml_format(prompts, completions, **kwargs) -> list[float]:
    """0.2 for each of <reasoning>, </reasoning>, <answer>, </answer> present."""
    tags = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
    return [round(0.2 * sum(t in completion_text(c) for t in tags), 10) for c in completions]


def final_answer(text: str) -> float | None:
    """The last <answer> content as a number if there is an answer tag, else the last number."""
    tagged = last_tag_content(text, "answer")
    if tagged is not None:
        return parse_number(tagged)
    return last_number(text)


@register_reward("arithmetic_correct")
def arithmetic_correct(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the final answer (last <answer>, else the last number) equals the gold."""
    out = []
    for c, gold in zip(completions, answer):
        got = final_answer(completion_text(c))
        out.append(1.0 if got is not None and math.isclose(got, float(gold)) else 0.0)
    return out


@register_reward("arithmetic_closeness")
def arithmetic_closeness(prompts, completions, answer, **kwargs) -> list[float]:
    """Partial credit 1 / (1 + |pred - gold| / max(1, |gold|) * 10); 0 when there is no number."""
    out = []
    for c, gold in zip(completions, answer):
        got = final_answer(completion_text(c))
        g = float(gold)
        if got is None or not math.isfinite(got):
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


@register_reward("countdown")
def countdown(prompts, completions, nums, target, **kwargs) -> list[float]:
    """ms-swift's Countdown reward: the first <answer> content, text after '=' ignored, numbers
    used = the given numbers as a multiset, only digits, + - * / ( ) . and spaces, 1.0 when it
    evaluates within 1e-5 of the target (our own ast evaluator, never eval)."""
    from grpokit.tasks.countdown import countdown_score

    return [countdown_score(completion_text(c), n, t) for c, n, t in zip(completions, nums, target)]


@register_reward("length_target", factory=True)
def length_target(target_length: int = 50):
    """The smoltldr demo's -|target - len(completion)|, in characters. The target is the
    ``target_length`` dataset column when rows carry one (the tldr task does), else the
    factory parameter."""

    def length_target(prompts, completions, target_length=None, **kwargs) -> list[float]:
        targets = target_length if target_length is not None else [default] * len(completions)
        return [-float(abs(int(t) - len(completion_text(c)))) for c, t in zip(completions, targets)]

    default = target_length

    return length_target
