"""Pure tensor math of GRPO and its variants. Imports torch only.

The functions load on first use (``from grpokit.algo import policy_loss`` works as usual):
the variant names in ``grpokit.algo.variants`` can then be read, by the config for one,
without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from grpokit.algo.variants import (
    ADVANTAGE_ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    MULTI_OBJECTIVE_AGGREGATIONS,
    SAMPLING_IS_MODES,
    SCALE_REWARDS,
)

if TYPE_CHECKING:
    from grpokit.algo.advantages import (
        group_advantages,
        informative_groups,
        multi_objective_advantages,
    )
    from grpokit.algo.logprobs import entropy_from_logits, linear_logprobs, selective_log_softmax
    from grpokit.algo.losses import policy_loss, sampling_is_weights
    from grpokit.algo.stabilisers import (
        AdaptiveEntropy,
        entropy_bonus,
        gamma_weights,
        high_entropy_mask,
        micro_batch_weights,
        off_policy_mask,
    )

# public function -> the module of this package that defines it
_FUNCTIONS = {
    "group_advantages": "advantages",
    "informative_groups": "advantages",
    "multi_objective_advantages": "advantages",
    "AdaptiveEntropy": "stabilisers",
    "entropy_bonus": "stabilisers",
    "gamma_weights": "stabilisers",
    "high_entropy_mask": "stabilisers",
    "micro_batch_weights": "stabilisers",
    "off_policy_mask": "stabilisers",
    "entropy_from_logits": "logprobs",
    "linear_logprobs": "logprobs",
    "selective_log_softmax": "logprobs",
    "policy_loss": "losses",
    "sampling_is_weights": "losses",
}

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "MULTI_OBJECTIVE_AGGREGATIONS",
    "SAMPLING_IS_MODES",
    "SCALE_REWARDS",
    "AdaptiveEntropy",
    "entropy_bonus",
    "entropy_from_logits",
    "gamma_weights",
    "group_advantages",
    "high_entropy_mask",
    "informative_groups",
    "micro_batch_weights",
    "multi_objective_advantages",
    "off_policy_mask",
    "linear_logprobs",
    "policy_loss",
    "sampling_is_weights",
    "selective_log_softmax",
]


def __getattr__(name: str):
    if name not in _FUNCTIONS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_FUNCTIONS[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
