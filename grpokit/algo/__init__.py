"""Pure tensor math of GRPO and its variants. Imports torch only.

The functions load on first use (``from grpokit.algo import policy_loss`` works as usual):
the variant names in ``grpokit.algo.variants`` can then be read, by the config for one,
without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from grpokit.algo.variants import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    SAMPLING_IS_MODES,
    SCALE_REWARDS,
)

if TYPE_CHECKING:
    from grpokit.algo.advantages import group_advantages
    from grpokit.algo.logprobs import entropy_from_logits, linear_logprobs, selective_log_softmax
    from grpokit.algo.losses import policy_loss, sampling_is_weights

# public function -> the module of this package that defines it
_FUNCTIONS = {
    "group_advantages": "advantages",
    "entropy_from_logits": "logprobs",
    "linear_logprobs": "logprobs",
    "selective_log_softmax": "logprobs",
    "policy_loss": "losses",
    "sampling_is_weights": "losses",
}

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "SAMPLING_IS_MODES",
    "SCALE_REWARDS",
    "entropy_from_logits",
    "group_advantages",
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
