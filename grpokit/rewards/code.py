"""Code rewards: run the LAST ```python block of a completion against stdin/stdout cases."""

from __future__ import annotations

import json
import re

from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text
from grpokit.sandbox import score_many

_BLOCK = re.compile(r"```python\s*\n(.*?)```", re.DOTALL)


def extract_code(completion) -> str | None:
    found = _BLOCK.findall(completion_text(completion))
    return found[-1] if found else None


def _scores(completions, verification_info, timeout: float = 5.0) -> list[float]:
    jobs, idx = [], []
    out = [0.0] * len(completions)
    for i, (c, info) in enumerate(zip(completions, verification_info)):
        if isinstance(info, str):
            info = json.loads(info)
        code = extract_code(c)
        if code is not None:
            jobs.append((code, info.get("test_cases", [])))
            idx.append(i)
    for i, s in zip(idx, score_many(jobs, timeout=timeout)):
        out[i] = s
    return out


@register_reward("code", factory=True)
def code(timeout: float = 5.0):
    def code(prompts, completions, verification_info, **kwargs) -> list[float]:
        return _scores(completions, verification_info, timeout)

    return code


@register_reward("binary_code", factory=True)
def binary_code(timeout: float = 5.0):
    def binary_code(prompts, completions, verification_info, **kwargs) -> list[float]:
        return [1.0 if s == 1.0 else 0.0 for s in _scores(completions, verification_info, timeout)]

    return binary_code
