"""Code rewards (open-r1's ``code`` and ``binary_code``): run the LAST fenced block of a
completion in its row's language against stdin/stdout cases in grpokit.sandbox
(docs/sandbox.md). Column: ``verification_info`` (open-r1's layout, ``{"language":
"python" | "cpp", "test_cases": [{"input": ..., "output": ...}, ...]}``, a dict or its JSON
string; no ``language`` means Python). Python runs the last ```` ```python ```` block; C++
(``cpp``, ``c++``) the last ```` ```cpp ```` (or ```` ```c++ ````) block, compiled with
``g++`` inside the sandbox once per completion."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import OrderedDict

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text
from grpokit.sandbox import language_of, score_many
from grpokit.sandbox.cpp import COMPILE_TIMEOUT

# the fence tags each language's block may carry (open-r1 writes ```python / ```cpp)
FENCES = {"python": ("python",), "cpp": ("cpp", "c++")}
_BLOCKS = {
    lang: re.compile(
        rf"```(?:{'|'.join(re.escape(t) for t in tags)})[ \t]*\r?\n(.*?)```", re.DOTALL
    )
    for lang, tags in FENCES.items()
}
BINARY_THRESHOLD = 0.99  # open-r1's binary_code: a pass rate above this counts as solved
RECENT_SCORES = 4096  # sandbox verdicts kept (see ``code_scores``)
_recent: OrderedDict[bytes, float] = OrderedDict()


def extract_code(completion, language: str = "python") -> str | None:
    """The last fenced block of ``language`` (python, cpp / c++) in a completion, or None."""
    found = _BLOCKS[language_of(language)].findall(completion_text(completion))
    return found[-1] if found else None


def binary_score(pass_rate: float) -> float:
    """open-r1's ``binary_code``: 1.0 when the pass rate is above 0.99, else 0.0."""
    return 1.0 if pass_rate > BINARY_THRESHOLD else 0.0


def parse_info(info) -> tuple[str, list[dict]]:
    """(language, test cases) of one ``verification_info`` value (dict or JSON string)."""
    if isinstance(info, str):
        info = json.loads(info)
    if not isinstance(info, dict):
        raise ValueError(
            f"code reward: verification_info must be a dict or its JSON string, got "
            f"{type(info).__name__}"
        )
    return language_of(info.get("language") or "python"), list(info.get("test_cases") or [])


def code_scores(
    completions,
    verification_info,
    timeout: float = 5.0,
    memory_mb: int = 512,
    workers: int | None = None,
    isolation: str | None = None,
    compile_timeout: float = COMPILE_TIMEOUT,
) -> list[float]:
    """Fraction of its row's test cases each completion's last block (in the row's language)
    passes, 0.0 without a block or when C++ does not compile; the ``code`` reward, and the
    ``code`` task's grader (through ``binary_score``).

    The same program against the same cases under the same limits runs once: within a call
    (a group's identical completions) and across the last ``RECENT_SCORES`` verdicts, so the
    task's grader (a step's accuracy) reuses the verdict the reward just paid a sandbox run
    for, and both always agree."""
    limits = {"timeout": timeout, "memory_mb": memory_mb, "isolation": isolation}
    level = isolation or os.environ.get("GRPOKIT_SANDBOX_ISOLATION") or "auto"
    keys: list[bytes | None] = []
    got: dict[bytes, float] = {}
    todo: dict[bytes, tuple] = {}
    for c, info in zip(completions, verification_info):
        language, cases = parse_info(info)
        code = extract_code(c, language)
        key = None
        if code is not None:
            key = _job_key(code, cases, language, {**limits, "isolation": level}, compile_timeout)
            if key in _recent:
                got[key] = _recent[key]
            else:
                todo.setdefault(key, (code, cases, language))
        keys.append(key)
    if todo:
        scores = score_many(
            list(todo.values()), max_workers=workers, compile_timeout=compile_timeout, **limits
        )
        for key, s in zip(todo, scores):
            got[key] = s
            _remember(key, s)
    return [0.0 if k is None else got[k] for k in keys]


def _job_key(code: str, cases: list, language: str, limits: dict, compile_timeout) -> bytes:
    what = [code, cases, language, limits, compile_timeout]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).digest()


def _remember(key: bytes, score: float) -> None:
    _recent[key] = score
    _recent.move_to_end(key)
    while len(_recent) > RECENT_SCORES:
        _recent.popitem(last=False)


def forget_scores() -> None:
    """Drop the remembered verdicts (tests that must see every program run)."""
    _recent.clear()


def _limits(timeout, memory_mb, workers, isolation, compile_timeout) -> dict:
    return {
        "timeout": timeout,
        "memory_mb": memory_mb,
        "workers": workers,
        "isolation": isolation,
        "compile_timeout": compile_timeout,
    }


@register_reward("code", factory=True)
def code(
    timeout: float = 5.0,
    memory_mb: int = 512,
    workers: int | None = None,
    isolation: str | None = None,
    compile_timeout: float = COMPILE_TIMEOUT,
):
    """Fraction of test cases passed. ``timeout``: wall-clock seconds per case (also the CPU
    limit); ``memory_mb``: address space; ``workers``: parallel sandboxes (default: CPUs, at
    most 8); ``isolation``: auto / namespaces / uid / none (docs/sandbox.md);
    ``compile_timeout``: wall-clock seconds for g++ on a C++ row."""
    limits = _limits(timeout, memory_mb, workers, isolation, compile_timeout)

    def code(prompts, completions, verification_info, **kwargs) -> list[float]:
        return code_scores(completions, verification_info, **limits)

    return code


@register_reward("binary_code", factory=True)
def binary_code(
    timeout: float = 5.0,
    memory_mb: int = 512,
    workers: int | None = None,
    isolation: str | None = None,
    compile_timeout: float = COMPILE_TIMEOUT,
):
    """1.0 when more than 99% of the test cases pass (open-r1's threshold), else 0.0;
    parameters as ``code``."""
    limits = _limits(timeout, memory_mb, workers, isolation, compile_timeout)

    def binary_code(prompts, completions, verification_info, **kwargs) -> list[float]:
        scores = code_scores(completions, verification_info, **limits)
        return [binary_score(s) for s in scores]

    return binary_code
