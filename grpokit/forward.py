"""Completion log-probs: the training forward and the no-grad forwards (old, reference).

``LogProbs(model, rollout, rows)`` gives the (n, C) per-token log-probs of the completion
tokens of ``rows`` under ``model`` (and their entropies), from one of three routes that
compute the same numbers:

- one forward over ``[prompt | completion]`` rows, logits of the completion positions only;
- the **shared-prompt forward** (``share_prompt_forward``): each distinct prompt runs once,
  its KV cache is indexed out to the rows that share it;
- the **fused head** (``fused_logprobs``): the decoder's hidden states go through the output
  layer, log-softmax and entropy token chunk by token chunk (``grpokit.algo.linear_logprobs``,
  each chunk's softmax in one C call where ``grpokit.speed.kernels`` builds), never holding
  the (n, C, V) logits.
"""

from __future__ import annotations

import contextlib

import torch

from grpokit.algo import entropy_from_logits, linear_logprobs, selective_log_softmax
from grpokit.rollout.base import Rollout
from grpokit.rollout.hf import autocast
from grpokit.rollout.kvcache import cache_kwarg, returned_cache, select_cache_rows
from grpokit.speed import packed
from grpokit.speed.attention import shared_mask_attention
from grpokit.speed.kernels import head_log_softmax
from grpokit.speed.layers import lean_layers, transposer
from grpokit.speed.prefix import (
    MIN_SHARED_PREFIX,
    prefix_pays,
    shared_prefix_length,
    split_prefix,
    window_allows,
)
from grpokit.speed.weights import head_weight_arriving_last

# No-grad forwards (reference, old log-probs) run the RMSNorms' C forward (lean_layers with
# grad=False); False: transformers' norms there, as before.
LEAN_NO_GRAD = True

# Rows sharing prompts run as one packed sequence where speed/packed.py applies (False: the
# prompts' forward, then the completions' against their cache; for comparisons)
PACKED = True

# Causal LMs whose logits are exactly ``lm_head(final hidden state)`` (no soft-capping or
# scaling), so the fused head computes the same log-probs as the model's own forward.
FUSED_HEAD_MODEL_TYPES = frozenset(
    ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "olmo", "olmo2",
     "smollm3", "gemma", "gemma3_text")
)  # fmt: skip


def fused_head(model):
    """(decoder, lm_head) when the fused head applies to ``model``, else None."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in FUSED_HEAD_MODEL_TYPES:
        return None
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None
    head = model.get_output_embeddings()
    if type(head) not in (torch.nn.Linear, Float32Head):  # e.g. a LoRA-wrapped lm_head
        return None
    return model.get_decoder(), head


class Float32Head(torch.nn.Linear):
    """An output layer whose weights and product stay float32, under autocast too
    (``cast_lm_head_to_fp32``): logits without bf16 rounding."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            b = None if self.bias is None else self.bias.float()
            return torch.nn.functional.linear(x.float(), self.weight.float(), b)


def cast_lm_head_to_fp32(model) -> None:
    """TRL's ``cast_lm_head_to_fp32``: the output layer in float32 (its weights, and its
    product even under autocast). With tied embeddings the shared weight becomes float32
    and the embedding's outputs are cast back to the model's dtype."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise ValueError(
            f"cast_lm_head_to_fp32: the output layer is a {type(head).__name__}, not a plain "
            "Linear (a LoRA adapter on lm_head?); remove lm_head from lora_target_modules or "
            "set cast_lm_head_to_fp32: false"
        )
    emb = model.get_input_embeddings()
    dtype = emb.weight.dtype
    head.float()
    head.__class__ = Float32Head
    if emb.weight.dtype != dtype:  # tied: the embedding's activations keep the model's dtype
        emb.register_forward_hook(lambda _m, _a, out: out.to(dtype))


def is_checkpointing(model) -> bool:
    """Whether ``model`` (or a PEFT model's base) runs with activation checkpointing."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # new, old name
        if hasattr(type(getattr(model, "get_base_model", lambda: model)()), name):
            return bool(getattr(model, name))
    return False


def shared_prompts(p_ids: torch.Tensor, p_mask: torch.Tensor):
    """(first row of each distinct prompt, (n,) index of each row's prompt) when rows of the
    (n, P) left-padded prompts repeat a prompt, else None."""
    if p_ids.shape[1] < 2:
        return None
    key = torch.cat([p_ids, p_mask], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if uniq.shape[0] == p_ids.shape[0]:
        return None
    n, dev = p_ids.shape[0], p_ids.device
    first = torch.full((uniq.shape[0],), n, dtype=torch.long, device=dev)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=dev), "amin")
    return first, inverse


