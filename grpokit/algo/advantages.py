"""Group-relative advantages (GRPO, Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

Layout: the G completions of one prompt are contiguous, so ``rewards`` of shape (B*G,)
groups as ``rewards.view(B, G)``.
"""

from __future__ import annotations

import torch

from grpokit.algo.variants import SCALE_REWARDS


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
) -> torch.Tensor:
    """Advantages ``(r - group mean) / (std + eps)``.

    Args:
        rewards: (B*G,) total reward per completion; NaN marks a completion that no
            reward function applied to: it is left out of the statistics and gets 0.
        group_size: G, the completions per prompt.
        scale_rewards: ``"group"`` divides by the group's unbiased std (GRPO);
            ``"batch"`` by the unbiased std of the whole batch (Hu et al., REINFORCE++ /
            TRL's "batch"); ``"none"`` does not divide (Dr. GRPO, Liu et al. 2025,
            arXiv:2503.20783).
        eps: added to the std.

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
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    # float64 statistics: with large rewards and a small spread (e.g. 349295, 349293,
    # 349284) float32 loses the differences to rounding and the group no longer sums to 0
    rewards = rewards.double()
    r = rewards.view(-1, group_size)  # (B, G)
    mean, std = _nan_mean_std(r, dim=1)  # (B, 1)
    adv = r - mean
    if scale_rewards == "group":
        adv = adv / (torch.nan_to_num(std, nan=0.0) + eps)
    elif scale_rewards == "batch":
        _, bstd = _nan_mean_std(rewards, dim=None)
        adv = adv / (torch.nan_to_num(bstd, nan=0.0) + eps)
    return torch.nan_to_num(adv.reshape(-1), nan=0.0).to(out_dtype)


def group_reward_stats(rewards: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """Per-batch statistics of the groups: mean within-group std, and the fraction of
    groups whose rewards are all equal (they carry no learning signal)."""
    r = rewards.view(-1, group_size)
    _, std = _nan_mean_std(r, dim=1)
    std = torch.nan_to_num(std.squeeze(1), nan=0.0)
    return {"reward_std": std.mean(), "frac_reward_zero_std": (std < 1e-6).float().mean()}
