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
    w, met = sampling_is_weights(t, e, m, mode="token_truncate", clip_max=1.5)
    # ratios: e^0.5=1.6487 -> capped 1.5, e^-1, 1 ; 1, e^-2.5, (pad)
    expected = torch.tensor([[1.5, math.exp(-1.0), 1.0], [1.0, math.exp(-2.5), 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    assert met["sampling/is_capped_frac"].item() == pytest.approx(1 / 5)
    diff = "sampling/sampling_logp_difference/"
    assert met[diff + "mean"].item() == pytest.approx((0.5 + 1 + 0 + 0 + 2.5) / 5)
    assert met[diff + "max"].item() == pytest.approx(2.5)
    kept = [1.5, math.exp(-1.0), 1.0, 1.0, math.exp(-2.5)]  # after truncation, as TRL logs
    ratio = "sampling/importance_sampling_ratio/"
    assert met[ratio + "mean"].item() == pytest.approx(sum(kept) / 5, rel=1e-6)
    assert met[ratio + "max"].item() == pytest.approx(1.5, rel=1e-6)
    assert met[ratio + "min"].item() == pytest.approx(math.exp(-2.5), rel=1e-6)


def test_lower_bound_truncates_and_masks():
    t, e, m = _logps()
    w, met = sampling_is_weights(t, e, m, mode="token_truncate", clip_max=None, clip_min=0.5)
    expected = torch.tensor([[math.exp(0.5), 0.5, 1.0], [1.0, 0.5, 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    assert met["sampling/is_capped_frac"].item() == pytest.approx(2 / 5)
    w, _ = sampling_is_weights(t, e, m, mode="token_mask", clip_max=1.5, clip_min=0.5)
    expected = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)


def _trl_is(old, sampling, mask, mode, cmax, cmin):
    """TRL 1.16's vLLM importance-sampling ratio (GRPOTrainer._generate_and_score_completions)."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    seq = mode.startswith("sequence")
    r = torch.exp(diff.sum(-1, keepdim=True) if seq else diff)
    if mode.endswith("truncate"):
        r = torch.clamp(r, min=cmin, max=cmax)
    else:
        lo = -math.inf if cmin is None else cmin
        hi = math.inf if cmax is None else cmax
        r = r.masked_fill((r < lo) | (r > hi), 0.0)
    shown = r.flatten() if seq else r[mask.bool()]
    delta = torch.abs(old - sampling)[mask.bool() & ~torch.isnan(old - sampling)]
    return r, shown, delta


@pytest.mark.parametrize(
    "mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
)
@pytest.mark.parametrize("bounds", [(3.0, None), (2.0, 0.5), (None, 0.8)])
def test_matches_trl_including_unscored_tokens(mode, bounds):
    """Weights on completion tokens and TRL's logged metrics; a NaN engine log-prob counts as
    ratio 1 and is left out of the difference metrics, as TRL."""
    torch.manual_seed(1)
    old = -torch.rand(6, 5) * 2
    sampling = old + torch.randn(6, 5) * 0.3
    sampling[2, 1] = float("nan")
    mask = torch.ones(6, 5)
    mask[3, 2:] = 0
    cmax, cmin = bounds
    w, met = sampling_is_weights(old, sampling, mask, mode=mode, clip_max=cmax, clip_min=cmin)
    r, shown, delta = _trl_is(old, sampling, mask, mode, cmax, cmin)
    torch.testing.assert_close(w, (r * mask).expand_as(w) * mask, rtol=1e-6, atol=1e-7)
    p = "sampling/importance_sampling_ratio/"
    for k, f in (("mean", torch.mean), ("min", torch.min), ("max", torch.max)):
        assert met[p + k].item() == pytest.approx(f(shown).item(), rel=1e-6)
    d = "sampling/sampling_logp_difference/"
    assert met[d + "mean"].item() == pytest.approx(delta.mean().item(), rel=1e-6)
    assert met[d + "max"].item() == pytest.approx(delta.max().item(), rel=1e-6)


def test_token_mask_zeroes_tokens_above_cap():
    t, e, m = _logps()
    w, _ = sampling_is_weights(t, e, m, mode="token_mask", clip_max=1.5)
    expected = torch.tensor([[0.0, math.exp(-1.0), 1.0], [1.0, math.exp(-2.5), 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)


def test_sequence_modes_use_the_product_of_token_ratios():
    t, e, m = _logps()
    # row 0: log ratio sum = 0.5 - 1 + 0 = -0.5; row 1: 0 - 2.5 = -2.5 (pad slot ignored)
    w, _ = sampling_is_weights(t, e, m, mode="sequence_truncate", clip_max=2.0)
    assert torch.allclose(w[0], torch.full((3,), math.exp(-0.5)), atol=1e-6)
    assert torch.allclose(w[1], torch.tensor([math.exp(-2.5)] * 2 + [0.0]), atol=1e-6)
    e2 = e.clone()
    e2[0] -= 1.0  # row 0 now has log ratio sum 2.5 -> ratio 12.2 > cap
    w, met = sampling_is_weights(t, e2, m, mode="sequence_truncate", clip_max=2.0)
    assert torch.allclose(w[0], torch.full((3,), 2.0))
    assert met["sampling/is_capped_frac"].item() == pytest.approx(3 / 5)
    w, _ = sampling_is_weights(t, e2, m, mode="sequence_mask", clip_max=2.0)
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
    assert met["sampling/sampling_logp_difference/mean"].item() == 0.0
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


def test_bad_mode_and_bounds_are_refused():
    t, e, m = _logps()
    with pytest.raises(ValueError, match="mode"):
        sampling_is_weights(t, e, m, mode="tis")
    with pytest.raises(ValueError, match="contain 1"):
        sampling_is_weights(t, e, m, clip_max=0.5)
    with pytest.raises(ValueError, match="clip_max or clip_min"):
        sampling_is_weights(t, e, m, clip_max=None)
