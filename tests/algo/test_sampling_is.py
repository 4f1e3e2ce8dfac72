"""Importance-sampling correction for tokens sampled by another engine (vLLM): the weights
pi_trainer / pi_engine, their cap or mask, and how they enter the loss."""

import math

import pytest
import torch

from grpokit.algo import policy_loss, sampling_is_weights


def _logps():
    # two rows, three token slots; row 1 has two tokens
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, 0.0]])
    engine = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return trainer, engine, mask


def test_token_truncate_by_hand():
    t, e, m = _logps()
    w, met = sampling_is_weights(t, e, m, mode="token_truncate", cap=1.5)
    # ratios: e^0.5=1.6487 -> capped 1.5, e^-1, 1 ; 1, e^-2.5, (pad)
    expected = torch.tensor([[1.5, math.exp(-1.0), 1.0], [1.0, math.exp(-2.5), 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    assert met["sampling/is_capped_frac"].item() == pytest.approx(1 / 5)
    assert met["sampling/logp_abs_diff_mean"].item() == pytest.approx((0.5 + 1 + 0 + 0 + 2.5) / 5)
    assert met["sampling/logp_abs_diff_max"].item() == pytest.approx(2.5)
    raw = [math.exp(0.5), math.exp(-1.0), 1.0, 1.0, math.exp(-2.5)]
    assert met["sampling/is_ratio_mean"].item() == pytest.approx(sum(raw) / 5, rel=1e-6)
    assert met["sampling/is_ratio_max"].item() == pytest.approx(math.exp(0.5), rel=1e-6)
    assert met["sampling/is_ratio_min"].item() == pytest.approx(math.exp(-2.5), rel=1e-6)


def test_token_mask_zeroes_tokens_above_cap():
    t, e, m = _logps()
    w, _ = sampling_is_weights(t, e, m, mode="token_mask", cap=1.5)
    expected = torch.tensor([[0.0, math.exp(-1.0), 1.0], [1.0, math.exp(-2.5), 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)


def test_sequence_modes_use_the_product_of_token_ratios():
    t, e, m = _logps()
    # row 0: log ratio sum = 0.5 - 1 + 0 = -0.5; row 1: 0 - 2.5 = -2.5 (pad slot ignored)
    w, _ = sampling_is_weights(t, e, m, mode="sequence_truncate", cap=2.0)
    assert torch.allclose(w[0], torch.full((3,), math.exp(-0.5)), atol=1e-6)
    assert torch.allclose(w[1], torch.tensor([math.exp(-2.5)] * 2 + [0.0]), atol=1e-6)
    e2 = e.clone()
    e2[0] -= 1.0  # row 0 now has log ratio sum 2.5 -> ratio 12.2 > cap
    w, met = sampling_is_weights(t, e2, m, mode="sequence_truncate", cap=2.0)
    assert torch.allclose(w[0], torch.full((3,), 2.0))
    assert met["sampling/is_capped_frac"].item() == pytest.approx(3 / 5)
    w, _ = sampling_is_weights(t, e2, m, mode="sequence_mask", cap=2.0)
    assert torch.equal(w[0], torch.zeros(3))
    assert w[1, 0].item() == pytest.approx(math.exp(-2.5), rel=1e-6)


def test_equal_logps_give_weight_one_and_leave_the_loss_unchanged():
    torch.manual_seed(0)
    logp = torch.randn(4, 5).requires_grad_()
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    adv = torch.tensor([1.0, -0.5, 0.2, -1.0])
    w, met = sampling_is_weights(logp.detach(), logp.detach(), mask)
    assert torch.equal(w, mask)
    assert met["sampling/logp_abs_diff_mean"].item() == 0.0
    assert met["sampling/is_capped_frac"].item() == 0.0
    base, _ = policy_loss(logp, None, None, adv, mask)
    corrected, _ = policy_loss(logp, None, None, adv, mask, is_weights=w)
    assert corrected.item() == pytest.approx(base.item(), abs=1e-7)


def test_weights_scale_each_tokens_gradient_and_carry_none_themselves():
    """On-policy (old = logp.detach()), d loss / d logp_t = -A * w_t / num_tokens (dapo)."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], requires_grad=True)
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, -2.0])
    w = torch.tensor([[0.5, 2.0], [1.0, 0.0]], requires_grad=True)
    loss, _ = policy_loss(logp, None, None, adv, mask, loss_type="dapo", is_weights=w)
    loss.backward()
    expected = -adv[:, None] * w.detach() / 4
    assert torch.allclose(logp.grad, expected, atol=1e-7)
    assert w.grad is None  # detached inside: the weight is a constant of the step


def test_bad_mode_and_cap_are_refused():
    t, e, m = _logps()
    with pytest.raises(ValueError, match="mode"):
        sampling_is_weights(t, e, m, mode="tis")
    with pytest.raises(ValueError, match="cap"):
        sampling_is_weights(t, e, m, cap=0.5)
