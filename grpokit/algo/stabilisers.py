"""Masks and weights that stabilise the policy gradient, and the entropy bonus.

Each follows TRL's ``GRPOTrainer`` (2026) and the paper that introduced it:

- ``high_entropy_mask``: only the top-rho quantile of tokens by entropy keep their policy
  gradient (Wang et al. 2025, "Beyond the 80/20 rule", arXiv:2506.01939).
- ``off_policy_mask``: a sequence with a negative advantage whose mean log-ratio
  log pi_sampler - log pi_theta exceeds a threshold is dropped (DeepSeek-V3.2,
  arXiv:2512.02556, eq. 9).
- ``gamma_weights``: VESPO's sequence weight phi(w) = e^lam * w^k * e^(-lam w) of the
  sequence ratio w (arXiv:2602.10693).
- ``entropy_bonus``, ``micro_batch_weights`` and ``AdaptiveEntropy``: the term subtracted
  as ``coef * H`` and Skywork-OR1's controller of ``coef`` (arXiv:2505.22312).
"""

from __future__ import annotations

import math

import torch

VESPO_LOG_FLOOR = math.log(1e-8)  # VESPO's lower clamp of log w (as its reference code)
LOG_RATIO_CLAMP = 20.0


def high_entropy_mask(
    entropy: torch.Tensor, mask: torch.Tensor, top_entropy_quantile: float
) -> torch.Tensor:
    """(N, T) bool: completion tokens whose entropy is at least the (1 - rho) quantile of
    the completion tokens' entropies (linear interpolation, ``torch.quantile``).

    rho = 1 keeps every token; rho = 0 keeps only the highest-entropy token(s)."""
    sel = mask.bool()
    values = entropy.detach()[sel].float()
    if values.numel() == 0:
        return torch.zeros_like(sel)
    threshold = torch.quantile(values, 1.0 - top_entropy_quantile)
    return (entropy.detach() * mask >= threshold) & sel


def off_policy_mask(
    advantages: torch.Tensor,
    logp: torch.Tensor,
    sampling_logp: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """(N, 1) float: 1 keeps a sequence, 0 drops it. Kept when its advantage is >= 0 or
    its mean over completion tokens of ``sampling_logp - logp`` is <= ``threshold``. A token
    the engine gave no log-prob for (NaN) adds 0, as TRL."""
    m = mask.to(logp.dtype)
    kl = torch.nan_to_num(sampling_logp - logp.detach(), nan=0.0) * m
    seq_kl = kl.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)  # (N, 1)
    adv = advantages.reshape(-1, 1)
    return ((adv >= 0) | (seq_kl <= threshold)).to(logp.dtype)


