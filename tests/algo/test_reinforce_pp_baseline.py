"""REINFORCE++ with a group baseline (arXiv:2501.03262; verl's reinforce_plus_plus_baseline):
the group mean subtracted, then whitened over every completion token of the batch."""

import math

import pytest
import torch

from grpokit.algo import group_advantages, multi_objective_advantages

NAN = float("nan")
EST = "reinforce_plus_plus_baseline"


def rfpp(rewards, group_size, lengths, **kw):
    return group_advantages(
        torch.as_tensor(rewards), group_size, "batch", estimator=EST,
        completion_lengths=torch.as_tensor(lengths), **kw,
    )  # fmt: skip


def test_by_hand_with_different_lengths():
    # groups (1, 0) and (0, 2): centred 0.5, -0.5, -1, 1; lengths 1, 3, 2, 2 (8 tokens)
    adv = rfpp([1.0, 0.0, 0.0, 2.0], 2, [1, 3, 2, 2])
    mu = (1 * 0.5 + 3 * -0.5 + 2 * -1.0 + 2 * 1.0) / 8  # -0.125: token-weighted
    dev = [0.625, -0.375, -0.875, 1.125]
    var = (1 * dev[0] ** 2 + 3 * dev[1] ** 2 + 2 * dev[2] ** 2 + 2 * dev[3] ** 2) / 7  # 4.875 / 7
    assert mu == -0.125 and var == pytest.approx(4.875 / 7)
    expected = [d / math.sqrt(var + 1e-8) for d in dev]
    assert adv.tolist() == pytest.approx(expected, rel=1e-7)
    # the mean is not added back: the token-weighted mean of the result is 0
    assert float((adv.double() * torch.tensor([1.0, 3, 2, 2])).sum()) == pytest.approx(0, abs=1e-6)


def test_a_group_of_one_keeps_its_raw_reward():
    # no baseline (verl: the mean of a group of one is 0), then whitened over 4 tokens
    adv = rfpp([1.0, 0.0, 2.0], 1, [1, 1, 2])
    mu = (1.0 + 0.0 + 2 * 2.0) / 4  # 1.25
    dev = [1.0 - mu, 0.0 - mu, 2.0 - mu]
    var = (dev[0] ** 2 + dev[1] ** 2 + 2 * dev[2] ** 2) / 3
    assert adv.tolist() == pytest.approx([d / math.sqrt(var + 1e-8) for d in dev], rel=1e-7)


def test_lengths_change_the_result_and_a_mask_works_as_lengths():
    r = [1.0, 0.0, 0.0, 2.0, 3.0, 1.0]
    a = rfpp(r, 2, [1, 1, 1, 1, 1, 1])
    b = rfpp(r, 2, [5, 1, 1, 1, 1, 1])
    assert not torch.allclose(a, b)
    lengths = torch.tensor([3, 1, 4, 2, 0, 2])
    mask = (torch.arange(5)[None] < lengths[:, None]).long()
    assert torch.equal(rfpp(r, 2, lengths), rfpp(r, 2, mask))


def _verl_like(rewards, lengths, G, T):
    """A naive twin of whitening the token-level tensor as verl does: each completion's
    centred score broadcast over its valid tokens, mean and Bessel-corrected variance over
    every valid token of the batch, 1e-8 inside the inverse square root, the mean not added
    back; per completion, the value on its tokens."""
    N = len(rewards)
    score = []
    for b in range(0, N, G):
        group = rewards[b : b + G]
        base = 0.0 if G == 1 else sum(group) / G
        score += [x - base for x in group]
    tokens = [[score[i] if t < lengths[i] else 0.0 for t in range(T)] for i in range(N)]
    mask = [[1.0 if t < lengths[i] else 0.0 for t in range(T)] for i in range(N)]
    n = sum(sum(row) for row in mask)
    mean = sum(v * m for rv, rm in zip(tokens, mask) for v, m in zip(rv, rm)) / n
    sq = sum((v - mean) ** 2 * m for rv, rm in zip(tokens, mask) for v, m in zip(rv, rm))
    var = sq / n * n / (n - 1)
    white = [[(v - mean) / math.sqrt(var + 1e-8) * m for v, m in zip(rv, rm)] for rv, rm in
             zip(tokens, mask)]  # fmt: skip
    return [row[0] if lengths[i] else 0.0 for i, row in enumerate(white)], white


