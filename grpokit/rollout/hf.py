"""Rollouts from a transformers model: grpokit's decode loop (``rollout/sampler.py``, the
default) or transformers' ``generate`` (``generation_loop: hf``)."""

from __future__ import annotations

import contextlib
import copy

import torch

from grpokit.rollout.base import Rollout, SamplingParams, completion_mask_from_eos
from grpokit.rollout.sampler import sample
from grpokit.rollout.stops import StopStrings, turn_segments
from grpokit.speed.prefix import MIN_SHARED_PREFIX
from grpokit.speed.weights import effective_weight


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
    """Samples from the policy model itself, or, with ``sampling_dtype`` (bf16 runs of full
    fine-tuning), from a copy of its weights in that dtype, refreshed lazily after
    ``weights_updated()``: one cast per optimizer step instead of autocast re-casting every
    weight at every decoded token. The copy only chooses the samples; log-probs for the loss
    always come from the training model."""

    def __init__(
        self,
        model,
        tokenizer,
        autocast_dtype: torch.dtype | None = None,
        *,
        loop: str = "grpokit",
        sampling_dtype: torch.dtype | None = None,
        fused_decode: bool = True,
        share_prefix: bool = True,
    ):
        if loop not in ("grpokit", "hf"):
            raise ValueError(f"generation_loop={loop!r}: use grpokit or hf")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        )
        self.autocast_dtype = autocast_dtype
        self.loop = loop
        self.fused_decode = fused_decode
        # prompts that start alike (system prompt, worked problems, tool schema): the common
        # prefix is prefilled once for the batch (speed/prefix.py); 0 turns it off
        self.min_shared_prefix = MIN_SHARED_PREFIX if share_prefix else 0
        self.sampling_dtype = sampling_dtype
        self._copy = None
        self._stale = True
        self._shapes = None  # while released (``rollout_phase``): each weight's shape
        # sharded training: a callable yielding the policy's whole parameters in
        # ``model.parameters()`` order (gathered; every rank refreshes at the same point)
        self.full_params = None

    def build_copy(self, dtype: torch.dtype) -> None:
        """Sample from an unsharded ``dtype`` copy (sharded training needs one: the sharded
        policy cannot run a decode loop whose length differs across ranks). Call before the
        policy is wrapped by an engine."""
        self.sampling_dtype = dtype
        self.sampling_model()

    @property
    def sampling_copy(self):
        """The model sampled from instead of the policy (with ``sampling_dtype``): None until
        the first ``generate`` or ``build_copy``; refreshed in place, never replaced."""
        return self._copy

    def weights_updated(self) -> None:
        """The policy's weights changed (optimizer step, resume): refresh the copy."""
        self._stale = True

    @contextlib.contextmanager
    def rollout_phase(self):
        """A round's generation batches (the trainer's): when they end, the copy's weights are
        freed until the next ``generate``. The update makes them stale anyway, and holding them
        through the reference and training passes added them to the step's memory peak
        (SmolLM2-135M in bf16: 0.27 GB of weights; bench/speed.py's peak RSS for config (a)
        fell 0.1-0.2 GB, docs/speed.md). The next ``generate`` allocates them again (from the
        heap's freed blocks) and refreshes them, the copy it makes after every update anyway;
        the model object stays the same."""
        try:
            yield
        finally:
            self._release_copy()

    def _release_copy(self) -> None:
        if self._copy is None or self._shapes is not None:
            return
        params = list(self._copy.parameters())
        self._shapes = [p.shape for p in params]
        for p in params:  # tied weights are one Parameter: released once
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self._stale = True

    def sampling_model(self):
        if self.sampling_dtype is None:
            return self.model, self.autocast_dtype
        peft = hasattr(self.model, "get_base_model")
        if self._copy is None:
            base = self.model.get_base_model() if peft else self.model
            self._copy = _empty_like_model(base, self.sampling_dtype, check_names=not peft)
            self._stale = True
        if self._shapes is not None:  # released after the last rollout phase
            for p, shape in zip(self._copy.parameters(), self._shapes):
                p.data = torch.empty(shape, dtype=p.dtype, device=p.device)
            self._shapes = None
        if self._stale:
            with torch.no_grad():
                if peft:
                    _copy_merged_lora(self._copy, self.model.get_base_model())
                else:
                    src_params = self.full_params() if self.full_params else self.model.parameters()
                    for dst, src in zip(self._copy.parameters(), src_params):
                        dst.copy_(src)
                    for dst, src in zip(self._copy.buffers(), self.model.buffers()):
                        dst.copy_(src)
            self._stale = False
        return self._copy, None

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        params: SamplingParams,
        num_generations: int = 1,
    ) -> Rollout:
        """prompt_ids/prompt_mask: (B, P) left-padded, on any device. Returns a Rollout of
        N = B*G rows on the policy's device."""
        dev = next(self.model.parameters()).device
        prompt_ids, prompt_mask = prompt_ids.to(dev), prompt_mask.to(dev)
        ids = prompt_ids.repeat_interleave(num_generations, dim=0)  # (N, P)
        mask = prompt_mask.repeat_interleave(num_generations, dim=0)
        model, amp = self.sampling_model()
        was_training = model.training
        model.eval()
        try:
            with autocast(model.device.type, amp):
                if self.loop == "grpokit":
                    completion_ids = sample(
                        model,
                        prompt_ids,
                        prompt_mask,
                        num_samples=num_generations,  # each prompt's prefill runs once
                        max_new_tokens=params.max_new_tokens,
                        eos_ids=self.eos_ids,
                        pad_id=self.pad_id,
                        greedy=params.greedy,
                        temperature=params.temperature,
                        top_p=params.top_p,
                        top_k=params.top_k,
                        min_p=params.min_p,
                        repetition_penalty=params.repetition_penalty,
                        min_new_tokens=params.min_new_tokens,
                        fused_decode=self.fused_decode,
                        min_shared_prefix=self.min_shared_prefix,
                    )
                else:
                    out = model.generate(
                        input_ids=ids, attention_mask=mask, **self._hf_kwargs(params)
                    )
                    completion_ids = out[:, ids.shape[1] :]  # (N, C)
        finally:
            model.train(was_training)
        cmask, truncated = completion_mask_from_eos(completion_ids, self.eos_ids)
        completion_ids = completion_ids.masked_fill(cmask == 0, self.pad_id)
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        return Rollout(ids, mask, completion_ids, cmask, truncated, texts)

    @torch.no_grad()
    def generate_turn(
        self,
        contexts: list[list[int]],
        params: SamplingParams,
        *,
        max_new_tokens: int,
        stops: StopStrings | None = None,
        num_generations: int = 1,
    ) -> list[tuple[list[int], str]]:
        """One assistant turn after each of ``contexts`` (token ids: prompt and the turns so
        far), ``num_generations`` rows per context, until EOS, a stop string or
        ``max_new_tokens``: per row (the turn's ids, how it ended: ``rollout.stops``)."""
        if self.loop != "grpokit":
            raise ValueError("multi-turn rollouts need generation_loop: grpokit")
        dev = next(self.model.parameters()).device
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, width - len(c) :], mask[i, width - len(c) :] = torch.tensor(c), 1
        model, amp = self.sampling_model()
        was_training = model.training
        model.eval()
        try:
            with autocast(model.device.type, amp):
                tokens = sample(
                    model, ids.to(dev), mask.to(dev), num_samples=num_generations,
                    max_new_tokens=max_new_tokens, eos_ids=self.eos_ids, pad_id=self.pad_id,
                    greedy=params.greedy, temperature=params.temperature, top_p=params.top_p,
                    top_k=params.top_k, min_p=params.min_p,
                    repetition_penalty=params.repetition_penalty, fused_decode=self.fused_decode,
                    stop=None if stops is None else stops.start(),
                    min_shared_prefix=self.min_shared_prefix,
                )  # fmt: skip
        finally:
            model.train(was_training)
        return turn_segments(tokens, self.eos_ids, stops)

    def _hf_kwargs(self, params: SamplingParams) -> dict:
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
        if params.min_p and not params.greedy:
            kwargs["min_p"] = params.min_p
        if params.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = params.repetition_penalty
        if params.min_new_tokens:
            kwargs["min_new_tokens"] = params.min_new_tokens
        return kwargs


