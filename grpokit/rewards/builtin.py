"""Built-in rewards. Each returns one float (or None: does not apply) per completion.

The per-completion scores below are also the graders of the tasks that use them:
``correctness_score`` for gsm8k and custom (``is_correct``), ``xml_tag_count`` for their
``is_formatted``, ``length_gap`` for tldr. Tasks import them; nothing here imports a task.
"""

from __future__ import annotations

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import after_last_open_tag, completion_text, single_number

XML_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
_XML_SCORES = (0.0, 0.2, 0.4, 0.6, 0.8)  # exact decimals, not sums of 0.2


def correctness_score(text: str, gold) -> float:
    """2.0 when the answer (after the last ``<answer>``, up to its ``</answer>``, stripped)
    equals ``gold`` exactly; 1.5 when each holds exactly one number and the two are equal;
    else 0.0 (no answer tag, or never closed, is 0.0)."""
    got = after_last_open_tag(text, "answer")
    gold = "" if gold is None else str(gold).strip()
    if got is None:
        return 0.0
    if got == gold:
        return 2.0
    a, b = single_number(got), single_number(gold)
    return 1.5 if a is not None and a == b else 0.0


@register_reward("correctness")
def correctness(prompts, completions, answer, **kwargs) -> list[float]:
    """GRPO-from-scratch tutorial: 2.0 when the answer (after the last ``<answer>``, up to its
    ``</answer>``, stripped) equals the gold ``answer`` exactly; 1.5 when each holds exactly one
    number and the two are equal (72.0 = 72, 1,000 = 1000); else 0.0."""
    return [correctness_score(completion_text(c), gold) for c, gold in zip(completions, answer)]


def xml_tag_count(text: str) -> int:
    """How many of <reasoning>, </reasoning>, <answer>, </answer> occur in ``text`` (0-4)."""
    return sum(tag in text for tag in XML_TAGS)


@register_reward("xml_format")
def xml_format(prompts, completions, **kwargs) -> list[float]:
    """0.2 for each of <reasoning>, </reasoning>, <answer>, </answer> present (any order)."""
    return [_XML_SCORES[xml_tag_count(completion_text(c))] for c in completions]


def length_gap(text: str, target_length: int) -> int:
    """|target_length - len(text)|, in characters (nothing stripped)."""
    return abs(target_length - len(text))


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
            out.append(-float(length_gap(completion_text(c), goal)))
        return out

    return length_target
