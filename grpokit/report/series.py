"""Numbers drawn from a loaded run: a metric's series, its smoothing, the reward functions
logged, and the steps whose completions the page shows."""

from __future__ import annotations

from typing import Any

from grpokit.report.data import RunData, finite


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over ``rows``, keeping only finite values."""
    xs, ys = [], []
    for r in rows:
        v = finite(r.get(key))
        if v is not None:
            xs.append(float(r["step"]))
            ys.append(v)
    return xs, ys


def smoothing_weight(n: int) -> float:
    """EMA weight for ``n`` points: none for a handful, up to 0.95 for long runs."""
    return min(0.95, max(0.0, 1.0 - 5.0 / n)) if n else 0.0


def ema(values: list[float], weight: float | None = None) -> list[float]:
    """Debiased exponential moving average (as TensorBoard's smoothing slider)."""
    w = smoothing_weight(len(values)) if weight is None else weight
    out, acc, norm = [], 0.0, 0.0
    for v in values:
        acc = w * acc + (1 - w) * v
        norm = w * norm + (1 - w)
        out.append(acc / norm)
    return out


def reward_funcs(d: RunData) -> list[str]:
    """Reward-function names found in ``rewards/<func>/mean`` columns, in first-seen order."""
    names: dict[str, None] = {}
    for r in d.train:
        for k in r:
            if k.startswith("rewards/") and k.endswith("/mean"):
                names[k[len("rewards/") : -len("/mean")]] = None
    return list(names)


def milestone_steps(steps: list[float], between: int = 3) -> list[float]:
    """First, ``between`` evenly spaced, and last of the sorted distinct ``steps``."""
    steps = sorted(set(steps))
    n = len(steps)
    if n <= between + 2:
        return steps
    idx = {0, n - 1} | {round(i * (n - 1) / (between + 1)) for i in range(1, between + 1)}
    return [steps[i] for i in sorted(idx)]
