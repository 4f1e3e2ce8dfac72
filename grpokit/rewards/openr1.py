"""open-r1's reward functions, under the same names and with the same numbers.

Reference: huggingface/open-r1, ``src/open_r1/rewards.py`` (read for behaviour; this is our
own code). Divergences, each deliberate: a completion may be a string or a message list;
math-verify runs time-bounded from any thread (see ``MathVerifier``).
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import logging
import math
import multiprocessing as mp
import re
import threading

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text

log = logging.getLogger("grpokit")

MATH_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------- math-verify
def _gold_config():
    from math_verify import LatexExtractionConfig

    return [LatexExtractionConfig()]


def _answer_config(boxed):
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig

    # open-r1 also passes equations=True, which latex2sympy2_extended now ignores (deprecated)
    norm = NormalizationConfig(
        nits=False, malformed_operators=False, basic_latex=True, boxed=boxed, units=True
    )
    return [
        LatexExtractionConfig(
            normalization_config=norm, boxed_match_priority=0, try_extract_without_anchor=False
        )
    ]


def _grade(content: str, solution: str, boxed: str | bool = "all") -> float | None:
    """1.0 / 0.0 as open-r1 scores it; None when the gold cannot be parsed. Must run in a
    main thread (math-verify's own timeouts use signal.alarm)."""
    from math_verify import parse, verify

    gold = parse(solution, extraction_mode="first_match", extraction_config=_gold_config())
    if len(gold) == 0:
        return None
    answer = parse(content, extraction_config=_answer_config(boxed), extraction_mode="first_match")
    try:
        return float(verify(gold, answer))
    except Exception as e:  # math-verify can fail on odd expressions: score as wrong
        log.debug("verify failed: %s", e)
        return 0.0


class MathVerifier:
    """Runs ``_grade`` directly in the main thread; from any other thread, in a worker
    process (whose main thread can use math-verify's signal timeouts), with a hard wall-clock
    bound. A worker that overruns is replaced and the sample scores 0.0."""

    def __init__(self, timeout: float = MATH_TIMEOUT_S):
        self.timeout = timeout
        self._pool: cf.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get_pool(self) -> cf.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = cf.ProcessPoolExecutor(
                    max_workers=1, mp_context=mp.get_context("spawn")
                )
            return self._pool

    def _reset(self) -> None:
        with self._lock:
            if self._pool is not None:
                for p in list(getattr(self._pool, "_processes", {}).values()):
                    p.kill()
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    def grade_many(
        self, contents: list[str], solutions: list[str], boxed: str | bool = "all"
    ) -> list:
        if threading.current_thread() is threading.main_thread():
            return [_grade(c, s, boxed) for c, s in zip(contents, solutions)]
        out = []
        for c, s in zip(contents, solutions):
            fut = self._get_pool().submit(_grade, c, s, boxed)
            try:
                out.append(fut.result(timeout=self.timeout * 3))
            except cf.TimeoutError:
                log.warning("math-verify took over %.0fs on a sample: scored 0.0", self.timeout * 3)
                self._reset()
                out.append(0.0)
        return out

    def close(self) -> None:
        self._reset()


_VERIFIER = MathVerifier()
atexit.register(_VERIFIER.close)


def _solutions(kwargs) -> list[str]:
    sol = kwargs.get("solution")
    if sol is None:
        sol = kwargs.get("answer")
    if sol is None:
        raise KeyError(
            "accuracy needs a 'solution' (or 'answer') dataset column with the gold answer"
        )
    return [str(s) for s in sol]


# ---------------------------------------------------------------------- rewards
@register_reward("accuracy")
def accuracy(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when math-verify finds the completion's answer equal to the gold ``solution``;
    None (skipped) when the gold cannot be parsed."""
    texts = [completion_text(c) for c in completions]
    return _VERIFIER.grade_many(texts, _solutions(kwargs))


_FORMAT = re.compile(
    r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE
)


@register_reward("format")
def format_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 for ``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`` (the whole text)."""
    return [1.0 if _FORMAT.match(completion_text(c)) else 0.0 for c in completions]


format_reward.__name__ = "format"


@register_reward("tag_count")
def tag_count(prompts, completions, **kwargs) -> list[float]:
    """0.25 for each of ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``, ``\\n</answer>``
    present exactly once."""
    marks = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return [0.25 * sum(completion_text(c).count(m) == 1 for m in marks) for c in completions]


_STEPS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


@register_reward("reasoning_steps")
def reasoning_steps(prompts, completions, **kwargs) -> list[float]:
    """min(1, number of step markers / 3)."""
    return [min(1.0, len(_STEPS.findall(completion_text(c))) / 3) for c in completions]


@register_reward("length")
def length(prompts, completions, **kwargs) -> list[float | None]:
    """Kimi 1.5 length reward (arXiv:2501.12599) over the batch, by characters:
    lambda = 0.5 - (len - min_len) / (max_len - min_len); correct -> lambda,
    wrong -> min(0, lambda); all lengths equal -> 0. Unparseable gold counts as correct."""
    texts = [completion_text(c) for c in completions]
    graded = _VERIFIER.grade_many(texts, _solutions(kwargs), boxed=True)
    correct = [True if g is None else bool(g) for g in graded]
    lens = [len(t) for t in texts]
    lo, hi = min(lens), max(lens)
    if hi == lo:
        return [0.0] * len(texts)
    out = []
    for n, ok in zip(lens, correct):
        lam = 0.5 - (n - lo) / (hi - lo)
        out.append(float(lam if ok else min(0.0, lam)))
    return out


@register_reward("cosine", factory=True)
def cosine(
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    max_len: int = 1000,
):
    """Cosine-scaled by length in characters (Yeo et al. 2025, arXiv:2502.03373): shorter
    correct answers earn more, longer wrong ones lose less. Unparseable gold -> 1.0."""

    def cosine(prompts, completions, **kwargs) -> list[float]:
        texts = [completion_text(c) for c in completions]
        graded = _VERIFIER.grade_many(texts, _solutions(kwargs), boxed=True)
        out = []
        for t, g in zip(texts, graded):
            if g is None:
                out.append(1.0)
                continue
            cos = math.cos(len(t) / max_len * math.pi)
            lo, hi = (
                (min_value_correct, max_value_correct) if g else (max_value_wrong, min_value_wrong)
            )
            out.append(float(lo + 0.5 * (hi - lo) * (1.0 + cos)))
        return out

    return cosine


@register_reward("repetition_penalty", factory=True)
def repetition_penalty(ngram_size: int = 3, max_penalty: float = -1.0):
    """(1 - distinct n-grams / n-grams) * max_penalty over lower-cased words (arXiv:2502.03373
    App. C.2); 0 for texts shorter than one n-gram."""
    if max_penalty > 0:
        raise ValueError(f"repetition_penalty: max_penalty={max_penalty} must be <= 0")
    if ngram_size < 1:
        raise ValueError(f"repetition_penalty: ngram_size={ngram_size} must be >= 1")

    def repetition_penalty(prompts, completions, **kwargs) -> list[float]:
        out = []
        for c in completions:
            words = completion_text(c).lower().split()
            if len(words) < ngram_size:
                out.append(0.0)
                continue
            grams = list(zip(*[words[i:] for i in range(ngram_size)]))
            out.append((1 - len(set(grams)) / len(grams)) * max_penalty)
        return out

    return repetition_penalty


@register_reward("soft_overlong", factory=True)
def soft_overlong(max_completion_len: int = 4096, soft_punish_cache: int = 512):
    """DAPO's soft overlong punishment (arXiv:2503.14476) on completion TOKEN counts:
    0 up to L - cache, then linearly down to -1 at L, and -1 beyond."""
    if not 0 <= soft_punish_cache <= max_completion_len:
        raise ValueError("soft_overlong: need 0 <= soft_punish_cache <= max_completion_len")

    def soft_overlong(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is None:
            raise KeyError("soft_overlong needs completion_ids (token ids of each completion)")
        start = max_completion_len - soft_punish_cache
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


@register_reward("code_format", factory=True)
def code_format(language: str = "python"):
    """1.0 for think/answer blocks whose answer holds a fenced ``language`` code block."""
    pat = re.compile(
        rf"^<think>\n.*?\n</think>\n<answer>\n.*?```{re.escape(language)}.*?```.*?\n</answer>$",
        re.DOTALL | re.MULTILINE,
    )

    def code_format(prompts, completions, **kwargs) -> list[float]:
        return [1.0 if pat.match(completion_text(c)) else 0.0 for c in completions]

    return code_format
