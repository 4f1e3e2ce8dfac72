"""Run the reward functions on a batch of completions: (N, F) rewards with NaN for None."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grpokit import distributed as dist
from grpokit.algo import multi_objective_advantages
from grpokit.algo.variants import TOKEN_WEIGHTED_ESTIMATORS
from grpokit.prompts import columns_for_rewards

log = logging.getLogger("grpokit")


class RewardError(RuntimeError):
    """A reward function raised or returned something unusable."""


def reward_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _call(fn, prompts, completions, columns) -> list:
    out = fn(prompts=prompts, completions=completions, **columns)
    if not isinstance(out, (list, tuple)) or len(out) != len(completions):
        got = f"{type(out).__name__} of length {len(out)}" if hasattr(out, "__len__") else repr(out)
        raise RewardError(
            f"reward function {reward_name(fn)!r} returned {got}; it must return a list with "
            f"one float or None per completion ({len(completions)})"
        )
    return list(out)


def _value(fn, v, completion, on_error: str = "raise", counters: dict | None = None) -> float:
    if v is None:
        return math.nan
    if on_error == "skip":
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if not math.isfinite(x):
            log.warning(
                "reward %s gave %r for completion %s: scored as None",
                reward_name(fn),
                v,
                _show(completion),
            )
            if counters is not None:
                counters["reward_errors"] = counters.get("reward_errors", 0) + 1
            return math.nan
        return x
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise RewardError(
            f"reward function {reward_name(fn)!r} returned {v!r} for completion "
            f"{_show(completion)}; rewards must be numbers or None"
        ) from None
    if not math.isfinite(x):
        raise RewardError(
            f"reward function {reward_name(fn)!r} returned {x} for completion {_show(completion)}; "
            "rewards must be finite (return None when a reward does not apply)"
        )
    return x


def _count_truncated(fn, counters: dict | None) -> None:
    """A reward model's inputs cut to its maximum length, summed in
    ``counters["reward_model_truncated"]`` (present, from 0, whenever a reward model runs)."""
    cut = getattr(fn, "last_truncated", None)
    if counters is not None and isinstance(cut, int):
        counters["reward_model_truncated"] = counters.get("reward_model_truncated", 0) + cut


def _show(completion: Any, n: int = 200) -> str:
    text = completion if isinstance(completion, str) else str(completion)
    return repr(text[:n] + ("..." if len(text) > n else ""))


def score(
    funcs: Sequence[Callable],
    prompts: list,
    completions: list,
    columns: dict[str, list],
    *,
    on_error: str = "raise",
    counters: dict[str, int] | None = None,
) -> torch.Tensor:
    """Rewards (N, F) float32; NaN where a function returned None (or failed, with skip).

    ``on_error="raise"`` turns an exception inside a reward function into a RewardError that
    names the function and shows the offending completion. ``"skip"`` gives those samples
    None for that function, logs it and counts it in ``counters["reward_errors"]``.
    """
    N = len(completions)
    out = torch.full((N, len(funcs)), math.nan)
    for j, fn in enumerate(funcs):
        try:
            vals = _call(fn, prompts, completions, columns)
            _count_truncated(fn, counters)
        except RewardError:
            raise
        except Exception as batch_exc:  # find the sample(s) that break it
            vals = []
            for i in range(N):
                cols_i = {k: v[i : i + 1] for k, v in columns.items()}
                try:
                    vals.extend(_call(fn, prompts[i : i + 1], completions[i : i + 1], cols_i))
                except Exception as e:
                    if on_error == "raise":
                        raise RewardError(
                            f"reward function {reward_name(fn)!r} raised {type(e).__name__}: {e} "
                            f"on completion {_show(completions[i])}; fix the function, or set "
                            "reward_errors: skip to score such samples as None and count them"
                        ) from e
                    log.warning("reward %s failed on sample %d: %s", reward_name(fn), i, e)
                    if counters is not None:
                        counters["reward_errors"] = counters.get("reward_errors", 0) + 1
                    vals.append(None)
            if on_error == "raise" and all(v is not None for v in vals):
                raise RewardError(
                    f"reward function {reward_name(fn)!r} raised {type(batch_exc).__name__}: "
                    f"{batch_exc} on the batch but not on any single sample"
                ) from batch_exc
        for i, v in enumerate(vals):
            out[i, j] = _value(fn, v, completions[i], on_error, counters)
    return out


def score_rollout(
    funcs: Sequence[Callable],
    rows: list[dict[str, Any]],
    ro,
    group_size: int = 1,
    *,
    on_error: str = "raise",
    counters: dict[str, int] | None = None,
) -> torch.Tensor:
    """(N, F) rewards of a rollout's completions (``group_size`` per row of ``rows``,
    contiguous): each function gets the prompts, the completions as assistant messages (a
    multi-turn completion: its messages, tool turns included), every dataset column but the
    prompt, the completion token ids and, with environment_factory, ``environments``."""
    columns = columns_for_rewards(rows, group_size)
    columns["completion_ids"] = [
        ro.completion_ids[i, : int(n)].tolist() for i, n in enumerate(ro.lengths)
    ]
    completions = [[{"role": "assistant", "content": t}] for t in ro.texts]
    if ro.episodes is not None:  # multi-turn: the whole conversation, tool turns included (TRL)
        completions = [e.messages for e in ro.episodes]
        if any(e.environment is not None for e in ro.episodes):
            columns["environments"] = [e.environment for e in ro.episodes]
    prompts = [r["prompt"] for r in rows for _ in range(group_size)]
    return score(funcs, prompts, completions, columns, on_error=on_error, counters=counters)


def combine(rewards: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(N, F) rewards, (F,) weights -> (N,) total; functions that gave None are left out,
    and a sample no function applied to is NaN (its advantage becomes 0)."""
    weighted = rewards * weights[None]
    total = torch.nansum(weighted, dim=1)
    none_applied = torch.isnan(rewards).all(dim=1)
    return torch.where(none_applied, torch.full_like(total, math.nan), total)


def round_advantages(
    rewards: torch.Tensor, weights: torch.Tensor, cfg, device,
    lengths: torch.Tensor | None = None,
) -> tuple:  # fmt: skip
    """A round's advantages from this process's (N, F) rewards: (every process's (N_g, F)
    rewards, their weighted sum (N_g,), this process's (N,) advantages on ``device``).
    Group statistics are global: every process gathers every reward first. ``lengths``:
    this process's (N,) loss-token counts, gathered alike for the estimators that weigh
    completions by their tokens (``reinforce_plus_plus_baseline`` whitens over the tokens
    of every process's completions, as verl over its global batch)."""
    all_rewards = dist.all_gather_cat(rewards)  # (N_global, F)
    all_lengths = None
    if cfg.advantage_estimator in TOKEN_WEIGHTED_ESTIMATORS:
        if lengths is None:
            raise ValueError(f"advantage_estimator {cfg.advantage_estimator} needs the lengths")
        all_lengths = dist.all_gather_cat(lengths.to(rewards.device))  # rows as all_rewards
    total = combine(all_rewards, weights)  # (N_global,)
    adv_all = multi_objective_advantages(
        all_rewards, weights, cfg.num_generations,
        scale_rewards=cfg.scale_rewards_mode, estimator=cfg.advantage_estimator,
        multi_objective_aggregation=cfg.multi_objective_aggregation,
        completion_lengths=all_lengths,
    )  # fmt: skip
    N, r = rewards.shape[0], dist.rank()
    return all_rewards, total, adv_all[r * N : (r + 1) * N].to(device)
