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


def code_scores(
    completions,
    verification_info,
    timeout: float = 5.0,
    memory_mb: int = 512,
    workers: int | None = None,
    isolation: str | None = None,
) -> list[float]:
    """Fraction of its row's test cases each completion's last ```python block passes (0.0
    without a block); the ``code`` reward, and the ``code`` task's grader (== 1.0)."""
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
    limits = {"timeout": timeout, "memory_mb": memory_mb, "isolation": isolation}
    for i, s in zip(idx, score_many(jobs, max_workers=workers, **limits)):
        out[i] = s
    return out


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
    limits = {
        "timeout": timeout,
        "memory_mb": memory_mb,
        "workers": workers,
        "isolation": isolation,
    }

    def code(prompts, completions, verification_info, **kwargs) -> list[float]:
        return code_scores(completions, verification_info, **limits)

    return code


@register_reward("binary_code", factory=True)
def binary_code(
    timeout: float = 5.0,
    memory_mb: int = 512,
    workers: int | None = None,
    isolation: str | None = None,
):
    """1.0 when every test case passes, else 0.0; parameters as ``code``."""
    limits = {
        "timeout": timeout,
        "memory_mb": memory_mb,
        "workers": workers,
        "isolation": isolation,
    }

    def binary_code(prompts, completions, verification_info, **kwargs) -> list[float]:
        scores = code_scores(completions, verification_info, **limits)
        return [1.0 if s == 1.0 else 0.0 for s in scores]

    return binary_code
