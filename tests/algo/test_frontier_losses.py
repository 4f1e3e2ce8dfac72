"""cispo, sapo, luspo, vespo and the stabilisers (delta, top_entropy_quantile, the off-policy
sequence mask, the bias-corrected KL): hand-computed values, a python-loop twin of the
whole objective, gradients, micro-batch shares."""

import math

import pytest
import torch

from grpokit.algo import gamma_weights, high_entropy_mask, off_policy_mask, policy_loss

ONE = torch.ones(1, 1)


def _one_token(ratio, adv, loss_type, **kw):
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    loss, m = policy_loss(
        logp, torch.zeros(1, 1, dtype=torch.float64), None, torch.tensor([adv]), ONE,
        loss_type=loss_type, **kw,
    )  # fmt: skip
    loss.backward()
    return loss.item(), logp.grad.item(), m


# ----------------------------------------------------------------- hand-computed values
def test_cispo_caps_the_ratio_at_epsilon_high_and_keeps_its_gradient():
    loss, grad, m = _one_token(1.5, 1.0, "cispo", epsilon_high=1.2)
    assert loss == pytest.approx(-1.2 * math.log(1.5))  # -sg(min(r, 1.2)) * A * logp
    assert grad == pytest.approx(-1.2)  # the capped weight, not zero as PPO's clip gives
    assert m["cispo_clip_ratio"].item() == 1.0
    assert "clip_ratio/region_mean" not in m
    loss, grad, m = _one_token(1.5, -1.0, "cispo", epsilon_high=1.2)
    assert grad == pytest.approx(1.2) and m["cispo_clip_ratio"].item() == 0.0  # A < 0
    loss, grad, _ = _one_token(0.5, 1.0, "cispo", epsilon_high=5.0)
    assert grad == pytest.approx(-0.5)  # below the cap: the ratio itself


def test_sapo_gate_values_and_on_policy_gradient():
    loss, grad, m = _one_token(1.0, 1.0, "sapo")
    assert loss == pytest.approx(-2.0)  # sigmoid(0) * 4 / 1
    assert grad == pytest.approx(-1.0)  # A * 4 sigmoid'(0) * r: REINFORCE on-policy
    loss, grad, _ = _one_token(1.0, -1.0, "sapo")
    assert loss == pytest.approx(2.0 / 1.05)  # tau_neg for A <= 0
    assert grad == pytest.approx(1.0)
    loss, grad, _ = _one_token(2.0, 1.0, "sapo", sapo_temperature_pos=2.0)
    s = 1 / (1 + math.exp(-2.0))
    assert loss == pytest.approx(-s * 4 / 2.0)
    assert grad == pytest.approx(-4 * s * (1 - s) * 2.0)  # d/dlogp: A 4 s (1-s) r
    assert set(m) == {"kl"}


def test_luspo_weights_each_sequence_by_its_length():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, _ = policy_loss(
        torch.zeros(2, 3), None, None, torch.tensor([1.0, 2.0]), mask,
        loss_type="luspo", importance_sampling_level="sequence",
    )  # fmt: skip
    assert loss.item() == pytest.approx((-1.0 * 2 - 2.0 * 1) / 2)


def test_vespo_gamma_weight_values():
    # on-policy w = 1: phi = e^lam * 1 * e^-lam = 1
    loss, grad, m = _one_token(1.0, 1.0, "vespo")
    assert loss == pytest.approx(0.0) and grad == pytest.approx(-1.0)
    assert m["vespo/phi_seq_mean"].item() == pytest.approx(1.0)
    # w = 2, A > 0 (k 2, lam 3): phi = e^3 * 4 * e^-6
    loss, grad, m = _one_token(2.0, 1.0, "vespo")
    assert grad == pytest.approx(-4 * math.exp(-3))
    assert loss == pytest.approx(-4 * math.exp(-3) * math.log(2.0))
    # w = 2, A < 0 (k 3, lam 2): phi = e^2 * 8 * e^-4
    _, grad, _ = _one_token(2.0, -1.0, "vespo")
    assert grad == pytest.approx(8 * math.exp(-2))


