"""The clipped policy objective of GRPO and its published variants, as one pure function.

    ratio_t = exp(logp_t - old_logp_t)                      (token level, PPO/GRPO)
            = exp(mean_t(logp_t - old_logp_t))              (sequence level, GSPO)
    L_t     = -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)
              + beta * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)     (k3 KL estimator)

and the per-token terms are aggregated according to ``loss_type``:

    grpo     mean over each sequence's tokens, then mean over sequences
             (Shao et al. 2024, arXiv:2402.03300)
    bnpo     sum over the micro-batch's tokens / its token count
    dr_grpo  sum over tokens / (sequences * max_completion_length)
             (Liu et al. 2025, "Understanding R1-Zero-like training", arXiv:2503.20783)
    dapo     sum over tokens / tokens of the whole generation batch, all ranks
             (Yu et al. 2025, DAPO, arXiv:2503.14476)
    cispo    -sg(min(ratio_t, eps_high)) * A * logp_t, aggregated as dapo
             (MiniMax-M1, arXiv:2506.13585; ScaleRL arXiv:2510.13786: eps_high = 5)
    sapo     -sigmoid(tau (ratio_t - 1)) * 4 / tau * A, aggregated as grpo
             (Soft Adaptive Policy Optimization, arXiv:2511.20347)
    luspo    the clipped surrogate; sum over tokens / sequences (each sequence's mean
             times its length; LUSPO, arXiv:2602.05261, with the sequence ratio)
    vespo    -phi(w) * A * logp_t, phi the Gamma weight of the sequence ratio, aggregated
             as dapo (VESPO, arXiv:2602.10693)

GSPO: Zheng et al. 2025, arXiv:2507.18071. Clip-higher (epsilon_high > epsilon_low): DAPO.
Two-sided clipping (``delta``): INTELLECT-2, arXiv:2505.07291. The masks and weights of
``top_entropy_quantile``, ``off_policy_mask_threshold``, VESPO: ``stabilisers.py``.

Rollout-engine mismatch (``sampling_is_weights``). When another engine (vLLM) samples the
completions, its probabilities differ slightly from the trainer's for the same weights, so
the samples are slightly off-policy. Truncated importance sampling (Yao et al. 2025, "Your
efficient RL framework secretly brings you off-policy RL training") multiplies each token's
policy term (not the KL term, as TRL) by a detached weight

    w_t = clamp(pi_trainer(y_t) / pi_engine(y_t), C_min, C_max)     (token_truncate)

or zero outside [C_min, C_max] (token_mask), or one weight per sequence from the product of
its token ratios (sequence_truncate, sequence_mask). A token the engine gave no log-prob for
(NaN) has ratio 1, as TRL.

Micro-batching. To make a micro-batch's loss its exact share of the whole batch's loss
(so the sum of micro-batch losses equals the full-batch loss), pass ``num_sequences``
(sequences in the whole batch, all ranks) for ``grpo`` / ``sapo`` / ``dr_grpo`` /
``luspo`` and ``num_tokens`` (completion tokens in the whole batch, all ranks) for
``dapo`` / ``cispo`` / ``vespo``. ``bnpo`` is by definition
a per-micro-batch mean; the caller averages it over micro-batches.
"""

from __future__ import annotations

import math

import torch

from grpokit.algo.stabilisers import gamma_weights, high_entropy_mask, off_policy_mask
from grpokit.algo.variants import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, SAMPLING_IS_MODES