@torch.no_grad()
def gamma_weights(
    advantages: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> torch.Tensor:
    """(N, 1) VESPO weights phi(w) = exp(lam + k log w - lam w), no gradient.

    ``log_w`` is the sum over completion tokens of the token log-ratios (each clamped to
    [-20, 20]), plus the sum of the log rollout-correction weights when ``is_weights`` is
    given (each clamped to [log 1e-8, 20]; 0 weights, masked tokens, count as 1e-8), clamped
    to [log 1e-8, 20]. (k, lam) are the positive pair when the advantage is >= 0."""
    m = mask.to(log_ratio.dtype)
    seq = (log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * m).sum(-1, keepdim=True)
    if is_weights is not None:
        log_is = torch.log(is_weights.to(log_ratio.dtype)).clamp(VESPO_LOG_FLOOR, LOG_RATIO_CLAMP)
        seq = seq + (log_is * m).sum(-1, keepdim=True)
    log_w = seq.clamp(VESPO_LOG_FLOOR, LOG_RATIO_CLAMP)
    pos = advantages.reshape(-1, 1) >= 0
    k = torch.where(pos, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(pos, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def entropy_bonus(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    top_entropy_quantile: float = 1.0,
    num_micro_batches: int = 1,
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This micro-batch's share of the mean token entropy H, as TRL computes it.

    ``entropy`` must carry its gradient. The term is the mean entropy over the tokens the
    policy term uses (all completion tokens, or the high-entropy ones when
    ``top_entropy_quantile`` < 1) of this micro-batch, divided by ``num_micro_batches``
    (micro-batches of the step, all ranks), the same for every loss type: it is not
    rescaled to a loss type's policy normaliser (TRL since huggingface/trl#6648; before,
    dapo / cispo / vespo divided the entropy sum by the batch's token count).
    ``row_weights`` (n,): each row's weight in place of 1 / (tokens x num_micro_batches),
    from ``micro_batch_weights``, when the rows computed together are not one micro-batch
    (all completion tokens only). The loss subtracts ``coef * term``. Returns ``(term,
    entropy sum, token count)``, the last two detached (for ``AdaptiveEntropy``)."""
    m = mask.to(entropy.dtype)
    if top_entropy_quantile < 1.0:
        if row_weights is not None:
            raise ValueError("row_weights need top_entropy_quantile 1 (all completion tokens)")
        m = m * high_entropy_mask(entropy, mask, top_entropy_quantile).to(m.dtype)
    total = (entropy * m).sum()
    count = m.sum()
    if row_weights is None:
        term = total / count.clamp(min=1.0) / num_micro_batches
    else:
        term = (entropy * m * row_weights.to(m.dtype)[:, None]).sum()
    return term, total.detach(), count.detach()


def micro_batch_weights(
    mask: torch.Tensor, micro_batch_rows: int, num_micro_batches: int
) -> torch.Tensor:
    """(N,) the weight of each row's tokens in the entropy term when the step's micro-batches
    are its consecutive runs of ``micro_batch_rows`` rows (TRL's): 1 / (the tokens of the
    row's micro-batch x ``num_micro_batches``, all ranks), so that ``entropy_bonus`` over
    any partition of the rows into forwards adds up to the mean of the micro-batch means."""
    N = mask.shape[0]
    which = torch.arange(N, device=mask.device) // max(1, micro_batch_rows)
    tokens = torch.zeros(int(which.max()) + 1 if N else 0, dtype=torch.float64)
    tokens = tokens.to(mask.device).index_add_(0, which, mask.sum(-1).double())
    return 1.0 / (tokens.clamp(min=1.0)[which] * num_micro_batches)


class AdaptiveEntropy:
    """The entropy coefficient of a run: fixed, or Skywork-OR1's adaptive control.

    Adaptive: the coefficient applied during a step is ``coef`` if the previous step's
    entropy was <= ``target``, else 0; after each step ``coef`` moves by ``delta`` up (the
    step's entropy <= target) or down, within [coef_min, coef_max]. There is no previous
    entropy before the first step: it counts as infinite (as TRL), so the first step applies 0."""

    def __init__(
        self,
        coef: float,
        *,
        adaptive: bool = False,
        coef_min: float = 0.0,
        coef_max: float = 1.0,
        delta: float = 0.005,
        target: float = 0.2,
    ):
        self.coef, self.adaptive = float(coef), adaptive
        self.coef_min, self.coef_max, self.delta, self.target = coef_min, coef_max, delta, target
        self.last_entropy = math.inf

    @property
    def enabled(self) -> bool:
        return self.coef != 0.0 or self.adaptive

    def applied(self) -> float:
        """The coefficient this step's micro-batches use."""
        if self.adaptive and self.last_entropy > self.target:
            return 0.0
        return self.coef

    def update(self, entropy: float) -> None:
        """After a step whose mean entropy (all ranks, the bonus's tokens) was ``entropy``."""
        if not self.adaptive:
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, float]:
        return {"entropy_coef": self.coef, "last_world_entropy": self.last_entropy}

    def load_state_dict(self, s: dict[str, float]) -> None:
        self.coef, self.last_entropy = float(s["entropy_coef"]), float(s["last_world_entropy"])
