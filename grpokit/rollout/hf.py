"""Rollouts with transformers' ``generate``."""

from __future__ import annotations

import torch

from grpokit.rollout.base import Rollout, SamplingParams, completion_mask_from_eos


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(i) for i in gen_eos)
    if not ids:
        raise ValueError("the tokenizer has no eos_token; set one so completions can end")
    return sorted(ids)


class HFRolloutEngine:
    """Samples with ``model.generate``; the policy model itself, no weight copy."""

    def __init__(self, model, tokenizer, autocast_dtype: torch.dtype | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        )
        self.autocast_dtype = autocast_dtype

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        params: SamplingParams,
        num_generations: int = 1,
    ) -> Rollout:
        """prompt_ids/prompt_mask: (B, P) left-padded. Returns a Rollout of N = B*G rows."""
        ids = prompt_ids.repeat_interleave(num_generations, dim=0)  # (N, P)
        mask = prompt_mask.repeat_interleave(num_generations, dim=0)
        kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            use_cache=True,
        )
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k else 0,
            )
        if params.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = params.repetition_penalty
        was_training = self.model.training
        self.model.eval()
        try:
            with autocast(self.model.device.type, self.autocast_dtype):
                out = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        finally:
            self.model.train(was_training)
        completion_ids = out[:, ids.shape[1] :]  # (N, C)
        cmask, truncated = completion_mask_from_eos(completion_ids, self.eos_ids)
        completion_ids = completion_ids.masked_fill(cmask == 0, self.pad_id)
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        return Rollout(ids, mask, completion_ids, cmask, truncated, texts)


def autocast(device_type: str, dtype: torch.dtype | None):
    """Mixed precision context (fp32 master weights, ``dtype`` matmuls), or a no-op."""
    if dtype is None:
        return torch.autocast(device_type, enabled=False)
    return torch.autocast(device_type, dtype=dtype)
