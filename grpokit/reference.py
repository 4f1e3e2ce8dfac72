"""The KL reference policy: a frozen copy of the starting weights, or (LoRA) the policy with
its adapter disabled; and TR-DPO's reference update (``sync_ref_model``)."""

from __future__ import annotations

import copy

import torch

from grpokit.speed.layers import adapters_off
from grpokit.speed.weights import lower_frozen_linears


def frozen_copy(model, amp_dtype: torch.dtype | None, lower_linears: bool):
    """A frozen (eval, no grad) copy of ``model``. With bf16 autocast and ``lower_linears``,
    its products' weights are stored in bf16 once instead of cast by autocast in every
    reference forward (same values; see ``speed.weights.lower_frozen_linears``)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    if amp_dtype is not None and lower_linears:
        lower_frozen_linears(ref, amp_dtype)
    return ref


@torch.no_grad()
def mix_into(ref, model, alpha: float) -> None:
    """TR-DPO reference update (Gorbatovski et al. 2024): ref <- alpha*policy + (1-alpha)*ref."""
    for pr, pm in zip(ref.parameters(), model.parameters()):
        pr.mul_(1.0 - alpha).add_(pm.detach(), alpha=alpha)


class Reference:
    """Reference log-probs for the KL term, and the reference's place in checkpoints.

    ``copy`` is the frozen copy, or None when the reference is ``policy`` with its LoRA
    adapter disabled. ``sync_steps``/``mix_alpha``: TR-DPO's update every ``sync_steps``
    optimizer steps (None: never)."""

    def __init__(self, policy, copy, *, sync_steps: int | None = None, mix_alpha: float = 0.6):
        self.policy, self.copy = policy, copy
        self.sync_steps, self.mix_alpha = sync_steps, mix_alpha

    def logps(self, forward, ro, micro_batches) -> torch.Tensor:
        """(N, C) reference log-probs of the rollout's completions."""
        if self.copy is not None:
            return forward.no_grad(self.copy, ro, micro_batches)
        with adapters_off(self.policy):  # LoRA: the base model is the reference
            return forward.no_grad(self.policy, ro, micro_batches)

    def after_step(self, step: int) -> None:
        if self.sync_steps and self.copy is not None and step % self.sync_steps == 0:
            mix_into(self.copy, self.policy, self.mix_alpha)

    def to_save(self, step: int):
        """The copy when it has moved away from the starting weights (TR-DPO), else None."""
        if self.sync_steps and step >= self.sync_steps:
            return self.copy
        return None

    def load(self, state_dict) -> None:
        if state_dict is not None and self.copy is not None:
            self.copy.load_state_dict(state_dict)