@pytest.mark.parametrize("G", [1, 2, 4])
def test_against_a_naive_token_level_twin(G):
    g = torch.Generator().manual_seed(G)
    N, T = 12, 9
    r = torch.randn(N, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    lengths[0] = 0  # a completion with no tokens: left out of the statistics, advantage 0
    adv = rfpp(r, G, lengths)
    expected, white = _verl_like(r.tolist(), lengths.tolist(), G, T)
    assert adv.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert adv[0].item() == 0.0
    # broadcast back over the tokens it is the twin's whole token tensor
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    torch.testing.assert_close(adv[:, None] * mask, torch.tensor(white, dtype=torch.float64))


def test_float32_in_float32_out_and_finite():
    adv = rfpp(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2, torch.tensor([2, 3, 4, 1]))
    assert adv.dtype == torch.float32 and torch.isfinite(adv).all()


def test_equal_rewards_and_degenerate_batches_give_zeros():
    assert rfpp([1.0, 1.0, 2.0, 2.0], 2, [3, 1, 2, 5]).tolist() == [0.0] * 4
    assert rfpp([1.0, 1.0, 1.0], 1, [3, 1, 2]).tolist() == [0.0] * 3
    assert rfpp([1.0, 0.0], 2, [0, 1]).tolist() == [0.0, 0.0]  # one token: no variance
    assert rfpp([1.0, 0.0], 2, [0, 0]).tolist() == [0.0, 0.0]  # all masked out


def test_unscored_completions_are_left_out():
    # NaN: no reward function applied; out of the group mean and of the whitening, gets 0
    adv = rfpp([1.0, NAN, 0.0, 0.0, 2.0, 4.0], 3, [2, 7, 1, 3, 1, 2])
    # = the centred scores (group means 0.5 and 2) whitened with the unscored one's tokens out
    centred = [1.0 - 0.5, 0.0, 0.0 - 0.5, 0.0 - 2.0, 2.0 - 2.0, 4.0 - 2.0]
    expected, _ = _verl_like(centred, [2, 0, 1, 3, 1, 2], 1, 8)
    assert adv[1].item() == 0.0
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_errors():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="pass completion_lengths"):
        group_advantages(r, 2, "batch", estimator=EST)
    with pytest.raises(ValueError, match="scale_rewards='batch'"):
        group_advantages(r, 2, estimator=EST, completion_lengths=torch.ones(4))
    with pytest.raises(ValueError, match=r"completion_lengths must be \(4,\)"):
        group_advantages(r, 2, "batch", estimator=EST, completion_lengths=torch.ones(3))
    with pytest.raises(ValueError, match=">= 0"):
        group_advantages(r, 2, "batch", estimator=EST, completion_lengths=-torch.ones(4))
    with pytest.raises(ValueError, match="normalize_then_sum"):
        multi_objective_advantages(
            r[:, None], torch.ones(1), 2, multi_objective_aggregation="normalize_then_sum",
            estimator=EST, completion_lengths=torch.ones(4),
        )  # fmt: skip


def test_multi_objective_sum_then_normalize_passes_the_lengths():
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(8, 2, generator=g)
    w = torch.tensor([1.0, 0.5])
    lengths = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    a = multi_objective_advantages(
        rows, w, 4, scale_rewards="batch", estimator=EST, completion_lengths=lengths
    )
    b = rfpp(rows @ w, 4, lengths)
    torch.testing.assert_close(a, b)


def test_other_estimators_ignore_the_lengths():
    r = torch.tensor([1.0, 0.0, 0.5, 2.0])
    for est in ("grpo", "rloo"):
        a = group_advantages(r, 2, estimator=est)
        b = group_advantages(r, 2, estimator=est, completion_lengths=torch.tensor([1, 5, 2, 9]))
        assert torch.equal(a, b)


def test_round_advantages_gathers_the_lengths_of_the_same_rows(monkeypatch):
    """Two processes simulated: each gathers every process's rewards and loss-token counts
    in rank order, whitens over all of them, and keeps its own rows."""
    from types import SimpleNamespace

    from grpokit import scoring

    g = torch.Generator().manual_seed(5)
    rewards = [torch.randn(4, 2, generator=g), torch.randn(4, 2, generator=g)]  # (N, F) a rank
    lengths = [torch.tensor([3, 1, 4, 1]), torch.tensor([5, 9, 2, 6])]
    w = torch.tensor([1.0, 2.0])
    cfg = SimpleNamespace(
        num_generations=2, scale_rewards_mode="batch", advantage_estimator=EST,
        multi_objective_aggregation="sum_then_normalize",
    )  # fmt: skip
    expected = rfpp(torch.cat(rewards) @ w, 2, torch.cat(lengths))
    parts = {}
    for r in (0, 1):

        def gather(t):  # every rank's tensor of the same kind, in rank order
            return torch.cat(rewards if t.dim() == 2 else lengths)

        monkeypatch.setattr(scoring.dist, "all_gather_cat", gather)
        monkeypatch.setattr(scoring.dist, "rank", lambda r=r: r)
        _, _, parts[r] = scoring.round_advantages(rewards[r], w, cfg, "cpu", lengths=lengths[r])
    torch.testing.assert_close(torch.cat([parts[0], parts[1]]), expected)
    with pytest.raises(ValueError, match="needs the lengths"):
        scoring.round_advantages(rewards[0], w, cfg, "cpu")
