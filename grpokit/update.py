"""One optimizer step's gradients: the policy loss over the round's micro-batches, each
backward as it goes (gradient accumulation), with the metrics of the loss terms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit import distributed as dist
from grpokit.algo import entropy_bonus, micro_batch_weights, policy_loss, sampling_is_weights
from grpokit.batch import Batch
from grpokit.checkpoint import fault_point
from grpokit.metrics import TokenWeightedMeans
from grpokit.speed.attention import training_attention
from grpokit.speed.layers import step_casts

# Under autocast, one cast of each trained weight for all of an optimizer step's micro-batches
# (the weights change only at the step), not one a micro-batch. False: for comparisons.
STEP_CASTS = True


@dataclass(frozen=True)
class SamplingCorrection:
    """Truncated importance sampling of the rollout engine's log-probs against ours (vLLM)."""

    mode: str = "token_truncate"
    clip_max: float | None = 2.0
    clip_min: float | None = None
    apply: bool = True  # False: measured and logged, not applied


@dataclass
class GradientResult:
    loss_sum: float = 0.0  # this process's summed micro-batch losses
    finite: bool = True  # every micro-batch loss on this process was finite
    means: TokenWeightedMeans = field(default_factory=TokenWeightedMeans)


class GradientPass:
    """Accumulates one optimizer step's gradients into the policy.

    ``loss_args``: the keyword arguments of ``algo.policy_loss`` fixed for the run
    (loss_type, epsilon_low/high, beta, importance_sampling_level, max_completion_length).
    ``record_old_logp``: num_iterations > 1, so the round's first step records its own
    log-probs (detached) as the old log-probs of the steps after it (the ratio is exactly 1 in
    the first one, and no extra forward is needed).
    ``micro_batch_rows`` (``per_device_train_batch_size``): the entropy bonus is the mean of
    the means of the step's consecutive runs of that many rows (TRL's micro-batches), however
    the plan cuts the rows into forwards; with ``top_entropy_quantile`` < 1 it is each
    forward's mean, as its quantile is."""

    def __init__(
        self,
        model,
        logprobs,
        strategy,
        *,
        loss_args: dict[str, Any],
        record_old_logp: bool,
        correction: SamplingCorrection,
        own_attention_backward: bool,
        entropy=None,
        micro_batch_rows: int | None = None,
    ):
        self.model, self.logprobs, self.strategy = model, logprobs, strategy
        self.micro_batch_rows = micro_batch_rows
        self.loss_args, self.record_old_logp = loss_args, record_old_logp
        self.correction, self.own_attention = correction, own_attention_backward
        # algo.AdaptiveEntropy when the loss has an entropy bonus (entropy_coef or adaptive)
        self.entropy = entropy if entropy is not None and entropy.enabled else None

    def run(self, b: Batch, micro_batches: list[torch.Tensor], step: int) -> GradientResult:
        """Forward, loss and backward of each micro-batch of ``b`` (for optimizer step
        ``step``); sets ``b.old_logp`` on the round's first step when asked."""
        N = b.advantages.shape[0]
        num_seqs = float(N * dist.world_size())
        num_tokens = dist.all_reduce_sum(b.loss_mask.sum().float()).item()
        per_mb = len(micro_batches) * dist.world_size()  # bnpo: mean over micro-batches
        record = None
        if self.record_old_logp and b.old_logp is None:
            record = torch.zeros_like(b.loss_mask, dtype=torch.float32)
        res = GradientResult()
        s_logps = b.rollout.sampling_logps
        # the bonus tokens' entropy sum and count, the policy terms' sum
        window = torch.zeros(3, dtype=torch.float64)
        bonus_w = self._bonus_weights(b.loss_mask)
        with step_casts(STEP_CASTS and not self.strategy.sharded):
            for sl in micro_batches:
                with training_attention(self.own_attention):
                    logp, ent = self.logprobs(self.model, b.rollout, sl, with_entropy=True)
                if record is not None:
                    record[sl] = logp.detach()
                is_w, is_m = self._sampling_weights(b, sl, logp, res.means)
                loss, m = policy_loss(
                    logp,
                    None if b.old_logp is None else b.old_logp[sl],
                    None if b.ref_logp is None else b.ref_logp[sl],
                    b.advantages[sl],
                    b.loss_mask[sl],
                    **self.loss_args,
                    num_sequences=num_seqs,
                    num_tokens=num_tokens,
                    entropy=ent,
                    is_weights=is_w,
                    sampling_logp=None if s_logps is None else s_logps[sl],
                )
                m.update(is_m)
                if self.loss_args["loss_type"] == "bnpo":  # average over micro-batches/ranks
                    loss = loss / per_mb
                if self.entropy is not None:
                    w = None if bonus_w is None else bonus_w[sl]
                    window[2] += loss.item()  # the policy term before the bonus (TRL's policy_loss)
                    loss = self._minus_bonus(loss, ent, b.loss_mask[sl], per_mb, window, w)
                if not torch.isfinite(loss):
                    res.finite = False
                    if not self.strategy.every_rank_runs_backward:
                        break
                self.strategy.backward(self.model, loss)
                fault_point("backward", step)
                res.loss_sum += loss.item()
                res.means.add(m, b.loss_mask[sl].sum().item())
        if record is not None and res.finite:
            b.old_logp = record  # (a skipped micro-batch loop leaves it None: recorded again)
        if self.entropy is not None:  # every rank ran the loop: the collective is safe
            total = dist.all_reduce_sum(window)
            self.entropy.update((total[0] / total[1].clamp(min=1.0)).item())
            res.means.combined["entropy_coef"] = self.entropy.coef
            res.means.combined["policy_loss"] = total[2].item()
        return res

    def state_dict(self) -> dict[str, float] | None:
        """What a checkpoint keeps: the adaptive entropy coefficient and last entropy."""
        return None if self.entropy is None else self.entropy.state_dict()

    def load_state_dict(self, state: dict[str, float] | None) -> None:
        if self.entropy is not None and state:
            self.entropy.load_state_dict(state)

    def _bonus_weights(self, mask: torch.Tensor) -> torch.Tensor | None:
        """(N,) each row's weight in the entropy term (``algo.micro_batch_weights``), or None:
        no bonus, or each forward's own mean (``top_entropy_quantile`` < 1)."""
        quantile = self.loss_args.get("top_entropy_quantile", 1.0)
        if self.entropy is None or quantile < 1.0 or not self.micro_batch_rows:
            return None
        rows = self.micro_batch_rows
        n_mb = -(-mask.shape[0] // rows) * dist.world_size()
        return micro_batch_weights(mask, rows, n_mb)

    def _minus_bonus(self, loss, ent, mask, per_mb, window, row_weights=None):
        """``loss - coef * H`` (TRL's entropy bonus), H these rows' share of the mean of the
        micro-batches' mean token entropies; adds their entropy sum and count to ``window``."""
        term, e_sum, e_count = entropy_bonus(
            ent,
            mask,
            top_entropy_quantile=self.loss_args.get("top_entropy_quantile", 1.0),
            num_micro_batches=per_mb,
            row_weights=row_weights,
        )
        window[:2] += torch.stack([e_sum, e_count]).double().cpu()
        return loss - self.entropy.applied() * term

    def _sampling_weights(self, b: Batch, sl, logp, means: TokenWeightedMeans):
        """IS weights of the sampler's log-probs vs ours under the same weights, and their
        metrics (None, {} when the engine gives no log-probs, as grpokit's own loop)."""
        s_logps = b.rollout.sampling_logps  # (N, C) from vLLM, None from the HF engine
        if s_logps is None:
            return None, {}
        c = self.correction
        old = logp.detach() if b.old_logp is None else b.old_logp[sl]
        is_w, is_m = sampling_is_weights(
            old, s_logps[sl], b.loss_mask[sl], mode=c.mode, clip_max=c.clip_max, clip_min=c.clip_min
        )
        means.add_extremes(is_m)
        return (is_w if c.apply else None), is_m