KL_LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: finite in fp32, and far beyond any sane policy gap


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    importance_sampling_level: str = "token",
    max_completion_length: int | None = None,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    entropy: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    delta: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    top_entropy_quantile: float = 1.0,
    off_policy_mask_threshold: float | None = None,
    sampling_logp: torch.Tensor | None = None,
    use_bias_correction_kl: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate plus KL penalty, masked to completion tokens.

    Args:
        logp: (N, T) log-probs of the sampled tokens under the policy being trained.
        old_logp: (N, T) log-probs under the policy that sampled them; ``None`` means
            the same as ``logp`` detached (one update per generation batch).
        ref_logp: (N, T) log-probs under the reference model; required when beta > 0.
        advantages: (N,) one advantage per completion.
        mask: (N, T) 1 for completion tokens that count, 0 for padding.
        loss_type: one of ``LOSS_TYPES``.
        epsilon_low, epsilon_high: clip range [1 - eps_low, 1 + eps_high]; eps_high
            defaults to eps_low.
        beta: KL coefficient.
        importance_sampling_level: ``"token"`` (GRPO) or ``"sequence"`` (GSPO).
        max_completion_length: L for ``dr_grpo``; defaults to T.
        num_sequences: sequences in the whole batch (``grpo``, ``dr_grpo``); default N.
        num_tokens: completion tokens in the whole batch (``dapo``); default mask.sum().
        entropy: optional (N, T) token entropies, only reported.
        is_weights: optional (N, T) rollout-engine correction weights (see
            ``sampling_is_weights``), multiplied into each token's policy term (not into
            the KL term, as TRL), no gradient (vespo: folded into its sequence ratio
            instead).
        delta: INTELLECT-2's upper clip of the unclipped ratio (grpo, bnpo, dr_grpo, dapo,
            luspo); None: off.
        sapo_temperature_pos, sapo_temperature_neg: SAPO's gate temperatures for
            advantages > 0 and <= 0.
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: VESPO's Gamma
            weight parameters for advantages >= 0 and < 0 (``stabilisers.gamma_weights``).
        top_entropy_quantile: rho; < 1 keeps the policy term only on the top-rho quantile
            of this call's completion tokens by ``entropy`` (required then).
        off_policy_mask_threshold: drop sequences with a negative advantage whose mean
            ``sampling_logp - logp`` exceeds it (DeepSeek-V3.2); None: off.
        sampling_logp: (N, T) the sampling engine's log-probs; ``old_logp`` when None.
        use_bias_correction_kl: multiply the KL estimate by the (differentiable) ratio.

    Returns:
        ``(loss, metrics)``: scalar loss; metrics are detached scalars: ``kl``,
        ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean``
        (grpo, bnpo, dr_grpo, dapo, luspo), ``cispo_clip_ratio`` (cispo),
        ``vespo/phi_seq_mean`` (vespo), ``entropy`` (when given). As TRL counts them:
        ``kl`` and ``entropy`` are means over completion tokens; the clip fractions are
        means over completion tokens with token-level ratios and over sequences (all N
        rows) with sequence-level ones; ``vespo/phi_seq_mean`` is a mean over sequences.

    Loss types beyond the clipped surrogate, as TRL computes them (r: the ratio, A: the
    advantage, sg: no gradient):
        cispo  -sg(min(r, epsilon_high)) * A * logp, aggregated as dapo (MiniMax-M1)
        sapo   -sigmoid(tau (r - 1)) * 4 / tau * A, aggregated as grpo (SAPO)
        luspo  the clipped surrogate, each sequence's mean times its length, summed and
               divided by the sequences (LUSPO; with GSPO's sequence ratio)
        vespo  -phi(w) * A * logp, aggregated as dapo (VESPO)
    """
    _check_args(loss_type, importance_sampling_level, beta, ref_logp, top_entropy_quantile, entropy)
    mask = mask.to(logp.dtype)
    old = logp.detach() if old_logp is None else old_logp
    tok_count = mask.sum(-1)  # (N,) completion tokens of each sequence
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # (N, 1)
    params = dict(
        epsilon_low=epsilon_low, eps_high=epsilon_low if epsilon_high is None else epsilon_high,
        delta=delta, level=importance_sampling_level,
        sapo=(sapo_temperature_pos, sapo_temperature_neg), vespo=dict(k_pos=vespo_k_pos,
        lambda_pos=vespo_lambda_pos, k_neg=vespo_k_neg, lambda_neg=vespo_lambda_neg),
    )  # fmt: skip
    ratio, per_token, shown_ratio, extra = _policy_term(
        loss_type, logp, old, adv, mask, tok_count, is_weights if loss_type == "vespo" else None,
        params,
    )  # fmt: skip
    per_token = _masked(
        per_token, adv, logp, old if sampling_logp is None else sampling_logp, mask, entropy,
        off_policy_mask_threshold, top_entropy_quantile,
    )  # fmt: skip
    if is_weights is not None and loss_type != "vespo":  # the policy term only, as TRL
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    kl = _k3(ref_logp, logp, ratio if use_bias_correction_kl else None)  # None without ref
    if beta > 0:
        per_token = per_token + beta * kl
    per_token = per_token * mask
    loss = _aggregate(
        per_token, mask, tok_count, loss_type, max_completion_length, num_sequences, num_tokens
    )
    with torch.no_grad():
        metrics = _all_metrics(loss_type, shown_ratio, adv, mask, kl, entropy, extra, params)
    return loss, metrics


def _all_metrics(loss_type, ratio, adv, mask, kl, entropy, extra, p):
    per_seq = p["level"] == "sequence"
    metrics = _loss_metrics(ratio, adv, mask, kl, entropy, p["epsilon_low"], p["eps_high"], per_seq)
    return _type_metrics(loss_type, metrics, extra, adv, mask, p["eps_high"], per_seq)


def _fraction(flags: torch.Tensor, mask: torch.Tensor, per_seq: bool) -> torch.Tensor:
    """Mean of (N, T) 0/1 ``flags``: over completion tokens, or, when the ratio is one per
    sequence (``per_seq``), over the N sequences (TRL's count: every row, empty or not)."""
    flags = flags.to(mask.dtype)
    if per_seq:
        return flags[:, 0].sum() / max(flags.shape[0], 1)
    return (flags * mask).sum() / mask.sum().clamp(min=1.0)


def _check_args(loss_type, level, beta, ref_logp, rho, entropy) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}"
        )
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (the reference model's log-probs)")
    if rho < 1.0 and entropy is None:
        raise ValueError("top_entropy_quantile < 1 needs entropy (the tokens' entropies)")


def _masked(per_token, adv, logp, s_logp, mask, entropy, threshold, rho):
    """The policy terms with the off-policy sequence mask and the high-entropy token mask."""
    if threshold is not None:
        per_token = per_token * off_policy_mask(adv, logp, s_logp, mask, threshold)
    if rho < 1.0:
        per_token = per_token * high_entropy_mask(entropy, mask, rho).to(per_token.dtype)
    return per_token


def _k3(ref_logp, logp, ratio):
    """(N, T) k3 estimate of KL(pi || ref), >= 0 (clamped so exp cannot overflow); times the
    ratio when given (DeepSeek-V3.2's bias correction: the tokens are off-policy for it too)."""
    if ref_logp is None:
        return None
    d = torch.clamp(ref_logp - logp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    kl = torch.exp(d) - d - 1.0
    return kl if ratio is None else kl * ratio


def _policy_term(loss_type, logp, old, adv, mask, tok_count, is_weights, p):
    """The (N, T) ratio (token or sequence level), and the per-token policy terms of
    ``loss_type``, the ratio the clip metrics show and what the type's own metric needs."""
    token_log_ratio = log_ratio = logp - old  # (N, T)
    if p["level"] == "sequence":
        seq_lr = (log_ratio * mask).sum(-1) / tok_count.clamp(min=1.0)  # (N,)
        log_ratio = seq_lr.unsqueeze(-1).expand_as(logp)  # one ratio per sequence
    ratio = torch.exp(log_ratio)  # (N, T)
    return (ratio, *_terms(loss_type, logp, ratio, token_log_ratio, adv, mask, is_weights, p))


def _terms(loss_type, logp, ratio, token_log_ratio, adv, mask, is_weights, p):
    if loss_type == "cispo":
        capped = torch.clamp(ratio, max=p["eps_high"]).detach()
        return -capped * adv * logp, ratio, ratio
    if loss_type == "sapo":
        pos, neg = p["sapo"]
        tau = torch.where(adv > 0, pos, neg).to(ratio.dtype)  # (N, 1)
        gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
        return -gate * adv, ratio, None
    if loss_type == "vespo":
        phi = gamma_weights(adv, token_log_ratio, mask, is_weights, **p["vespo"])  # (N, 1)
        return -phi * adv * logp, ratio, phi
    clipped = torch.clamp(ratio, 1.0 - p["epsilon_low"], 1.0 + p["eps_high"])
    if p["delta"] is not None:  # INTELLECT-2: the unclipped branch is capped too
        ratio = torch.clamp(ratio, max=p["delta"])
    return -torch.min(ratio * adv, clipped * adv), ratio, None


def _type_metrics(loss_type, metrics, extra, adv, mask, eps_high: float, per_seq: bool):
    """TRL's metric set per loss type: the clip fractions belong to the clipped surrogate;
    cispo reports the capped fraction, vespo the mean of its weights."""
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        return metrics
    out = {k: v for k, v in metrics.items() if not k.startswith("clip_ratio/")}
    if loss_type == "cispo":  # extra: the ratio
        out["cispo_clip_ratio"] = _fraction((extra > eps_high) & (adv > 0), mask, per_seq)
    elif loss_type == "vespo":  # extra: phi (N, 1), one weight per sequence: their mean
        out["vespo/phi_seq_mean"] = extra.sum() / max(extra.shape[0], 1)
    return out


def _aggregate(per_token, mask, tok_count, loss_type, max_len, num_sequences, num_tokens):
    """The masked (N, T) per-token losses reduced to the scalar of ``loss_type``."""
    n_seq, T = per_token.shape
    if loss_type in ("grpo", "sapo"):
        denom = float(n_seq if num_sequences is None else num_sequences)
        return (per_token.sum(-1) / tok_count.clamp(min=1.0)).sum() / denom
    if loss_type == "luspo":  # each sequence's mean times its length: its sum
        return per_token.sum() / float(n_seq if num_sequences is None else num_sequences)
    if loss_type == "bnpo":
        return per_token.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        L = T if max_len is None else max_len
        denom = float(n_seq if num_sequences is None else num_sequences)
        return per_token.sum() / (denom * L)
    denom = mask.sum().clamp(min=1.0) if num_tokens is None else float(max(num_tokens, 1))
    return per_token.sum() / denom  # dapo, cispo, vespo


def _loss_metrics(ratio, adv, mask, kl, entropy, epsilon_low: float, eps_high: float, per_seq):
    """The clipped fractions (token or sequence means, ``_fraction``), and the token means
    of the KL and the entropy (detached scalars)."""
    n_tok = mask.sum().clamp(min=1.0)
    a = adv.expand_as(ratio)
    low = (ratio < 1.0 - epsilon_low) & (a < 0)
    high = (ratio > 1.0 + eps_high) & (a > 0)
    metrics = {
        "clip_ratio/low_mean": _fraction(low, mask, per_seq),
        "clip_ratio/high_mean": _fraction(high, mask, per_seq),
        "clip_ratio/region_mean": _fraction(low | high, mask, per_seq),
        "kl": (kl * mask).sum() / n_tok if kl is not None else torch.zeros((), device=mask.device),
    }
    if entropy is not None:
        metrics["entropy"] = (entropy * mask).sum() / n_tok
    return metrics


def sampling_is_weights(
    trainer_logp: torch.Tensor,
    sampling_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str = "token_truncate",
    clip_max: float | None = 2.0,
    clip_min: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights pi_trainer / pi_engine for tokens sampled by another engine.

    Args:
        trainer_logp: (N, T) the trainer's log-probs of the sampled tokens under the weights
            that sampled them (detached; ``old_logp``).
        sampling_logp: (N, T) the engine's log-probs of the same tokens; NaN where the engine
            gave none (such a token's ratio is 1, as TRL).
        mask: (N, T) 1 on completion tokens.
        mode: one of ``SAMPLING_IS_MODES``. ``clip_max`` / ``clip_min``: TRL's
            ``vllm_importance_sampling_clip_max`` / ``_clip_min`` (None: no bound on that
            side; at least one set, and ratio 1 inside them): ``*_truncate`` clamps ratios to
            them, ``*_mask`` zeroes ratios outside.

    Returns:
        ``(weights, metrics)``: (N, T) detached weights, 0 on padding; TRL's metrics
        ``sampling/sampling_logp_difference/mean`` and ``/max`` (|logp_engine -
        logp_trainer| over completion tokens the engine scored),
        ``sampling/importance_sampling_ratio/min``, ``/mean``, ``/max`` (the weights after
        clamping or masking, over completion tokens in token modes, over sequences with a
        completion token in sequence modes), and ``sampling/is_capped_frac`` (completion
        tokens whose ratio was outside the bounds).
    """
    if mode not in SAMPLING_IS_MODES:
        raise ValueError(f"mode must be one of {SAMPLING_IS_MODES}, got {mode!r}")
    if clip_max is None and clip_min is None:
        raise ValueError("set clip_max or clip_min (an importance-ratio bound)")
    if (clip_max is not None and clip_max < 1) or (clip_min is not None and clip_min > 1):
        raise ValueError(f"clip_min={clip_min}, clip_max={clip_max}: the bounds must contain 1")
    with torch.no_grad():
        m = mask.to(torch.float32)
        diff = trainer_logp.float() - sampling_logp.float()
        scored = m.bool() & ~torch.isnan(diff)
        log_r = torch.where(scored, diff, torch.zeros_like(diff))  # (N, T), NaN -> ratio 1
        sequence = mode.startswith("sequence")
        if sequence:
            seq = log_r.sum(-1).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)  # (N,)
            ratio = torch.exp(seq).unsqueeze(-1).expand_as(log_r)
        else:
            ratio = torch.exp(log_r.clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP))
        hi = math.inf if clip_max is None else clip_max
        lo = -math.inf if clip_min is None else clip_min
        outside = (ratio > hi) | (ratio < lo)
        if mode.endswith("truncate"):
            w = ratio.clamp(min=clip_min, max=clip_max)
        else:
            w = torch.where(outside, torch.zeros_like(ratio), ratio)
        d = log_r.abs()[scored]
        shown = w[:, 0][m.bool().any(-1)] if sequence else w[m.bool()]
        w = w * m
        metrics = {
            "sampling/sampling_logp_difference/mean": d.mean() if d.numel() else _zero(),
            "sampling/sampling_logp_difference/max": d.max() if d.numel() else _zero(),
            "sampling/importance_sampling_ratio/mean": shown.mean() if shown.numel() else _one(),
            "sampling/importance_sampling_ratio/min": shown.min() if shown.numel() else _one(),
            "sampling/importance_sampling_ratio/max": shown.max() if shown.numel() else _one(),
            "sampling/is_capped_frac": (outside.float() * m).sum() / m.sum().clamp(min=1.0),
        }
    return w, metrics


def _zero() -> torch.Tensor:
    return torch.zeros(())


def _one() -> torch.Tensor:
    return torch.ones(())
