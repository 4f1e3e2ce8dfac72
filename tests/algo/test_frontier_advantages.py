"""RLOO's leave-one-out baseline, the two multi-objective aggregations (GDPO), the groups
dynamic sampling keeps, and the entropy bonus with its adaptive coefficient."""

import math
import statistics

import pytest
import torch

from grpokit.algo import (
    AdaptiveEntropy,
    entropy_bonus,
    group_advantages,
    informative_groups,
    micro_batch_weights,
    multi_objective_advantages,
)

NAN = float("nan")


def test_rloo_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    adv = group_advantages(r, 3, "none", estimator="rloo")
    # 1 - mean(0, 0), 0 - mean(1, 0), ...; 1 - mean(2, 2), 2 - mean(1, 2)
    expected = [1.0, -0.5, -0.5, -1.0, 0.5, 0.5]
    assert adv.tolist() == pytest.approx(expected)


def test_rloo_leaves_out_unscored_completions_and_scales():
    r = torch.tensor([1.0, NAN, 3.0, 0.0, NAN, NAN, NAN, 4.0])
    adv = group_advantages(r, 4, "none", estimator="rloo")
    # group 1: each scored one minus the mean of the other two scored; group 2: one scored
    assert adv.tolist() == pytest.approx([1.0 - 1.5, 0.0, 3.0 - 0.5, 0.0 - 2.0, 0, 0, 0, 0])
    g = torch.tensor([1.0, 0.0, 0.0, 1.0])
    std = statistics.stdev([1.0, 0.0, 0.0, 1.0])
    a = group_advantages(g, 4, "group", estimator="rloo")
    assert a[0].item() == pytest.approx((1 - 1 / 3) / (std + 1e-4), rel=1e-6)


def test_rloo_against_naive_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(24, generator=g, dtype=torch.float64)
    adv = group_advantages(r, 6, "none", estimator="rloo")
    rows = r.view(4, 6).tolist()
    naive = [x - (sum(row) - x) / 5 for row in rows for x in row]
    assert adv.tolist() == pytest.approx(naive, rel=1e-12)


def _nanstd(xs):
    v = [x for x in xs if not math.isnan(x)]
    return statistics.stdev(v) if len(v) > 1 else math.nan


def _naive_normalize_then_sum(rows, weights, G, eps=1e-4):
    N, F = len(rows), len(weights)
    per = [[0.0] * F for _ in range(N)]
    for b in range(0, N, G):
        for k in range(F):
            col = [rows[i][k] for i in range(b, b + G)]
            vals = [x for x in col if not math.isnan(x)]
            m = sum(vals) / len(vals) if vals else math.nan
            s = _nanstd(col)
            s = 0.0 if math.isnan(s) else s
            for i in range(b, b + G):
                per[i][k] = (rows[i][k] - m) / (s + eps)
    sums = []
    for i in range(N):
        terms = [per[i][k] * weights[k] for k in range(F) if not math.isnan(per[i][k])]
        sums.append(math.nan if all(math.isnan(x) for x in rows[i]) else sum(terms))
    valid = [s for s in sums if not math.isnan(s)]
    mean, std = sum(valid) / len(valid), statistics.stdev(valid)
    return [0.0 if math.isnan(s) else (s - mean) / (std + eps) for s in sums]


def test_normalize_then_sum_against_naive_loop():
    rows = [
        [1.0, 0.0, 0.5],
        [0.0, NAN, 0.2],
        [1.0, 1.0, NAN],
        [0.0, 1.0, 0.9],
        [NAN, NAN, NAN],
        [2.0, 0.0, 0.1],
        [2.0, 1.0, 0.4],
        [2.0, 0.0, 0.3],
    ]
    w = [1.0, 0.5, 2.0]
    adv = multi_objective_advantages(
        torch.tensor(rows), torch.tensor(w), 4, multi_objective_aggregation="normalize_then_sum"
    )
    expected = _naive_normalize_then_sum(rows, w, 4)
    assert adv.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert adv[4].item() == 0.0  # no function applied


def test_normalize_then_sum_by_hand():
    # one group of two, two functions: each normalised within the group to +-a and +-b,
    # summed to +-(a + b), then normalised over the batch (std of +-x is x sqrt 2)
    rows = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    adv = multi_objective_advantages(
        rows, torch.ones(2), 2, multi_objective_aggregation="normalize_then_sum"
    )
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    b = 1.0 / (math.sqrt(2.0) + 1e-4)
    x = (a + b) / (math.sqrt(2) * (a + b) + 1e-4)
    assert adv.tolist() == pytest.approx([x, -x], rel=1e-6)


def test_sum_then_normalize_is_the_weighted_sum_then_group_advantages():
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(12, 3, generator=g)
    rows[2, 1] = NAN
    rows[5] = NAN
    w = torch.tensor([1.0, 0.5, -2.0])
    total = torch.nansum(rows * w, dim=1)
    total[5] = NAN
    for scale in ("group", "batch", "none"):
        for est in ("grpo", "rloo"):
            a = multi_objective_advantages(rows, w, 4, scale_rewards=scale, estimator=est)
            b = group_advantages(total, 4, scale, estimator=est)
            assert torch.equal(a, b), (scale, est)


