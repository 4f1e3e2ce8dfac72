"""Rollout engines: prompts in, G sampled completions per prompt out (see base.Rollout)."""

from grpokit.rollout.base import Rollout, SamplingParams, completion_mask_from_eos

__all__ = ["Rollout", "SamplingParams", "completion_mask_from_eos"]
