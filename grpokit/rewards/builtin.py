"""Built-in rewards. Each returns one float (or None: does not apply) per completion."""

from __future__ import annotations

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import after_last_open_tag, completion_text, single_number


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
