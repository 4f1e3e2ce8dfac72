"""Code rewards: run the LAST ```python block of a completion against stdin/stdout cases in
grpokit.sandbox (docs/sandbox.md). Columns: ``verification_info`` (open-r1's layout,
``{"language": "python", "test_cases": [{"input": ..., "output": ...}, ...]}``, a dict or
its JSON string)."""

from __future__ import annotations

import json
import re

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text
from grpokit.sandbox import score_many

_BLOCK = re.compile(r"```python[ \t]*\r?\n(.*?)```", re.DOTALL)


def extract_code(completion) -> str | None:
    found = _BLOCK.findall(completion_text(completion))
    return found[-1] if found else None


def _scores(completions, verification_info, limits: dict) -> list[float]:
    jobs, idx = [], []
    out = [0.0] * len(completions)
    for i, (c, info) in enumerate(zip(completions, verification_info)):
        if isinstance(info, str):
            info = json.loads(info)
        language = info.get("language", "python")
        if language != "python":
            raise ValueError(f"code reward runs Python only, this row asks for {language!r}")
        code = extract_code(c)
        if code is not None:
            jobs.append((code, info.get("test_cases", [])))
            idx.append(i)
    for i, s in zip(idx, score_many(jobs, **limits)):
        out[i] = s
    return out


def _limits(timeout, memory_mb, workers, isolation) -> dict:
    return {
        "timeout": timeout,
        "memory_mb": memory_mb,
        "max_workers": workers,
        "isolation": isolation,
    }


@register_reward("code", factory=True)
def code(
    timeout: float = 5.0,
    memory_mb: int = 512,
    workers: int | None = None,
    isolation: str | None = None,
):
    """Fraction of test cases passed. ``timeout``: wall-clock seconds per case (also the CPU
    limit); ``memory_mb``: address space; ``workers``: parallel sandboxes (default: CPUs, at
    most 8); ``isolation``: auto / namespaces / uid / none (docs/sandbox.md)."""
    limits = _limits(timeout, memory_mb, workers, isolation)

    def code(prompts, completions, verification_info, **kwargs) -> list[float]:
        return _scores(completions, verification_info, limits)

    return code


@register_reward("binary_code", factory=True)
def binary_code(
    timeout: float = 5.0,
    memory_mb: int = 512,
    workers: int | None = None,
    isolation: str | None = None,
):
    """1.0 when every test case passes, else 0.0; parameters as ``code``."""
    limits = _limits(timeout, memory_mb, workers, isolation)

    def binary_code(prompts, completions, verification_info, **kwargs) -> list[float]:
        return [1.0 if s == 1.0 else 0.0 for s in _scores(completions, verification_info, limits)]

    return binary_code
