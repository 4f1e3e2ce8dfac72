import pytest
import torch

from grpokit.algo import group_advantages
from grpokit.algo.advantages import reward_spread_stats


def test_seed_tutorial_example():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    adv = group_advantages(r, 3)
    # group std (unbiased) is 1.0, so (r - mean) / (1 + 1e-4)
    expected = torch.tensor([-1.0, 0.0, 1.0, -1.0, 0.0, 1.0]) / (1.0 + 1e-4)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0, 1, -1, 0, 1]), atol=1e-3, rtol=0)


def test_constant_rewards_zero_advantage():
    for scale in ("group", "batch", "none"):
        adv = group_advantages(torch.full((8,), 0.7), 4, scale_rewards=scale)
        assert torch.equal(adv, torch.zeros(8))


def test_none_does_not_divide():
    r = torch.tensor([0.0, 2.0, 10.0, 30.0])
    torch.testing.assert_close(
        group_advantages(r, 2, "none"), torch.tensor([-1.0, 1.0, -10.0, 10.0])
    )


def test_batch_uses_whole_batch_std():
    r = torch.tensor([0.0, 2.0, 10.0, 30.0])
    std = r.std()  # unbiased over all 4
    expected = torch.tensor([-1.0, 1.0, -10.0, 10.0]) / (std + 1e-4)
    torch.testing.assert_close(group_advantages(r, 2, "batch"), expected)


def test_nan_rows_left_out_and_zero():
    r = torch.tensor([1.0, float("nan"), 3.0, 5.0])
    adv = group_advantages(r, 4)
    # stats over [1, 3, 5]: mean 3, std 2
    expected = torch.tensor([-2.0, 0.0, 0.0, 2.0]) / (2.0 + 1e-4)
    torch.testing.assert_close(adv, expected)
    # a group with only one valid value: no spread, advantage 0
    adv = group_advantages(torch.tensor([float("nan"), 2.0]), 2)
    assert torch.equal(adv, torch.zeros(2))


def test_against_naive_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(6 * 5, generator=g)
    adv = group_advantages(r, 5)
    for b in range(6):
        grp = [float(x) for x in r[b * 5 : (b + 1) * 5]]
        m = sum(grp) / 5
        s = (sum((x - m) ** 2 for x in grp) / 4) ** 0.5
        for j, x in enumerate(grp):
            assert abs(adv[b * 5 + j].item() - (x - m) / (s + 1e-4)) < 1e-5


def test_bad_shapes():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(torch.zeros(4), 2, "median")


def _trl_nanstd(x, dim=None):
    """TRL's ``nanstd`` (trl/trainer/utils.py): unbiased, NaN entries left out."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim)
    count = torch.sum(~torch.isnan(x), dim=dim)
    return torch.sqrt(var * count / (count - 1))


def _trl_spread(rpf, w, G, scale, agg):
    """TRL 1.16's reward_std / frac_reward_zero_std, written from _generate_and_score_completions."""
    unscorable = torch.isnan(rpf).all(dim=1)
    rewards = (rpf * w[None]).nansum(dim=1)
    rewards[unscorable] = torch.nan
    if agg == "normalize_then_sum":
        g = rpf.view(-1, G, rpf.shape[1])
        rk = (g - torch.nanmean(g, dim=1, keepdim=True)) / (
            _trl_nanstd(g, dim=1).unsqueeze(1) + 1e-4
        )
        s = (rk.view(-1, rpf.shape[1]) * w[None]).nansum(dim=1)
        s[unscorable] = torch.nan
        std = _trl_nanstd(s).expand_as(s)
    elif scale == "batch":
        std = _trl_nanstd(rewards).expand_as(rewards)
    else:
        std = _trl_nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
    zero = torch.isclose(std, torch.zeros_like(std)).float().mean()
    return _trl_nanstd(rewards), zero


@pytest.mark.parametrize(
    "scale,agg",
    [("group", "sum_then_normalize"), ("none", "sum_then_normalize"),
     ("batch", "sum_then_normalize"), ("group", "normalize_then_sum")],
)  # fmt: skip
def test_reward_spread_matches_trl(scale, agg):
    """reward_std is the batch's std (not a mean of group stds); frac_reward_zero_std counts
    groups with equal rewards (group, none) or is the batch's 0/1 (batch, normalize_then_sum);
    a group with one scored completion (NaN std) is not zero."""
    torch.manual_seed(0)
    G = 4
    rpf = torch.randint(0, 3, (16, 2)).float()
    rpf[0:4] = torch.tensor([1.0, 0.5])  # a group with equal rewards
    rpf[4:8, 0] = float("nan")  # function 0 does not apply to group 1
    rpf[8:11] = float("nan")  # group 2: one scored completion
    w = torch.tensor([1.0, 0.5])
    st = reward_spread_stats(rpf, w, G, scale_rewards=scale, multi_objective_aggregation=agg)
    ref_std, ref_zero = _trl_spread(rpf, w, G, scale, agg)
    torch.testing.assert_close(st["reward_std"].float(), ref_std, rtol=1e-6, atol=1e-7)
    assert st["frac_reward_zero_std"].item() == ref_zero.item()
    if scale in ("group", "none") and agg == "sum_then_normalize":
        assert ref_zero.item() == 0.25  # group 0 only; group 2's NaN std is not zero


def test_reward_spread_all_equal_batch():
    rpf = torch.ones(8, 1)
    for scale in ("group", "batch"):
        st = reward_spread_stats(rpf, torch.ones(1), 4, scale_rewards=scale)
        assert st["frac_reward_zero_std"].item() == 1.0 and st["reward_std"].item() == 0.0
