"""What a step logs: the round's metrics (rewards, lengths, accuracy), the token-weighted
means of the loss terms over micro-batches and processes, and the completions table."""

from __future__ import annotations

import math
from typing import Any

import torch

from grpokit import distributed as dist
from grpokit.algo.advantages import reward_spread_stats
from grpokit.prompts import prompt_text


def _nan_none(x: float):
    return None if math.isnan(x) else x


def round_metrics(ro, total, all_rewards, rewards, cfg) -> dict[str, Any]:
    """Rewards and completion lengths of one round, over every process's rows, by TRL's
    definitions.

    ``total``: (N_global,) combined rewards; ``all_rewards``: (N_global, F) per function;
    ``rewards``: the run's reward functions (``weights``, ``names``)."""
    lengths = dist.all_gather_cat(ro.generated_lengths.float())  # tool results left out
    truncated = dist.all_gather_cat(ro.truncated.float())
    ended = lengths[truncated == 0]
    ended = ended if ended.numel() else torch.zeros(1)  # none ended: 0, as TRL
    spread = reward_spread_stats(
        all_rewards, rewards.weights, cfg.num_generations, scale_rewards=cfg.scale_rewards_mode,
        multi_objective_aggregation=cfg.multi_objective_aggregation,
    )  # fmt: skip
    m: dict[str, Any] = {
        "reward": torch.nanmean(total),
        **spread,
        "completions/mean_length": lengths.mean(),
        "completions/min_length": lengths.min(),
        "completions/max_length": lengths.max(),
        "completions/clipped_ratio": truncated.mean(),
        "completions/mean_terminated_length": ended.mean(),
        "completions/min_terminated_length": ended.min(),
        "completions/max_terminated_length": ended.max(),
        "tokens_generated": lengths.sum(),
        "tokens_prompt": dist.all_reduce_sum(ro.prompt_mask.sum().float()),
    }
    if ro.episodes is not None:
        m.update(tool_metrics(ro.episodes))
    for j, name in enumerate(rewards.names):
        col = all_rewards[:, j]
        valid = col[~torch.isnan(col)]
        m[f"rewards/{name}/mean"] = valid.mean() if valid.numel() else float("nan")
        m[f"rewards/{name}/std"] = valid.std() if valid.numel() > 1 else float("nan")
    return m


def counter_metrics(counters: dict[str, int]) -> dict[str, int]:
    """The run's counts so far, logged every step: skipped non-finite steps, reward errors,
    truncated prompts; the counts that only some runs have (a reward model's truncated
    inputs, checkpoints not saved for lack of disk space) once they exist."""
    out = {
        "skipped_steps": counters.get("skipped_nonfinite_steps", 0),
        "reward_errors": counters.get("reward_errors", 0),
        "truncated_prompts": counters.get("truncated_prompts", 0),
    }
    for key in ("reward_model_truncated", "checkpoints_not_saved"):
        if key in counters:
            out[key] = counters[key]
    return out


def tool_metrics(episodes) -> dict[str, Any]:
    """Multi-turn rounds: TRL's ``tools/call_frequency`` (calls per completion) and
    ``tools/failure_frequency`` (failed calls / calls), every process's; and the failures
    by kind (``tools/failures/<kind>``, counts)."""
    from grpokit.tools import FAILURE_KINDS

    counts = [float(len(episodes)), float(sum(e.calls for e in episodes))]
    counts += [float(sum(e.failures.get(k, 0) for e in episodes)) for k in FAILURE_KINDS]
    c = dist.all_reduce_sum(torch.tensor(counts, dtype=torch.float64)).tolist()
    failed = sum(c[2:])
    m = {"tools/call_frequency": c[1] / max(c[0], 1.0)}
    m["tools/failure_frequency"] = failed / c[1] if c[1] else 0.0
    m.update({f"tools/failures/{k}": v for k, v in zip(FAILURE_KINDS, c[2:])})
    return m


def graded(task, texts, rows, G: int) -> torch.Tensor:
    """(N * G,) bool: the task's grader on each completion (``rows``: the N prompt rows)."""
    per_row = [r for r in rows for _ in range(G)]
    return torch.tensor([bool(task.is_correct(t, r)) for t, r in zip(texts, per_row)], dtype=bool)


def accuracy(correct: torch.Tensor, n_global: int) -> torch.Tensor:
    """The task's grader's verdicts (this process's completions, bool) over every process:
    the fraction correct."""
    return dist.all_reduce_sum(torch.tensor(float(correct.sum()))) / n_global


def completions_table(prompts, texts, rewards, total, adv, reward_names) -> list[dict[str, Any]]:
    """One row per completion of this process: prompt, completion, rewards, advantage.
    ``total`` holds this process's rows only."""
    return [
        {
            "prompt": prompt_text(prompts[i]),
            "completion": texts[i],
            "reward": _nan_none(total[i].item()),
            "rewards": {n: _nan_none(rewards[i, j].item()) for j, n in enumerate(reward_names)},
            "advantage": adv[i].item(),
        }
        for i in range(len(texts))
    ]


_EXTREMES = ("_max", "_min", "/max", "/min")  # [::2]: the maxima


class TokenWeightedMeans:
    """Loss-term metrics of micro-batches, weighted by their loss tokens, and the extremes
    of ``*_max`` / ``*_min`` metrics, combined over processes by ``result``."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.tokens = 0.0
        self.extremes: dict[str, float] = {}
        self.combined: dict[str, float] = {}  # already the same on every process

    def add(self, metrics: dict[str, torch.Tensor], ntok: float) -> None:
        self.tokens += ntok
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + v.item() * ntok

    def add_extremes(self, metrics: dict[str, torch.Tensor]) -> None:
        """Moves the ``*_max`` / ``*_min`` (``*/max`` / ``*/min``) entries of ``metrics``
        into the extremes."""
        for k in [k for k in metrics if k.endswith(_EXTREMES)]:
            v = metrics.pop(k).item()
            pick = max if k.endswith(_EXTREMES[::2]) else min
            self.extremes[k] = pick(self.extremes.get(k, v), v)

    def result(self) -> dict[str, float]:
        sums, tokens = self.sums, self.tokens
        if dist.world_size() > 1:  # token-weighted means over all ranks
            keys = sorted(sums)
            packed = dist.all_reduce_sum(
                torch.tensor([sums[k] for k in keys] + [tokens], dtype=torch.float64)
            )
            sums, tokens = dict(zip(keys, packed[:-1].tolist())), packed[-1].item()
        out = {k: v / max(tokens, 1.0) for k, v in sums.items()}
        ext = self.extremes
        if dist.world_size() > 1 and ext:  # every process has the same keys (same code path)
            keys = sorted(ext)
            sign = [1.0 if k.endswith(_EXTREMES[::2]) else -1.0 for k in keys]
            signed = torch.tensor([s * ext[k] for s, k in zip(sign, keys)], dtype=torch.float64)
            ext = dict(
                zip(keys, (s * v for s, v in zip(sign, dist.all_reduce_max(signed).tolist())))
            )
        out.update(ext)
        out.update(self.combined)
        return out
