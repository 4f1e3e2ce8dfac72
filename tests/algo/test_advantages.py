import pytest
import torch

from grpokit.algo import group_advantages
from grpokit.algo.advantages import group_reward_stats


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


def test_group_stats():
    st = group_reward_stats(torch.tensor([1.0, 1.0, 0.0, 2.0]), 2)
    assert st["frac_reward_zero_std"].item() == 0.5
    torch.testing.assert_close(st["reward_std"], torch.tensor(2**0.5 / 2))
