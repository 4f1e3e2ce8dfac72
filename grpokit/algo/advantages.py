"""Group-relative advantages (GRPO, Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

Layout: the G completions of one prompt are contiguous, so ``rewards`` of shape (B*G,)
groups as ``rewards.view(B, G)``.
"""

from __future__ import annotations

import math

import torch

from grpokit.algo.variants import (
    ADVANTAGE_ESTIMATORS,
    MULTI_OBJECTIVE_AGGREGATIONS,
    SCALE_REWARDS,
    TOKEN_WEIGHTED_ESTIMATORS,
)

# verl's masked_whiten: added to the variance inside the inverse square root
_WHITEN_EPS = 1e-8


def _nan_mean_std(x: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std over ``dim`` ignoring NaN (std is NaN with < 2 values)."""
    valid = ~torch.isnan(x)
    n = valid.sum(dim=dim, keepdim=dim is not None).to(x.dtype)
    x0 = torch.where(valid, x, torch.zeros_like(x))
    mean = x0.sum(dim=dim, keepdim=dim is not None) / n
    dev = torch.where(valid, x - mean, torch.zeros_like(x))
    var = (dev * dev).sum(dim=dim, keepdim=dim is not None) / (n - 1)
    return mean, var.sqrt()


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale_rewards: str = "group",
    eps: float = 1e-4,
    *,
    estimator: str = "grpo",
    completion_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages ``(r - baseline) / (std + eps)``, or REINFORCE++-baseline's whitening.

    Args:
        rewards: (B*G,) total reward per completion; NaN marks a completion that no
            reward function applied to: it is left out of the statistics and gets 0.
        group_size: G, the completions per prompt.
        scale_rewards: ``"group"`` divides by the group's unbiased std (GRPO);
            ``"batch"`` by the unbiased std of the whole batch (Hu et al., REINFORCE++ /
            TRL's "batch"); ``"none"`` does not divide (Dr. GRPO, Liu et al. 2025,
            arXiv:2503.20783).
        eps: added to the std.
        estimator: the baseline. ``"grpo"``: the group mean; ``"rloo"``: the mean of the
            other completions of the group (leave-one-out, Ahmadian et al. 2024,
            arXiv:2402.14740; verl's ``rloo``), which is G/(G-1) times the GRPO
            difference. verl and TRL's RLOOTrainer do not divide: use scale_rewards "none".
            ``"reinforce_plus_plus_baseline"`` (REINFORCE++ with a group baseline, Hu et al.,
            arXiv:2501.03262; verl's estimator of that name): ``a_i = r_i - mean(group)``
            (0 for the baseline when group_size is 1: the raw reward), then whitened over
            every completion token of the batch, as verl whitens its (N, T) token tensor:
            ``(a_i - mu) / sqrt(var + 1e-8)`` with ``mu = sum L_i a_i / L``,
            ``var = sum L_i (a_i - mu)^2 / (L - 1)``, ``L = sum L_i``; the mean is not added
            back. Needs ``completion_lengths`` and ``scale_rewards="batch"`` (the whitening
            is its batch scaling); ``eps`` is not used. Fewer than 2 tokens in all: zeros
            (verl raises).
        completion_lengths: (B*G,) the tokens each completion's advantage applies to (its
            loss tokens), or their (B*G, T) 0/1 mask; only the
            ``reinforce_plus_plus_baseline`` estimator reads it. A completion with 0 tokens
            or a NaN reward is left out of the whitening statistics and gets 0.

    Returns:
        (B*G,) advantages, finite everywhere.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} elements, "
            f"got shape {tuple(rewards.shape)}"
        )
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"estimator must be one of {ADVANTAGE_ESTIMATORS}, got {estimator!r}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    if estimator in TOKEN_WEIGHTED_ESTIMATORS:
        lengths = _completion_lengths(completion_lengths, rewards.numel(), estimator)
        if scale_rewards != "batch":
            raise ValueError(
                f"estimator {estimator!r} whitens over the batch's tokens itself: pass "
                f"scale_rewards='batch', got {scale_rewards!r}"
            )
        adv = _reinforce_pp_baseline(rewards.double(), group_size, lengths.to(rewards.device))
        return adv.to(out_dtype)
    # float64 statistics: with large rewards and a small spread (e.g. 349295, 349293,
    # 349284) float32 loses the differences to rounding and the group no longer sums to 0
    rewards = rewards.double()
    r = rewards.view(-1, group_size)  # (B, G)
    mean, std = _nan_mean_std(r, dim=1)  # (B, 1)
    adv = r - mean
    if estimator == "rloo":  # r - (sum - r) / (n - 1) = (r - mean) * n / (n - 1)
        n = (~torch.isnan(r)).sum(dim=1, keepdim=True).to(r.dtype)
        adv = adv * n / (n - 1)  # a group with one scored completion: NaN -> 0
    if scale_rewards == "group":
        adv = adv / (torch.nan_to_num(std, nan=0.0) + eps)
    elif scale_rewards == "batch":
        _, bstd = _nan_mean_std(rewards, dim=None)
        adv = adv / (torch.nan_to_num(bstd, nan=0.0) + eps)
    return torch.nan_to_num(adv.reshape(-1), nan=0.0).to(out_dtype)


def _completion_lengths(lengths: torch.Tensor | None, n: int, estimator: str) -> torch.Tensor:
    """(n,) float64 token counts from counts or an (n, T) mask."""
    if lengths is None:
        raise ValueError(
            f"estimator {estimator!r} weighs each completion by its tokens: pass "
            "completion_lengths, the (N,) token counts of the completions or their (N, T) mask"
        )
    if lengths.dim() == 2:
        lengths = lengths.sum(dim=1)
    if lengths.shape != (n,):
        raise ValueError(
            f"completion_lengths must be ({n},) or ({n}, T), got {tuple(lengths.shape)}"
        )
    if bool((lengths < 0).any()):
        raise ValueError("completion_lengths must be >= 0")
    return lengths.double()


def _reinforce_pp_baseline(
    rewards: torch.Tensor, group_size: int, lengths: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++-baseline on float64 (N,) rewards and token counts: the group mean
    subtracted (nothing for groups of one), then token-weighted whitening over the batch.
    Each completion's score is constant over its tokens, so verl's whitening of the (N, T)
    token tensor reduces to these sums weighted by the lengths."""
    r = rewards.view(-1, group_size)
    if group_size == 1:
        adv = r.reshape(-1)
    else:
        mean, _ = _nan_mean_std(r, dim=1)
        adv = (r - mean).reshape(-1)  # NaN where unscored
    counted = ~torch.isnan(rewards) & (lengths > 0)
    w = torch.where(counted, lengths, torch.zeros_like(lengths))
    adv = torch.where(counted, adv, torch.zeros_like(adv))
    total = w.sum()
    if total < 2:  # no variance (verl raises): nothing to whiten
        return torch.zeros_like(adv)
    # verl divides the token sums by (count + 1e-8), which float32 rounds to the count
    mu = (w * adv).sum() / total
    var = (w * (adv - mu) ** 2).sum() / (total - 1)  # Bessel-corrected, over tokens
    white = (adv - mu) * torch.rsqrt(var + _WHITEN_EPS)
    # unscored or no tokens (verl: nothing to carry the advantage): 0
    return torch.where(counted, white, torch.zeros_like(white))


def reward_spread_stats(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    group_size: int,
    *,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
    eps: float = 1e-4,
) -> dict[str, torch.Tensor]:
    """TRL's ``reward_std`` and ``frac_reward_zero_std`` of a step's (N, F) rewards.

    ``reward_std``: the unbiased, NaN-aware std of the combined rewards over the whole batch.
    ``frac_reward_zero_std``: the fraction of rows whose std used for the advantage is zero
    (|std| <= 1e-8, as ``torch.isclose``; a NaN std, a group with one scored completion, is
    not zero): with ``scale_rewards`` group or none the group's std, so the fraction of groups
    whose rewards are all equal; with batch, or ``normalize_then_sum``, the batch's std, so
    0 or 1."""
    total = weighted_sum(rewards_per_func, reward_weights).double()
    _, batch_std = _nan_mean_std(total, dim=None)
    if multi_objective_aggregation == "normalize_then_sum":
        _, std = _nan_mean_std(
            _normalized_sum(rewards_per_func, reward_weights, group_size, eps), None
        )
        zero = _is_zero(std).double()
    elif scale_rewards == "batch":
        zero = _is_zero(batch_std).double()
    elif group_size == 1:
        zero = torch.ones((), dtype=torch.float64)
    else:
        _, std = _nan_mean_std(total.view(-1, group_size), dim=1)
        zero = _is_zero(std).double().mean()
    return {"reward_std": batch_std, "frac_reward_zero_std": zero}


def _is_zero(std: torch.Tensor) -> torch.Tensor:
    return std.abs() <= 1e-8  # NaN: False


def weighted_sum(rewards: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(N, F) rewards, (F,) weights -> (N,): NaN entries (a function that does not apply)
    left out; NaN where no function applies."""
    total = torch.nansum(rewards * weights[None], dim=1)
    none_applied = torch.isnan(rewards).all(dim=1)
    return torch.where(none_applied, torch.full_like(total, float("nan")), total)


def _normalized_sum(
    rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, group_size: int, eps: float
) -> torch.Tensor:
    """(N,) float64: each function normalised within each group, then the weighted sum (GDPO);
    NaN where no function applies."""
    N, F = rewards_per_func.shape
    r = rewards_per_func.double().view(-1, group_size, F)
    mean, std = _nan_mean_std(r, dim=1)  # (B, 1, F)
    std = torch.nan_to_num(std, nan=0.0)
    per_func = ((r - mean) / (std + eps)).view(N, F)
    s = torch.nansum(per_func * reward_weights.double()[None], dim=1)
    return torch.where(torch.isnan(rewards_per_func).all(dim=1), float("nan"), s)


def multi_objective_advantages(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    group_size: int,
    *,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
    estimator: str = "grpo",
    eps: float = 1e-4,
    completion_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N,) advantages from (N, F) rewards of F functions (NaN: the function does not apply
    to that completion) and their (F,) weights, as TRL computes them.

    ``sum_then_normalize``: the weighted sum of each row (``weighted_sum``), then
    ``group_advantages`` with ``scale_rewards``, ``estimator`` and ``completion_lengths``
    (the (N,) token counts, which ``reinforce_plus_plus_baseline`` needs).
    ``normalize_then_sum`` (GDPO, arXiv:2601.05242): each function normalised within each
    group, ``(r_k - mean_k) / (std_k + eps)``, then the weighted sum, then normalised over
    the whole batch, ``(s - mean) / (std + eps)``; ``scale_rewards`` does not apply (as TRL),
    and only the grpo estimator. Stds are unbiased, NaN-aware; rows no function applies to
    get 0."""
    if multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
        raise ValueError(
            f"multi_objective_aggregation must be one of {MULTI_OBJECTIVE_AGGREGATIONS}, "
            f"got {multi_objective_aggregation!r}"
        )
    if rewards_per_func.dim() != 2 or reward_weights.shape != rewards_per_func.shape[1:]:
        raise ValueError(
            f"rewards_per_func must be (N, F) and reward_weights (F,), got "
            f"{tuple(rewards_per_func.shape)} and {tuple(reward_weights.shape)}"
        )
    if multi_objective_aggregation == "sum_then_normalize":
        total = weighted_sum(rewards_per_func, reward_weights)
        return group_advantages(
            total, group_size, scale_rewards, eps,
            estimator=estimator, completion_lengths=completion_lengths,
        )  # fmt: skip
    if estimator != "grpo":
        raise ValueError("normalize_then_sum uses the group mean baseline (estimator grpo)")
    N, F = rewards_per_func.shape
    if N % group_size:
        raise ValueError(f"{N} rows are not a multiple of group_size={group_size}")
    s = _normalized_sum(rewards_per_func, reward_weights, group_size, eps)
    bmean, bstd = _nan_mean_std(s, dim=None)
    adv = (s - bmean) / (torch.nan_to_num(bstd, nan=0.0) + eps)
    out_dtype = rewards_per_func.dtype if rewards_per_func.is_floating_point() else torch.float32
    return torch.nan_to_num(adv, nan=0.0).to(out_dtype)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) bool: groups whose scored rewards are not all equal (DAPO's dynamic sampling
    keeps only these; a group with fewer than two scored completions is not informative)."""
    r = rewards.double().view(-1, group_size)
    valid = ~torch.isnan(r)
    hi = torch.where(valid, r, torch.full_like(r, -math.inf)).max(dim=1).values
    lo = torch.where(valid, r, torch.full_like(r, math.inf)).min(dim=1).values
    return (valid.sum(dim=1) >= 2) & (hi > lo)
