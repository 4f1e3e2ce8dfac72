"""The names of the objective's variants, in one place and without torch.

The math in this package owns its variants; the config validates recipes against these
same tuples. This module imports nothing, so ``grpokit.config`` can read it without
loading torch (``grpokit.algo`` loads its torch modules only when one of their functions
is first used).
"""

# how the per-token terms are aggregated (losses.policy_loss)
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
# the ratio per token (GRPO) or one per sequence (GSPO) (losses.policy_loss)
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
# the weight correcting for another engine's sampling (losses.sampling_is_weights)
SAMPLING_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# what the group-relative advantage is divided by (advantages.group_advantages)
SCALE_REWARDS = ("group", "batch", "none")
# how the group baseline is formed (advantages.group_advantages)
ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")
# estimators whose statistics weigh each completion by its tokens: they need the lengths
TOKEN_WEIGHTED_ESTIMATORS = ("reinforce_plus_plus_baseline",)
# how several reward functions become one advantage (advantages.multi_objective_advantages)
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