def pad_cols(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1])) if x.shape[1] < width else x


class LogProbs:
    """Completion log-probs under a model, with the run's temperature and precision.

    ``train_positions`` counts the token positions the graph-building forwards computed
    (the ``tokens_forward`` metric)."""

    def __init__(
        self,
        *,
        temperature: float,
        amp_dtype: torch.dtype | None,
        fused: bool = True,
        share_prompts: bool = True,
        entropy_grad: bool = False,
        min_shared_prefix: int = MIN_SHARED_PREFIX,
    ):
        self.temperature, self.amp_dtype = temperature, amp_dtype
        self.fused, self.share_prompts = fused, share_prompts
        # an entropy bonus needs the entropies' gradient (the fused head gives it when asked)
        self.entropy_grad = entropy_grad
        self.min_shared_prefix = min_shared_prefix  # 0: every prompt computed whole
        self.train_positions = 0

    def __call__(self, model, ro: Rollout, rows, with_entropy: bool = False):
        """(n, C) log-probs of the completion tokens of ``rows`` (and their entropies).

        ``rows`` is a slice or an index tensor. Logits are divided by the sampling
        temperature, so these are the log-probs of the distribution the tokens were sampled
        from. Columns that are padding in every row of ``rows`` are not computed (prompt
        columns on the left, completion columns after the longest completion); positions
        past a row's completion are returned as 0."""
        p_ids, p_mask = ro.prompt_ids[rows], ro.prompt_mask[rows]
        c_ids, c_mask = ro.completion_ids[rows], ro.completion_mask[rows]
        n, C = c_ids.shape
        P = p_ids.shape[1]
        pk = max(1, int(p_mask.sum(-1).max()))  # prompts are left-padded
        ck = max(1, int(c_mask.sum(-1).max()))  # completions are right-padded
        p_ids, p_mask = p_ids[:, P - pk :], p_mask[:, P - pk :]
        c_ids, c_mask = c_ids[:, :ck], c_mask[:, :ck]
        head = fused_head(model) if self.fused else None
        head_w = None if head is None else head_weight_arriving_last(model, head[1].weight)
        # (transformers walks every module to answer this: once a forward)
        checkpointed = is_checkpointing(model)
        shared = None
        if self.share_prompts and not checkpointed:  # (no KV cache when checkpointed)
            shared = shared_prompts(p_ids, p_mask)
        if torch.is_grad_enabled():  # token positions the training forward computes
            u = n if shared is None else shared[0].numel()
            self.train_positions += u * (pk - 1) + n * (ck + 1)
        # one float mask per forward, not one per layer; checkpointed layers recompute
        # their forward in the backward, outside this block: they keep transformers' path
        sharing = contextlib.nullcontext() if checkpointed else shared_mask_attention()
        # gated MLPs and LoRA dropout keep fewer tensors for the backward (speed/layers.py);
        # without grad, RMSNorm's C forward only
        grad = torch.is_grad_enabled()
        lean = lean_layers(model, enabled=(grad or LEAN_NO_GRAD) and not checkpointed, grad=grad)
        with sharing, lean:
            if shared is not None:
                out = None
                if PACKED and head is not None:
                    out = self._forward_packed(model, head[0], p_ids, p_mask, c_ids, c_mask, shared)
                if out is None:
                    out = self._forward_shared(model, head, p_ids, p_mask, c_ids, c_mask, shared)
            else:
                out = self._forward_rows(model, head, p_ids, p_mask, c_ids, c_mask)
        if head is None:
            return self._from_logits(out, c_ids, c_mask, C, with_entropy)
        return self._from_hidden(out, head[1], head_w, c_ids, c_mask, C, with_entropy)

    @torch.no_grad()
    def no_grad(self, model, ro: Rollout, micro_batches) -> torch.Tensor:
        """(N, C) log-probs of every row, computed micro-batch by micro-batch."""
        out = torch.zeros(
            ro.completion_ids.shape, dtype=torch.float32, device=ro.completion_ids.device
        )
        for idx in micro_batches:
            out[idx] = self(model, ro, idx)[0]
        return out

    def _forward_rows(self, model, head, p_ids, p_mask, c_ids, c_mask):
        """Hidden states (fused head) or logits predicting ``c_ids``, (n, ck, .), from one
        forward over [prompt | completion] rows."""
        pk, ck = p_ids.shape[1], c_ids.shape[1]
        ids = torch.cat([p_ids, c_ids], dim=1)  # (n, pk+ck)
        attn = torch.cat([p_mask, c_mask], dim=1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
        with autocast(ids.device.type, self.amp_dtype):
            if head is None:
                out = model(
                    input_ids=ids,
                    attention_mask=attn,
                    position_ids=pos,
                    logits_to_keep=ck + 1,
                    use_cache=False,
                )
                return out.logits[:, :-1]  # (n, ck, V)
            hs = head[0](
                input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False
            ).last_hidden_state  # (n, pk+ck, H)
            return hs[:, pk - 1 : pk + ck - 1]  # the positions predicting c_ids

    def _forward_packed(self, model, net, p_ids, p_mask, c_ids, c_mask, shared):
        """The shared-prompt forward's tokens, positions and attention as one packed sequence
        (``speed/packed.py``): a common prefix once where :meth:`_prompt_cache` would run it
        once, each distinct prompt (or its suffix) but its last token, then each row's [last
        prompt token | completion]. Returns the hidden states predicting ``c_ids`` (n, ck,
        H), or None where packing does not apply (then :meth:`_forward_shared`)."""
        first, inverse = shared
        pre_ids, pre_mask = p_ids[first, :-1], p_mask[first, :-1]
        u, (n, ck) = pre_ids.shape[0], c_ids.shape
        dev = c_ids.device
        L = self._prefix_once(model.config, pre_ids, pre_mask, pre_ids.shape[1] + ck + 1)
        head_ids, pos = [], []
        if L:  # the common prefix once, then each prompt's suffix (speed/prefix.py)
            split = split_prefix(pre_ids, pre_mask, L)
            head_ids += [split.prefix_ids.reshape(-1)]
            pos += [torch.arange(L, device=dev)]
            pre_ids, pre_mask, ppos = split.suffix_ids, split.suffix_mask, split.suffix_pos
        else:
            ppos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
        start = p_mask.sum(-1, keepdim=True) - 1  # position of the last prompt token
        rows = torch.cat([p_ids[:, -1:], c_ids], 1)
        ids = torch.cat([*head_ids, pre_ids.reshape(-1), rows.reshape(-1)])
        pos = torch.cat(
            [*pos, ppos.reshape(-1), (start + torch.arange(ck + 1, device=dev)).reshape(-1)]
        )
        Lp = pre_ids.shape[1]
        with autocast(dev.type, self.amp_dtype):
            if not packed.applies(model, Lp, ck + 1, L):
                return None
            row_mask = torch.cat([p_mask[:, -1:], c_mask], dim=1)
            with packed.packed_attention(packed.Packing(pre_mask, inverse, row_mask, L)):
                hs = net(input_ids=ids[None], position_ids=pos[None], use_cache=False)
        if L and torch.is_grad_enabled():  # the prefix ran once, not u times
            self.train_positions -= (u - 1) * L
        return hs.last_hidden_state[0, L + u * Lp :].view(n, ck + 1, -1)[:, :ck]

    def _forward_shared(self, model, head, p_ids, p_mask, c_ids, c_mask, shared):
        """The same numbers as one forward over [prompt | completion] rows, with each
        distinct prompt computed once: its tokens but the last run through the model for the
        distinct prompts only (their common prefix once, ``_prompt_cache``), the KV cache is
        indexed out to every row (autograd sums the rows' gradients back into the shared
        prompt), then each row runs [last prompt token | completion] against it. Returns the
        hidden states (fused head) or logits predicting ``c_ids``, (n, ck, .)."""
        first, inverse = shared
        ck = c_ids.shape[1]
        ids = torch.cat([p_ids[:, -1:], c_ids], dim=1)  # (n, ck+1)
        start = p_mask.sum(-1, keepdim=True) - 1  # position of the last prompt token
        pos = start + torch.arange(ck + 1, device=ids.device)[None]
        net = model if head is None else head[0]
        extra = {"logits_to_keep": 1} if head is None else {}
        with autocast(ids.device.type, self.amp_dtype):
            cache, cached_mask = self._prompt_cache(
                net, p_ids[first, :-1], p_mask[first, :-1], ck + 1, extra
            )
            select_cache_rows(cache, inverse)
            # the cached columns (in the cache's layout) and these
            attn = torch.cat([cached_mask[inverse], p_mask[:, -1:], c_mask], dim=1)
            out = net(
                input_ids=ids,
                attention_mask=attn,
                position_ids=pos,
                **cache_kwarg(cache),
                use_cache=True,
                **({"logits_to_keep": 0} if head is None else {}),
            )
        return (out.logits if head is None else out.last_hidden_state)[:, :ck]

    def _prefix_once(self, config, pre_ids, pre_mask, total: int) -> int:
        """How many leading tokens the distinct prompts ``pre_ids`` share that run once: their
        common prefix where it is at least ``min_shared_prefix`` long and running it once pays
        (``speed/prefix.py``'s ``prefix_pays``), and no sliding window shorter than ``total``
        positions rules the split out; else 0."""
        L = shared_prefix_length(pre_ids, pre_mask) if self.min_shared_prefix else 0
        if L < max(1, self.min_shared_prefix) or not prefix_pays(pre_ids.shape[0], L):
            return 0
        return L if window_allows(config, total) else 0

    def _prompt_cache(self, net, pre_ids, pre_mask, more: int, extra: dict):
        """(KV cache, (u, W) mask of its columns) of the distinct prompts' tokens ``pre_ids``
        (u, W), left-padded. When they start with a common prefix of at least
        ``min_shared_prefix`` tokens (a system prompt, worked problems) and running it once
        saves enough positions (``speed/prefix.py``'s ``prefix_pays``: a short one costs more as
        a pass of its own than it saves), the prefix runs once and only each prompt's suffix
        after it: the cache then holds
        [prefix | masked slots, suffix] per row, positions as before, so every later query
        sees the same keys at the same positions. ``more``: the positions run after these
        (a sliding window shorter than the whole rules the split out)."""
        L = self._prefix_once(net.config, pre_ids, pre_mask, pre_ids.shape[1] + more)
        u = pre_ids.shape[0]
        if not L:
            pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
            out = net(input_ids=pre_ids, attention_mask=pre_mask, position_ids=pos,
                      use_cache=True, **extra)  # fmt: skip
            return returned_cache(out), pre_mask
        split = split_prefix(pre_ids, pre_mask, L)
        dev = pre_ids.device
        out = net(input_ids=split.prefix_ids, position_ids=torch.arange(L, device=dev)[None],
                  use_cache=True, **extra)  # fmt: skip
        cache = returned_cache(out)
        select_cache_rows(cache, torch.zeros(u, dtype=torch.long, device=dev))
        mask = torch.cat([pre_mask.new_ones(u, L), split.suffix_mask], dim=1)
        net(input_ids=split.suffix_ids, attention_mask=mask, position_ids=split.suffix_pos,
            **cache_kwarg(cache), use_cache=True, **extra)  # fmt: skip
        if torch.is_grad_enabled():  # the prefix ran once, not u times
            self.train_positions -= (u - 1) * L
        return cache, mask

    def _from_logits(self, logits, c_ids, c_mask, C: int, with_entropy: bool):
        logits = logits / self.temperature  # (n, ck, V)
        logp = selective_log_softmax(logits, c_ids) * c_mask
        ent = None
        if with_entropy:
            ent = entropy_from_logits(logits if self.entropy_grad else logits.detach()) * c_mask
        return pad_cols(logp, C), (None if ent is None else pad_cols(ent, C))

    def _from_hidden(self, hs, lm_head, weight, c_ids, c_mask, C: int, with_entropy: bool):
        """The fused head (``weight``: ``lm_head``'s, or its alias that
        ``head_weight_arriving_last`` made) over the completion tokens only, scattered back
        to (n, C)."""
        n, ck = c_ids.shape
        sel = c_mask.bool()
        fp32 = isinstance(lm_head, Float32Head)  # cast_lm_head_to_fp32
        lp, ent = linear_logprobs(
            hs[sel].float() if fp32 else hs[sel],  # (tokens, H)
            weight,
            c_ids[sel],
            bias=lm_head.bias,
            temperature=self.temperature,
            compute_dtype=None if fp32 else self.amp_dtype,
            with_entropy=with_entropy,
            entropy_grad=self.entropy_grad and torch.is_grad_enabled(),
            softmax_rows=head_log_softmax,
            transpose=transposer(),
        )
        flat = torch.nonzero(torch.nn.functional.pad(sel, (0, C - ck)).reshape(-1)).squeeze(1)
        logp = lp.new_zeros(n * C).index_put((flat,), lp).view(n, C)
        if ent is not None:
            ent = ent.new_zeros(n * C).index_put((flat,), ent).view(n, C)
        return logp, ent