def test_vespo_sums_token_log_ratios_and_folds_in_rollout_weights():
    lr = torch.tensor([[0.1, 0.2, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    phi = gamma_weights(torch.tensor([1.0]), lr, mask)
    w = math.exp(0.3)  # padding does not count
    assert phi.item() == pytest.approx(math.exp(3 + 2 * math.log(w) - 3 * w), rel=1e-6)
    isw = torch.tensor([[0.5, 1.0, 0.0]])  # 0 on padding, as sampling_is_weights gives
    phi = gamma_weights(torch.tensor([1.0]), lr, mask, isw)
    w = math.exp(0.3 + math.log(0.5))
    assert phi.item() == pytest.approx(math.exp(3 + 2 * math.log(w) - 3 * w), rel=1e-6)


def test_delta_caps_the_unclipped_branch():
    loss, _, _ = _one_token(3.0, -1.0, "grpo")
    assert loss == pytest.approx(3.0)  # -min(-3, -1.2)
    loss, grad, m = _one_token(3.0, -1.0, "grpo", delta=2.0)
    assert loss == pytest.approx(2.0) and grad == pytest.approx(0.0)
    loss, _, _ = _one_token(1.1, -1.0, "dapo", delta=2.0)
    assert loss == pytest.approx(1.1)  # below delta: unchanged


def test_off_policy_mask_drops_negative_far_sequences():
    logp = torch.zeros(3, 2)
    samp = torch.tensor([[0.9, 0.9], [0.9, 0.9], [0.1, 0.3]])  # mean kl .9, .9, .2
    mask = torch.ones(3, 2)
    adv = torch.tensor([1.0, -1.0, -1.0])
    keep = off_policy_mask(adv, logp, samp, mask, 0.5)
    assert keep.squeeze(1).tolist() == [1.0, 0.0, 1.0]
    loss, _ = policy_loss(
        logp, None, None, adv, mask, loss_type="dapo",
        off_policy_mask_threshold=0.5, sampling_logp=samp,
    )  # fmt: skip
    assert loss.item() == pytest.approx((-1 * 2 + 1 * 2) / 6)  # row 1 left out
    # without sampling_logp the old log-probs are the sampler's: nothing is far here
    loss, _ = policy_loss(logp, None, None, adv, mask, off_policy_mask_threshold=0.5)
    assert loss.item() == pytest.approx((-2 + 2 + 2) / 6)
    # a token the engine did not score (NaN) adds nothing, as TRL: row 2 stays kept
    samp[2, 1] = float("nan")
    assert off_policy_mask(adv, logp, samp, mask, 0.5).squeeze(1).tolist() == [1.0, 0.0, 1.0]


def test_high_entropy_mask_keeps_the_top_quantile():
    ent = torch.tensor([[1.0, 2.0, 3.0], [4.0, 50.0, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    keep = high_entropy_mask(ent, mask, 0.5)  # median of 1,2,3,4 = 2.5
    assert keep.tolist() == [[False, False, True], [True, False, False]]
    assert high_entropy_mask(ent, mask, 1.0).tolist() == mask.bool().tolist()
    assert high_entropy_mask(ent, mask, 0.0).sum().item() == 1  # the top token only
    loss, _ = policy_loss(
        torch.zeros(2, 3), None, None, torch.tensor([1.0, 3.0]), mask,
        loss_type="dapo", top_entropy_quantile=0.5, entropy=ent,
    )  # fmt: skip
    assert loss.item() == pytest.approx((-1.0 - 3.0) / 4)  # 2 tokens kept of 4 counted
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(torch.zeros(1, 1), None, None, ONE[0], ONE, top_entropy_quantile=0.2)


def test_bias_corrected_kl_is_multiplied_by_the_ratio():
    logp = torch.tensor([[math.log(2.0)]])
    ref = torch.zeros(1, 1)
    k3 = 0.5 - math.log(0.5) - 1.0
    _, m = policy_loss(logp, torch.zeros(1, 1), ref, torch.zeros(1), ONE, beta=0.1)
    assert m["kl"].item() == pytest.approx(k3)
    loss, m = policy_loss(
        logp, torch.zeros(1, 1), ref, torch.zeros(1), ONE, beta=0.1, use_bias_correction_kl=True
    )
    assert m["kl"].item() == pytest.approx(2.0 * k3)
    assert loss.item() == pytest.approx(0.1 * 2.0 * k3)


def test_rollout_weights_scale_the_policy_term_not_the_kl_term():
    """TRL multiplies the vLLM correction weight into the policy term before the KL term is
    added: one token, ratio 1, A = 1, weight 0.5, logp = log 0.5 against ref 0."""
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    ref = torch.zeros(1, 1, dtype=torch.float64)
    k3 = 2.0 - math.log(2.0) - 1.0  # exp(ref - logp) - (ref - logp) - 1
    isw = torch.full((1, 1), 0.5, dtype=torch.float64)
    loss, _ = policy_loss(
        logp, None, ref, torch.tensor([1.0]), ONE, loss_type="dapo", beta=0.1, is_weights=isw
    )
    assert loss.item() == pytest.approx(-0.5 + 0.1 * k3)  # not 0.5 * (-1 + 0.1 * k3)
    loss.backward()
    # d/dlogp: -0.5 * A (the ratio's slope 1) + 0.1 * (1 - exp(ref - logp)) = -0.5 - 0.1
    assert logp.grad.item() == pytest.approx(-0.5 + 0.1 * (1.0 - 2.0))


def _seq_case():
    """Three sequences of 3, 1 and 0 tokens; the first is off-policy by log 1.5 on each
    token (sequence ratio 1.5), the others on-policy; all advantages > 0 but the last."""
    logp = torch.tensor([[math.log(1.5)] * 3, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    return logp, torch.zeros(3, 3), torch.tensor([1.0, 1.0, -1.0]), mask


def test_sequence_level_clip_fractions_count_sequences():
    logp, old, adv, mask = _seq_case()
    _, m = policy_loss(logp, old, None, adv, mask, loss_type="grpo", epsilon_high=0.28)
    assert m["clip_ratio/high_mean"].item() == pytest.approx(3 / 4)  # tokens: 3 of 4
    _, m = policy_loss(
        logp, old, None, adv, mask, loss_type="grpo", epsilon_high=0.28,
        importance_sampling_level="sequence",
    )  # fmt: skip
    assert m["clip_ratio/high_mean"].item() == pytest.approx(1 / 3)  # sequences: 1 of 3
    assert m["clip_ratio/region_mean"].item() == pytest.approx(1 / 3)
    assert m["clip_ratio/low_mean"].item() == 0.0
    _, m = policy_loss(
        logp, old, None, adv, mask, loss_type="cispo", epsilon_high=1.2,
        importance_sampling_level="sequence",
    )  # fmt: skip
    assert m["cispo_clip_ratio"].item() == pytest.approx(1 / 3)


def test_vespo_weight_metric_is_a_mean_over_sequences():
    logp, old, adv, mask = _seq_case()
    _, m = policy_loss(logp, old, None, adv, mask, loss_type="vespo")
    w = 1.5**3  # the sum of the first sequence's token log-ratios: w = 1.5^3
    phi0 = math.exp(3.0 + 2.0 * math.log(w) - 3.0 * w)  # k 2, lam 3 (A >= 0)
    # the on-policy rows (the empty one too: w = 1) have phi 1
    assert m["vespo/phi_seq_mean"].item() == pytest.approx((phi0 + 1.0 + 1.0) / 3, rel=1e-5)


# ----------------------------------------------------------------- the python-loop twin
def _quantile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _clamp(x, lo, hi):
    return max(lo, min(hi, x))


def _vespo_phi(i, idx, lp, old, adv, isw, k):
    lw = sum(_clamp(lp[i][t] - old[i][t], -20, 20) for t in idx)
    if isw is not None:
        lw += sum(_clamp(math.log(max(isw[i][t], 1e-300)), math.log(1e-8), 20) for t in idx)
    lw = _clamp(lw, math.log(1e-8), 20)
    kk, lam = (k[0], k[1]) if adv[i] >= 0 else (k[2], k[3])
    return math.exp(lam + kk * lw - lam * math.exp(lw))


def _term(o, lp_it, r, A, phi):
    """One token's policy term, the papers' formulas."""
    if o["loss_type"] == "cispo":
        return -min(r, o["eps_hi"]) * A * lp_it
    if o["loss_type"] == "sapo":
        tau = o["tau"][0] if A > 0 else o["tau"][1]
        return -(1 / (1 + math.exp(-tau * (r - 1)))) * 4 / tau * A
    if o["loss_type"] == "vespo":
        return -phi * A * lp_it
    c = _clamp(r, 1 - o["eps_lo"], 1 + o["eps_hi"])
    ru = r if o["delta"] is None else min(r, o["delta"])
    return -min(ru * A, c * A)


def _naive(lp, old, ref, adv, mask, ent, samp, isw, o):
    N, T = len(lp), len(lp[0])
    toks = [(i, t) for i in range(N) for t in range(T) if mask[i][t]]
    thr = _quantile([ent[i][t] for i, t in toks], 1 - o["rho"]) if o["rho"] < 1 else None
    total, count, seq_means = 0.0, 0, []
    for i in range(N):
        idx = [t for t in range(T) if mask[i][t]]
        lr = [lp[i][t] - old[i][t] for t in range(T)]
        if o["level"] == "sequence":
            lr = [sum(lr[t] for t in idx) / max(len(idx), 1)] * T
        phi = _vespo_phi(i, idx, lp, old, adv, isw, o["vespo"]) if o["loss_type"] == "vespo" else 0
        keep = 1.0
        if o["opm"] is not None:
            far = sum(samp[i][t] - lp[i][t] for t in idx) / max(len(idx), 1) > o["opm"]
            keep = 0.0 if (adv[i] < 0 and far) else 1.0
        row = 0.0
        for t in idx:
            r = math.exp(lr[t])
            term = _term(o, lp[i][t], r, adv[i], phi) * keep
            if thr is not None and not ent[i][t] >= thr:
                term = 0.0
            if isw is not None and o["loss_type"] != "vespo":
                term *= isw[i][t]  # the policy term only: the KL term is not reweighted
            d = _clamp(ref[i][t] - lp[i][t], -20, 20)
            kl = math.exp(d) - d - 1
            term += o["beta"] * kl * (r if o["bias_kl"] else 1.0)
            row += term
        total, count = total + row, count + len(idx)
        seq_means.append(row / max(len(idx), 1))
    lt = o["loss_type"]
    if lt in ("grpo", "sapo"):
        return sum(seq_means) / N
    if lt == "dr_grpo":
        return total / (N * o["L"])
    if lt == "luspo":
        return total / N
    return total / count  # bnpo, dapo, cispo, vespo


def _inputs(seed, N=5, T=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(N, T, generator=g) * 3).to(dtype)
    old = logp + (torch.randn(N, T, generator=g) * 0.4).to(dtype)
    ref = logp + (torch.randn(N, T, generator=g) * 0.3).to(dtype)
    samp = old + (torch.randn(N, T, generator=g) * 0.5).to(dtype)
    adv = torch.randn(N, generator=g).to(dtype)
    ent = (torch.rand(N, T, generator=g) * 4).to(dtype)
    isw = (torch.rand(N, T, generator=g) + 0.5).to(dtype)
    lengths = torch.tensor([6, 1, 3, 4, 2][:N])
    mask = (torch.arange(T)[None] < lengths[:, None]).to(dtype)
    return logp, old, ref, adv, mask, ent, samp, isw * mask


CASES = [
    dict(loss_type="cispo", epsilon_high=1.3),
    dict(loss_type="cispo", epsilon_high=5.0, importance_sampling_level="sequence"),
    dict(loss_type="sapo", sapo_temperature_pos=0.7, sapo_temperature_neg=1.3),
    dict(loss_type="luspo", importance_sampling_level="sequence"),
    dict(loss_type="luspo", delta=1.4),
    dict(loss_type="vespo"),
    dict(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_neg=2.5, is_weights=True),
    dict(loss_type="grpo", delta=1.3),
    dict(loss_type="dapo", top_entropy_quantile=0.3),
    dict(loss_type="bnpo", off_policy_mask_threshold=0.1),
    dict(loss_type="dr_grpo", use_bias_correction_kl=True),
    dict(loss_type="sapo", off_policy_mask_threshold=0.0, top_entropy_quantile=0.6),
    dict(loss_type="dapo", is_weights=True, delta=1.2, use_bias_correction_kl=True),
]


def _opts(kw):
    return dict(
        loss_type=kw["loss_type"],
        eps_lo=0.2,
        eps_hi=kw.get("epsilon_high", 0.28),
        beta=0.04,
        level=kw.get("importance_sampling_level", "token"),
        L=8,
        delta=kw.get("delta"),
        tau=(kw.get("sapo_temperature_pos", 1.0), kw.get("sapo_temperature_neg", 1.05)),
        vespo=(kw.get("vespo_k_pos", 2.0), kw.get("vespo_lambda_pos", 3.0), 3.0,
               kw.get("vespo_lambda_neg", 2.0)),
        rho=kw.get("top_entropy_quantile", 1.0),
        opm=kw.get("off_policy_mask_threshold"),
        bias_kl=kw.get("use_bias_correction_kl", False),
    )  # fmt: skip


def _call(kw, logp, old, ref, adv, mask, ent, samp, isw, **extra):
    kw = dict(kw)
    use_isw = kw.pop("is_weights", False)
    kw.setdefault("epsilon_high", 0.28)
    return policy_loss(
        logp, old, ref, adv, mask, beta=0.04, max_completion_length=8, entropy=ent,
        sampling_logp=samp, is_weights=isw if use_isw else None, **kw, **extra,
    )  # fmt: skip


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_vectorised_equals_naive_loop(kw):
    x = _inputs(11)
    loss, _ = _call(kw, *x)
    lp, old, ref, adv, mask, ent, samp, isw = (t.tolist() for t in x)
    expected = _naive(lp, old, ref, adv, mask, ent, samp, isw if kw.get("is_weights") else None,
                      _opts(kw))  # fmt: skip
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


# ----------------------------------------------------------------- gradients
SMOOTH = [c for c in CASES if c["loss_type"] not in ("cispo", "vespo")]


@pytest.mark.parametrize("kw", SMOOTH, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_gradient_matches_finite_differences(kw):
    """Every term with a gradient is differentiated exactly (float64 gradcheck); the masks
    are constants there (off-policy: detached log-probs, entropy: given)."""
    logp, *rest = _inputs(12, dtype=torch.float64)
    logp.requires_grad_()
    torch.autograd.gradcheck(lambda lp: _call(kw, lp, *rest)[0], (logp,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw", [c for c in CASES if c["loss_type"] in ("cispo", "vespo")])
def test_stop_gradient_losses_are_weighted_reinforce(kw):
    """cispo and vespo: d loss / d logp = -sg(weight) * A / tokens (the weight carries no
    gradient), the weight being min(r, eps_high) or phi(w)."""
    logp, old, ref, adv, mask, ent, samp, isw = _inputs(13, dtype=torch.float64)
    logp.requires_grad_()
    kw = dict(kw)
    use_isw = kw.pop("is_weights", False)
    loss, _ = policy_loss(logp, old, None, adv, mask, is_weights=isw if use_isw else None, **kw)
    loss.backward()
    if kw["loss_type"] == "cispo":
        r = torch.exp(logp.detach() - old)
        if kw.get("importance_sampling_level") == "sequence":
            seq = ((logp.detach() - old) * mask).sum(-1) / mask.sum(-1)
            r = torch.exp(seq)[:, None].expand_as(logp)
        w = r.clamp(max=kw["epsilon_high"])
    else:
        w = gamma_weights(adv, logp.detach() - old, mask, isw if use_isw else None, k_pos=kw.get(
            "vespo_k_pos", 2.0), lambda_neg=kw.get("vespo_lambda_neg", 2.0)).expand_as(logp)  # fmt: skip
    expected = -w * adv[:, None] * mask / mask.sum()
    torch.testing.assert_close(logp.grad, expected)


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "luspo", "vespo"])
def test_micro_batch_shares_add_up_to_the_whole(loss_type):
    logp, old, ref, adv, mask, ent, samp, isw = _inputs(14, N=5)
    logp.requires_grad_()
    kw = dict(loss_type=loss_type, beta=0.04, epsilon_high=2.0)
    full, _ = policy_loss(logp, old, ref, adv, mask, **kw)
    full.backward()
    g_full, logp.grad = logp.grad.clone(), None
    parts = 0.0
    for sl in (slice(0, 2), slice(2, 3), slice(3, 5)):
        part, _ = policy_loss(
            logp[sl], old[sl], ref[sl], adv[sl], mask[sl],
            num_sequences=5, num_tokens=mask.sum().item(), **kw,
        )  # fmt: skip
        part.backward()
        parts += part.item()
    assert parts == pytest.approx(full.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(logp.grad, g_full)


def test_existing_loss_types_unchanged_by_the_new_defaults():
    """The new keywords at their defaults leave grpo..dapo bit for bit as before: the same
    operations in the same order (the golden runs check the whole trainer)."""
    logp, old, ref, adv, mask, ent, _, isw = _inputs(15)
    for lt in ("grpo", "bnpo", "dr_grpo", "dapo"):
        a, _ = policy_loss(logp, old, ref, adv, mask, loss_type=lt, beta=0.04, is_weights=isw)
        ratio = torch.exp(logp - old)
        clipped = torch.clamp(ratio, 0.8, 1.2)
        A = adv[:, None]
        d = ref - logp
        per = (-torch.min(ratio * A, clipped * A) * isw + 0.04 * (torch.exp(d) - d - 1)) * mask
        if lt == "grpo":
            b = (per.sum(-1) / mask.sum(-1)).sum() / 5
        elif lt == "dr_grpo":
            b = per.sum() / (5 * 6)
        else:
            b = per.sum() / mask.sum()
        assert a.item() == b.item(), lt


def _grad(loss_type, logp0, old, adv, mask, **kw):
    logp = logp0.clone().requires_grad_()
    loss, _ = policy_loss(logp, old, None, adv, mask, loss_type=loss_type, **kw)
    loss.backward()
    return logp.grad


def test_on_policy_cispo_and_vespo_step_as_dapo_and_sapo_as_grpo():
    """With every ratio 1 (num_iterations 1, the sampler's own policy), cispo's and vespo's
    gradients equal dapo's and sapo's equals grpo's: they differ only off-policy. (The
    variants benchmark's seed-0 runs of cispo and vespo logged the same numbers as dapo's but
    the loss value, and sapo's sampled the same 1,280 completions as grpo's.) Off-policy, the
    same tensors give different gradients."""
    g = torch.Generator().manual_seed(11)
    N, T = 6, 5
    logp0 = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    mask = (torch.rand(N, T, generator=g) > 0.2).double()
    mask[:, 0] = 1
    twins = [("dapo", "cispo", {"epsilon_high": 5.0}), ("dapo", "vespo", {}), ("grpo", "sapo", {})]
    for base, other, kw in twins:
        on = _grad(base, logp0, logp0, adv, mask, **kw), _grad(other, logp0, logp0, adv, mask, **kw)
        torch.testing.assert_close(on[0], on[1], rtol=1e-12, atol=1e-14, msg=other)
        stale = logp0 + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
        off = (
            _grad(base, logp0, stale, adv, mask, **kw),
            _grad(other, logp0, stale, adv, mask, **kw),
        )
        assert not torch.allclose(off[0], off[1]), other