def test_multi_objective_errors():
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        multi_objective_advantages(
            torch.ones(2, 1), torch.ones(1), 2, multi_objective_aggregation="x"
        )
    with pytest.raises(ValueError, match="reward_weights"):
        multi_objective_advantages(torch.ones(2, 2), torch.ones(3), 2)
    with pytest.raises(ValueError, match="estimator"):
        group_advantages(torch.ones(2), 2, estimator="ppo")


def test_informative_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.3, 0.3, NAN, 0.7, NAN, NAN, 0.3, 0.5])
    assert informative_groups(r, 2).tolist() == [False, False, False, False, False, True]


# ----------------------------------------------------------------- the entropy bonus
def test_entropy_bonus_is_the_micro_batch_mean_for_every_loss_type():
    """The bonus is the mean entropy of the micro-batch's counted tokens over the step's
    micro-batches, whatever the loss type (dapo included: not the entropy sum over the
    batch's token count, which TRL used before huggingface/trl#6648)."""
    ent = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    term, s, n = entropy_bonus(ent, mask)  # takes no loss type: one formula for all
    assert term.item() == pytest.approx(2.0) and s.item() == 6.0 and n.item() == 3.0
    term, _, _ = entropy_bonus(ent, mask, num_micro_batches=4)
    assert term.item() == pytest.approx(2.0 / 4)  # the micro-batch mean / micro-batches
    term.backward()
    assert ent.grad.flatten().tolist() == pytest.approx([1 / 12, 1 / 12, 0, 1 / 12, 0, 0])
    term, s, n = entropy_bonus(ent, mask, top_entropy_quantile=0.5)
    assert (s.item(), n.item()) == (5.0, 2.0)  # median of 1, 2, 3 is 2: 2 and 3 are kept
    assert term.item() == pytest.approx(2.5)
    term, _, _ = entropy_bonus(ent, mask, top_entropy_quantile=0.5)
    assert term.item() == pytest.approx(2.5)  # the kept tokens' mean, not their sum / 3


def test_entropy_bonus_of_uneven_micro_batches():
    """Two micro-batches of 1 and 3 tokens (entropies 4 | 1, 1, 1): each adds its own mean
    / 2, so the step's bonus is (4 + 1) / 2 = 2.5, not the token mean 7 / 4."""
    a = torch.tensor([[4.0, 0.0, 0.0]])
    b = torch.tensor([[1.0, 1.0, 1.0]])
    ma, mb = torch.tensor([[1.0, 0.0, 0.0]]), torch.ones(1, 3)
    ta, _, _ = entropy_bonus(a, ma, num_micro_batches=2)
    tb, _, _ = entropy_bonus(b, mb, num_micro_batches=2)
    assert ta.item() + tb.item() == pytest.approx(2.5)


def test_entropy_bonus_is_the_same_over_any_partition_into_forwards():
    """With ``micro_batch_weights`` the bonus of the step's rows is the mean of the means of
    its consecutive runs of ``micro_batch_rows`` rows (TRL's micro-batches), however the rows
    are cut into forwards: one forward per micro-batch (the per-forward formula), all rows at
    once, or a reordered split across micro-batches."""
    g = torch.Generator().manual_seed(3)
    ent = torch.rand(7, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(7, 5, generator=g) > 0.3).double()
    mask[5:] = 0.0
    mask[5, 0] = 1.0  # row 5: one token, row 6: none
    rows, n_mb = 3, 3  # micro-batches [0, 1, 2], [3, 4, 5], [6] (mean 0, as TRL's would be)
    means = []
    for s in range(0, 7, rows):
        m = mask[s : s + rows]
        means.append((ent[s : s + rows] * m).sum() / m.sum().clamp(min=1.0))
    want = sum(means) / n_mb
    per_forward = sum(
        entropy_bonus(ent[s : s + rows], mask[s : s + rows], num_micro_batches=n_mb)[0]
        for s in range(0, 7, rows)
    )
    assert per_forward.item() == pytest.approx(want.item(), rel=1e-12)
    w = micro_batch_weights(mask, rows, n_mb)
    for split in ([list(range(7))], [[6, 0, 3], [5, 1], [2, 4]], [[i] for i in range(7)]):
        got = sum(entropy_bonus(ent[i], mask[i], row_weights=w[i])[0] for i in split)
        assert got.item() == pytest.approx(want.item(), rel=1e-12), split
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        entropy_bonus(ent, mask, top_entropy_quantile=0.5, row_weights=w)


def test_adaptive_entropy_controller():
    c = AdaptiveEntropy(0.01, adaptive=True, coef_min=0.0, coef_max=0.015, delta=0.004, target=1.0)
    assert c.applied() == 0.0  # no entropy measured yet (TRL: infinite)
    c.update(0.5)  # below target: up, and applied
    assert c.coef == pytest.approx(0.014) and c.applied() == pytest.approx(0.014)
    c.update(0.5)
    assert c.coef == pytest.approx(0.015)  # capped at coef_max
    c.update(2.0)  # above target: down, and not applied
    assert c.coef == pytest.approx(0.011) and c.applied() == 0.0
    state = c.state_dict()
    d = AdaptiveEntropy(0.5, adaptive=True)
    d.load_state_dict(state)
    assert d.coef == c.coef and d.last_entropy == 2.0
    fixed = AdaptiveEntropy(0.02)
    fixed.update(0.0)
    assert fixed.applied() == 0.02 and fixed.enabled and not AdaptiveEntropy(0.0).enabled
