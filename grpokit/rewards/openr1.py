"""open-r1's reward functions, under the same names and with the same numbers.

Reference: huggingface/open-r1, ``src/open_r1/rewards.py`` (read for behaviour; this is our
own code). Factory defaults are open-r1's ``GRPOScriptArguments`` defaults, i.e. what an
open-r1 recipe that lists the reward without setting its options gets. Deliberate
divergences are listed in docs/rewards.md; in short: a completion may be a string or a message
list; math-verify runs in a worker process, time-bounded from any thread (``mathgrade``).
"""

from __future__ import annotations

import math
import re
from numbers import Real

from grpokit.rewards.mathgrade import GRADER
from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text


def _gold_column(name: str, kwargs: dict, n: int) -> list[str]:
    sol = kwargs.get("solution")
    if sol is None:
        sol = kwargs.get("answer")
    if sol is None:
        raise KeyError(
            f"{name} needs a 'solution' (or 'answer') dataset column with the gold answer"
        )
    if len(sol) != n:
        raise ValueError(f"{name}: {len(sol)} gold answers for {n} completions")
    return ["" if s is None else str(s) for s in sol]


def _graded(name: str, mode: str, completions, kwargs) -> tuple[list[str], list[float | None]]:
    texts = [completion_text(c) for c in completions]
    golds = _gold_column(name, kwargs, len(texts))
    return texts, GRADER.grade([(mode, t, g) for t, g in zip(texts, golds)])


def _check_number(reward: str, **params) -> None:
    for k, v in params.items():
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v):
            raise ValueError(f"{reward}: {k}={v!r} must be a finite number")


# ---------------------------------------------------------------------- accuracy family
@register_reward("accuracy")
def accuracy(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when math-verify finds the completion's answer equal to the gold ``solution`` (or
    ``answer``) column, else 0.0; None (skipped) when the gold cannot be parsed."""
    return _graded("accuracy", "accuracy", completions, kwargs)[1]


@register_reward("length")
def length(prompts, completions, **kwargs) -> list[float]:
    """Kimi 1.5 length reward (arXiv:2501.12599) over the batch, lengths in characters:
    lam = 0.5 - (len - min_len) / (max_len - min_len); correct -> lam, wrong -> min(0, lam);
    all lengths equal -> 0.0. A gold that cannot be parsed counts as correct."""
    texts, graded = _graded("length", "length", completions, kwargs)
    if not texts:
        return []
    lens = [len(t) for t in texts]
    lo, hi = min(lens), max(lens)
    if hi == lo:
        return [0.0] * len(texts)
    out = []
    for n, g in zip(lens, graded):
        lam = 0.5 - (n - lo) / (hi - lo)
        out.append(float(lam if (g is None or g) else min(0.0, lam)))
    return out


@register_reward("cosine", factory=True)
def cosine(
    min_value_wrong: float = 0.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    max_len: int = 1000,
):
    """Cosine-scaled by length in characters (Yeo et al. 2025, arXiv:2502.03373):
    r = lo + (hi - lo) * (1 + cos(pi * len / max_len)) / 2 with (lo, hi) =
    (min_value_correct, max_value_correct) if correct else (max_value_wrong, min_value_wrong).
    A gold that cannot be parsed -> 1.0."""
    _check_number(
        "cosine",
        min_value_wrong=min_value_wrong,
        max_value_wrong=max_value_wrong,
        min_value_correct=min_value_correct,
        max_value_correct=max_value_correct,
        max_len=max_len,
    )
    if max_len <= 0:
        raise ValueError(f"cosine: max_len={max_len} must be > 0")

    def cosine(prompts, completions, **kwargs) -> list[float]:
        texts, graded = _graded("cosine", "length", completions, kwargs)
        out = []
        for t, g in zip(texts, graded):
            if g is None:
                out.append(1.0)
                continue
            if g:
                lo, hi = min_value_correct, max_value_correct
            else:  # swapped: a longer wrong answer is punished less
                lo, hi = max_value_wrong, min_value_wrong
            out.append(float(lo + 0.5 * (hi - lo) * (1.0 + math.cos(len(t) / max_len * math.pi))))
        return out

    return cosine


# ---------------------------------------------------------------------- format family
_FORMAT = re.compile(
    r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE
)


@register_reward("format")
def format_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the text matches ``^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$``
    (DOTALL | MULTILINE, with ``re.match``, as open-r1), else 0.0."""
    return [1.0 if _FORMAT.match(completion_text(c)) else 0.0 for c in completions]


format_reward.__name__ = "format"

_TAG_MARKS = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")


