import math

import pytest
import torch

from grpokit.algo import policy_loss

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def _zeros():
    return torch.zeros(2, 3)


@pytest.mark.parametrize(
    "loss_type,kwargs,expected",
    [
        ("grpo", {}, -1.5),  # (mean(-1,-1) + mean(-2)) / 2
        ("bnpo", {}, -4 / 3),  # (-1 - 1 - 2) / 3 tokens
        ("dr_grpo", {}, -4 / 6),  # sum / (2 sequences * T=3)
        ("dr_grpo", {"max_completion_length": 4}, -0.5),  # sum / (2 * 4)
        ("dapo", {}, -4 / 3),
        ("dapo", {"num_tokens": 8}, -0.5),
        ("grpo", {"num_sequences": 6}, -3 / 6),
    ],
)
def test_hand_computed_aggregation(loss_type, kwargs, expected):
    loss, m = policy_loss(
        _zeros(), None, None, torch.tensor([1.0, 2.0]), MASK, loss_type=loss_type, **kwargs
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["clip_ratio/region_mean"].item() == 0.0


@pytest.mark.parametrize(
    "ratio,adv,eps_hi,expected_loss,low,high",
    [
        (1.5, 1.0, None, -1.2, 0.0, 1.0),  # clipped above, positive advantage
        (1.5, -1.0, None, 1.5, 0.0, 0.0),  # not clipped: min picks the unclipped term
        (0.5, -1.0, None, 0.8, 1.0, 0.0),  # clipped below, negative advantage
        (0.5, 1.0, None, -0.5, 0.0, 0.0),
        (1.25, 1.0, 0.28, -1.25, 0.0, 0.0),  # clip-higher lets it through
    ],
)
def test_clipping(ratio, adv, eps_hi, expected_loss, low, high):
    logp = torch.tensor([[math.log(ratio)]])
    old = torch.zeros(1, 1)
    loss, m = policy_loss(
        logp,
        old,
        None,
        torch.tensor([adv]),
        torch.ones(1, 1),
        loss_type="grpo",
        epsilon_low=0.2,
        epsilon_high=eps_hi,
    )
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert m["clip_ratio/low_mean"].item() == low
    assert m["clip_ratio/high_mean"].item() == high
    assert m["clip_ratio/region_mean"].item() == low + high


def test_kl_k3_value_and_zero_at_reference():
    logp = torch.tensor([[math.log(0.5)]])
    loss, m = policy_loss(logp, None, torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), beta=0.1)
    k3 = 2.0 - math.log(2.0) - 1.0
    assert m["kl"].item() == pytest.approx(k3, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * k3, abs=1e-6)
    same = torch.randn(3, 4)
    _, m = policy_loss(same, None, same.clone(), torch.randn(3), torch.ones(3, 4), beta=0.04)
    assert m["kl"].item() == 0.0


def _naive(logp, old, ref, adv, mask, loss_type, eps_lo, eps_hi, beta, L):
    """Per-sequence python loop, the definition written out."""
    total, tokens, seqs, seq_means = 0.0, 0.0, 0, []
    for i in range(len(logp)):
        s = 0.0
        n = 0
        for t in range(len(logp[i])):
            if mask[i][t] == 0:
                continue
            r = math.exp(logp[i][t] - old[i][t])
            c = min(max(r, 1 - eps_lo), 1 + eps_hi)
            term = -min(r * adv[i], c * adv[i])
            d = ref[i][t] - logp[i][t]
            term += beta * (math.exp(d) - d - 1)
            s += term
            n += 1
        total += s
        tokens += n
        seqs += 1
        seq_means.append(s / max(n, 1))
    if loss_type == "grpo":
        return sum(seq_means) / seqs
    if loss_type in ("bnpo", "dapo"):
        return total / tokens
    return total / (seqs * L)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_vectorised_equals_naive_loop(loss_type):  # the newer types: test_frontier_losses.py
    g = torch.Generator().manual_seed(3)
    N, T = 5, 6
    logp = -torch.rand(N, T, generator=g) * 3
    old = logp + torch.randn(N, T, generator=g) * 0.3
    ref = logp + torch.randn(N, T, generator=g) * 0.3
    adv = torch.randn(N, generator=g)
    lengths = torch.tensor([6, 1, 3, 4, 2])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    loss, _ = policy_loss(
        logp,
        old,
        ref,
        adv,
        mask,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        beta=0.04,
        max_completion_length=8,
    )
    expected = _naive(
        logp.tolist(),
        old.tolist(),
        ref.tolist(),
        adv.tolist(),
        mask.tolist(),
        loss_type,
        0.2,
        0.28,
        0.04,
        8,
    )
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo", "grpo"])
def test_micro_batch_invariance(loss_type):
    g = torch.Generator().manual_seed(4)
    N, T = 8, 5
    logp = (-torch.rand(N, T, generator=g)).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(N, T, generator=g)
    ref = logp.detach() + 0.1 * torch.randn(N, T, generator=g)
    adv = torch.randn(N, generator=g)
    mask = (torch.rand(N, T, generator=g) > 0.3).float()
    mask[:, 0] = 1
    kw = dict(loss_type=loss_type, beta=0.04, max_completion_length=T)
    full, _ = policy_loss(logp, old, ref, adv, mask, **kw)
    full.backward()
    g_full = logp.grad.clone()
    logp.grad = None
    parts = 0.0
    for sl in (slice(0, 3), slice(3, 4), slice(4, 8)):
        part, _ = policy_loss(
            logp[sl],
            old[sl],
            ref[sl],
            adv[sl],
            mask[sl],
            num_sequences=N,
            num_tokens=mask.sum().item(),
            **kw,
        )
        part.backward()
        parts += part.item()
    assert parts == pytest.approx(full.item(), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(logp.grad, g_full)


def test_reinforce_gradient_when_on_policy_without_kl():
    g = torch.Generator().manual_seed(5)
    N, T = 4, 3
    logp = (-torch.rand(N, T, generator=g)).requires_grad_()
    adv = torch.tensor([1.0, -0.5, 2.0, 0.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]).float()
    loss, _ = policy_loss(logp, None, None, adv, mask, loss_type="grpo", beta=0.0)
    loss.backward()
    # REINFORCE with baseline: -(1/N) sum_i A_i / |o_i| sum_t grad logp_it
    expected = -(adv[:, None] * mask / mask.sum(-1, keepdim=True)) / N
    torch.testing.assert_close(logp.grad, expected)


def test_gspo_sequence_ratio():
    logp = torch.tensor([[0.1, 0.3, 5.0]])
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = policy_loss(
        logp,
        old,
        None,
        torch.tensor([1.0]),
        mask,
        loss_type="grpo",
        epsilon_low=1.0,
        epsilon_high=1.0,
        importance_sampling_level="sequence",
    )
    assert loss.item() == pytest.approx(-math.exp(0.2), abs=1e-6)


def test_entropy_metric_and_errors():
    ent = torch.tensor([[1.0, 3.0, 100.0]])
    _, m = policy_loss(
        torch.zeros(1, 3), None, None, torch.ones(1), torch.tensor([[1.0, 1.0, 0.0]]), entropy=ent
    )
    assert m["entropy"].item() == 2.0
    with pytest.raises(ValueError, match="loss_type"):
        policy_loss(torch.zeros(1, 1), None, None, torch.ones(1), torch.ones(1, 1), loss_type="ppo")
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(torch.zeros(1, 1), None, None, torch.ones(1), torch.ones(1, 1), beta=0.1)