def merged_lora_state_dict(base) -> dict[str, torch.Tensor]:
    """``base``'s state dict under the plain architecture's names, each LoRA layer's active
    adapters merged in (W + scaling * B @ A, computed in fp32; see
    ``grpokit.speed.weights.effective_weight``, which refuses DoRA and other variants). The
    policy's own weights are never modified (no merge/unmerge round trip)."""
    src = base.state_dict()
    merged = {k.replace(".base_layer.", "."): v for k, v in src.items() if "lora_" not in k}
    for name, mod in base.named_modules():
        if hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer"):
            merged[f"{name}.weight"] = effective_weight(mod, torch.float32)
    return merged


def _copy_merged_lora(dst_model, base) -> None:
    """Fill ``dst_model`` (the plain architecture) with ``base``'s weights, LoRA merged in
    (see ``merged_lora_state_dict``), cast to ``dst_model``'s dtype."""
    merged = merged_lora_state_dict(base)
    for k, v in dst_model.state_dict(keep_vars=True).items():
        if k not in merged:
            raise RuntimeError(f"sampling copy: no weight for {k} in the LoRA model")
        v.data.copy_(merged[k])
    buffers = dict(base.named_buffers())  # rotary tables (not in the state dict)
    for k, v in dst_model.named_buffers():
        if k in buffers:
            v.copy_(buffers[k])


def _empty_like_model(model, dtype: torch.dtype, check_names: bool = True):
    """A model of the same class and config with uninitialised ``dtype`` weights, built on
    the meta device: no transient full-precision copy (a deepcopy then cast would leave an
    extra fp32 model's worth of freed memory in the process). Its buffers (rotary tables)
    are filled from ``model`` on the first refresh."""
    with torch.device("meta"):
        twin = type(model)(copy.deepcopy(model.config))
    twin = twin.to(dtype=dtype).to_empty(device=next(model.parameters()).device)
    if hasattr(twin, "tie_weights"):
        twin.tie_weights()  # to_empty gives tied parameters separate storage: tie them again
    for (n, a), (m, b) in zip(twin.named_parameters(), model.named_parameters()):
        if check_names and (n != m or a.shape != b.shape):
            raise RuntimeError(f"sampling copy does not mirror the model ({n} vs {m})")
    twin.eval()
    for p in twin.parameters():
        p.requires_grad_(False)
    if hasattr(model, "generation_config"):
        twin.generation_config = copy.deepcopy(model.generation_config)
    return twin


def autocast(device_type: str, dtype: torch.dtype | None):
    """Mixed precision context (fp32 master weights, ``dtype`` matmuls), or a no-op."""
    if dtype is None:
        return torch.autocast(device_type, enabled=False)
    return torch.autocast(device_type, dtype=dtype)