@register_reward("tag_count")
def tag_count(prompts, completions, **kwargs) -> list[float]:
    """0.25 for each of ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``, ``\\n</answer>``
    occurring exactly once."""
    out = []
    for c in completions:
        text = completion_text(c)
        out.append(0.25 * sum(text.count(m) == 1 for m in _TAG_MARKS))
    return out


# no MULTILINE: "^\d+\." only counts a numbered item at the very start of the text
_STEPS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


@register_reward("reasoning_steps")
def reasoning_steps(prompts, completions, **kwargs) -> list[float]:
    """min(1, number of step markers / 3)."""
    return [min(1.0, len(_STEPS.findall(completion_text(c))) / 3) for c in completions]


@register_reward("code_format", factory=True)
def code_format(language: str = "python"):
    """Like ``format``, with a fenced ```` ```language ... ``` ```` block inside the answer.
    A row's ``language`` dataset column, when present, overrides the parameter."""
    if not isinstance(language, str) or not language:
        raise ValueError(f"code_format: language={language!r} must be a non-empty string")

    def pattern(lang: str) -> re.Pattern:
        return re.compile(
            rf"^<think>\n.*?\n</think>\n<answer>\n.*?```{re.escape(lang)}.*?```.*?\n</answer>$",
            re.DOTALL | re.MULTILINE,
        )

    default = pattern(language)

    def code_format(prompts, completions, language=None, **kwargs) -> list[float]:
        langs = language if language is not None else [None] * len(completions)
        out = []
        for c, lang in zip(completions, langs):
            pat = default if lang is None else pattern(str(lang))
            out.append(1.0 if pat.match(completion_text(c)) else 0.0)
        return out

    return code_format


# ---------------------------------------------------------------------- length / repetition
def _words(language: str):
    if language == "en":
        return lambda text: text.lower().split()
    if language == "zh":
        try:
            import jieba
        except ImportError as e:
            raise ValueError(
                "repetition_penalty: language='zh' needs jieba: pip install jieba"
            ) from e
        return lambda text: list(jieba.cut(text))
    raise ValueError(f"repetition_penalty: language={language!r}; supported: 'en', 'zh'")


@register_reward("repetition_penalty", factory=True)
def repetition_penalty(ngram_size: int = 3, max_penalty: float = -1.0, language: str = "en"):
    """(1 - distinct n-grams / n-grams) * max_penalty over lower-cased whitespace words
    (arXiv:2502.03373 App. C.2); 0.0 for texts shorter than one n-gram."""
    _check_number("repetition_penalty", max_penalty=max_penalty)
    if max_penalty > 0:
        raise ValueError(f"repetition_penalty: max_penalty={max_penalty} must not be positive")
    if isinstance(ngram_size, bool) or not isinstance(ngram_size, int) or ngram_size < 1:
        raise ValueError(f"repetition_penalty: ngram_size={ngram_size!r} must be an int >= 1")
    split = _words(language)

    def repetition_penalty(prompts, completions, **kwargs) -> list[float]:
        out = []
        for c in completions:
            words = split(completion_text(c))
            if len(words) < ngram_size:
                out.append(0.0)
                continue
            grams = list(zip(*[words[i:] for i in range(ngram_size)]))
            out.append((1 - len(set(grams)) / len(grams)) * max_penalty)
        return out

    return repetition_penalty


def soft_overlong(max_completion_len: int = 16384, soft_punish_cache: int = 4096):
    """DAPO's soft overlong punishment (arXiv:2503.14476, Eq. 13) on completion TOKEN counts
    (the ``completion_ids`` column): with L = max_completion_len, C = soft_punish_cache,
    0 for n <= L - C, (L - C - n) / C for L - C < n <= L, -1 beyond L."""
    for k, v in (
        ("max_completion_len", max_completion_len),
        ("soft_punish_cache", soft_punish_cache),
    ):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"soft_overlong: {k}={v!r} must be an int")
    if not 0 <= soft_punish_cache <= max_completion_len:
        raise ValueError(
            f"soft_overlong: need 0 <= soft_punish_cache ({soft_punish_cache}) "
            f"<= max_completion_len ({max_completion_len})"
        )
    start = max_completion_len - soft_punish_cache

    def soft_overlong(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is None:
            raise KeyError(
                "soft_overlong counts tokens: it needs the completion_ids column "
                "(one list of token ids per completion), which grpokit's trainer passes"
            )
        out = []
        for ids in completion_ids:
            n = len(ids)
            if n <= start:
                out.append(0.0)
            elif n <= max_completion_len:
                out.append((start - n) / soft_punish_cache)
            else:
                out.append(-1.0)
        return out

    return soft_overlong


# grpokit's short name, and open-r1's registry name for the same factory
register_reward("soft_overlong", factory=True)(soft_overlong)
register_reward("soft_overlong_punishment", factory=True)(soft_overlong)
