"""Reward functions the health tests train with (named as ``_rewards.py:func`` in reward_funcs)."""

CALLS = [0]


def _text(c):
    from grpokit.rewards.text import completion_text

    return completion_text(c)


def zero(prompts, completions, **kw):
    """Never fires."""
    return [0.0 for _ in completions]


def short(prompts, completions, **kw):
    """Prefers completions of about 15 characters."""
    return [-abs(len(_text(c)) - 15) / 15 for c in completions]


def sevens(prompts, completions, **kw):
    """The fraction of characters that are '7': easy to learn, and it makes greedy output
    collapse onto one token."""
    return [_text(c).count("7") / max(len(_text(c)), 1) for c in completions]


def switch(prompts, completions, **kw):
    """Length in characters, scaled by 1e-3 for the first 6 calls and by 10 after: with
    scale_rewards none the advantages, and so the gradient, grow 10^4 times at step 7."""
    CALLS[0] += 1
    scale = 1e-3 if CALLS[0] <= 6 else 10.0
    return [scale * len(_text(c)) for c in completions]
