"""Pure tensor math of GRPO and its variants. Imports torch only."""

from grpokit.algo.advantages import group_advantages
from grpokit.algo.logprobs import entropy_from_logits, linear_logprobs, selective_log_softmax
from grpokit.algo.losses import LOSS_TYPES, SAMPLING_IS_MODES, policy_loss, sampling_is_weights

__all__ = [
    "LOSS_TYPES",
    "SAMPLING_IS_MODES",
    "entropy_from_logits",
    "group_advantages",
    "linear_logprobs",
    "policy_loss",
    "sampling_is_weights",
    "selective_log_softmax",
]
