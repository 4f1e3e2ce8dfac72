"""A decode step for Llama-family models (Llama, Mistral, Qwen2) written as a dozen tensor
ops per layer, from the model's own weights: same arithmetic as transformers' forward,
without its per-module Python overhead.

Why: at 32 rows a decode step of SmolLM2-135M (30 layers) does ~8.6 GFLOP, a few ms of
matrix products on this CPU, but transformers' forward spent ~90 ms a step in module calls,
mask building and cache bookkeeping. Here each layer is one fused q/k/v product, rotary,
an in-place write into the preallocated cache, one attention call, the output product and
one fused gate/up product, and nothing else. Where the machine built the C kernels of
``speed/kernels.py`` (``StepKernels``), the work between the four products is three C calls
a layer (rotary + cache write + attention, residual add + RMSNorm, SiLU x up) instead of ~20
torch operations; measured on config (a)'s generation (32 rows x 128 tokens, bf16, AMD EPYC
family 26 model 2, same process, alternating): 3.96 -> 3.51 s. Without them, torch's
operations (and the kernel attention alone, or SDPA).

Same mathematics, op for op: RMSNorm in float32 cast back to the weights' dtype before its
scale, rotary tables from the model's own ``rotary_emb`` (so every RoPE scaling variant is
the model's), grouped-query attention with the model's scale, ``act(gate) * up``. The only
differences from transformers are float rounding: a fused product sums in its own order.
``tests/rollout/test_fastdecode.py`` checks the logits against transformers' forward and greedy
tokens against the plain loop.

A PEFT LoRA model decodes here too: each active adapter's ``scaling B A`` (PEFT's
``get_delta_weight``) is added to the weights it fuses, once per rollout (dropout is off in
eval), so LoRA generation costs what full fine-tuning's does. DoRA and other variants, LoRA
biases and non-Linear targets keep the plain path.

Packing the weights costs 0.13-0.15 s for SmolLM2-135M in float32 once the heap is warm (a
copy of every weight into oneDNN's layout; 1.4 s the first time). Inside
``keep_decoders()`` (a round's generation batches under dynamic sampling, an evaluation's
prompt batches, an agent's turns) a decoder is built once and reused while the model's
parameters are unchanged; it is dropped at the block's end, so its copy of the weights is
not held through the training that follows.

Anything else (other architectures, sliding windows shorter than the sequence, autocast,
q/k norms) returns ``None`` from ``FastDecoder.build`` and the caller keeps the plain path.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from grpokit.speed.kernels import (
    decode_attention,
    packed_linear_packer,
    row_chunks,
    step_kernels,
    step_layers,
)
from grpokit.speed.weights import effective_weight, linear_parts

_SUPPORTED = ("llama", "mistral", "qwen2")
_kept: dict[int, tuple[tuple, FastDecoder]] | None = None  # inside keep_decoders()
_ACTS = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu}
# All layers of a step in one C call where every product is a packed one (False: the per-layer
# loop of C calls; for comparisons: the same values)
USE_STEP_LAYERS = True


def why_unsupported(model, total_len: int) -> str | None:
    """Why ``FastDecoder`` cannot reproduce ``model`` over ``total_len`` positions (a short
    reason such as "architecture" or "sliding window"), or None when it can."""
    model = _unwrapped(model)
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in _SUPPORTED:
        return "architecture"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "layout"
    if getattr(cfg, "hidden_act", None) not in _ACTS:
        return "activation"
    if getattr(cfg, "pretraining_tp", 1) not in (1, None):
        return "pretraining_tp"
    window = getattr(cfg, "sliding_window", None)
    if window is not None and getattr(cfg, "use_sliding_window", True) and window < total_len:
        return "sliding window"
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        if window is None or window < total_len:
            return "layer types"
    for layer in inner.layers:
        attn = layer.self_attn
        if any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
            return "q/k norms"
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if linear_parts(getattr(attn, name, None)) is None:
                return f"{name} is not a plain or LoRA Linear"
        for name in ("gate_proj", "up_proj", "down_proj"):
            if linear_parts(getattr(layer.mlp, name, None)) is None:
                return f"{name} is not a plain or LoRA Linear"
    if linear_parts(getattr(model, "lm_head", None)) is None:
        return "lm_head"
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return "logit scaling"
    return None


def _unwrapped(model):
    """The transformers model inside a PEFT wrapper (its LoRA layers in place), else itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _cat_bias(mods, dtype, device) -> torch.Tensor | None:
    bases = [linear_parts(m)[0] for m in mods]
    if all(b.bias is None for b in bases):
        return None
    return torch.cat(
        [
            b.bias
            if b.bias is not None
            else torch.zeros(b.out_features, dtype=dtype, device=device)
            for b in bases
        ]
    )


def _packer(weight: torch.Tensor):
    """A function ``(w, b) -> linear(x) callable`` for this weight's dtype and device. On a
    CPU with oneDNN, bf16 (where oneDNN supports it) and float32 weights are reordered once
    into oneDNN's blocked layout (what inductor's freezing pass does for packed linears),
    which spares the reorder or packing that every plain ``F.linear`` call repeats for its
    few decode rows. Measured at 32 rows: bf16 1.5-1.9x faster a product, bit-identical to
    ``F.linear``; float32 on an AMD EPYC Zen 3 (AVX2), 2 threads, SmolLM2-135M's shapes:
    1.15-1.7x faster per layer product and 1.8-2.0x on the 49,152-row output layer (two
    runs of bench/decode_products.py: 28.5 -> 14.6 and 26.0 -> 14.2 ms), equal to
    ``F.linear`` within float rounding (its sums run in another order: ~1e-5 relative).
    On a CPU with AMX or AVX512-BF16, bf16 weights whose shapes fit AMX's tiles go to
    grpokit's own product instead (``kernels.packed_linear_packer``, ``amx_linear.c``: on AMX
    oneDNN streamed the weights at about half the memory rate at 32 rows; on an AMD EPYC's
    AVX512-BF16 it ran 309-410 GFLOP/s where ours runs 409-440). Anything else: plain
    ``F.linear``."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    if (
        weight.device.type != "cpu"
        or mkldnn is None
        or not hasattr(mkldnn, "_reorder_linear_weight")
        or not torch.backends.mkldnn.is_available()
        or weight.dtype not in (torch.bfloat16, torch.float32)
        or (weight.dtype == torch.bfloat16 and not mkldnn._is_mkldnn_bf16_supported())
    ):
        return lambda w, b: lambda x: F.linear(x, w, b)

    own = packed_linear_packer() if weight.dtype == torch.bfloat16 else None

    def pack(w, b):
        mine = own(w, b) if own is not None else None
        if mine is not None:
            return mine
        packed = mkldnn._reorder_linear_weight(w.contiguous(), None)
        return lambda x: mkldnn._linear_pointwise(x, packed, b, "none", [], "")

    return pack


class _Layer:
    __slots__ = ("ln1", "eps1", "qkv", "o", "ln2", "eps2", "gu", "down")


class FastDecoder:
    """Decode steps of ``model`` (eval, no autocast) against a cache given as per-layer key
    and value tensors (N, KVH, T, D). Fused weights are built once per ``build`` (one
    rollout): they copy the model's current weights, so build again after an update."""

    def __init__(self, model):
        model = _unwrapped(model)  # LoRA: each adapter merged into the fused weights below
        cfg = model.config
        inner = model.model
        self.model = model
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = self.head_dim**-0.5
        self.act = _ACTS[cfg.hidden_act]
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm_w = inner.norm.weight
        self.norm_eps = _eps(inner.norm)
        pack = _packer(model.lm_head.weight)
        self.layers = []
        with torch.no_grad():
            head = linear_parts(model.lm_head)[0]
            self.head = pack(effective_weight(model.lm_head), head.bias)
            for layer in inner.layers:
                a, m = layer.self_attn, layer.mlp
                w = linear_parts(a.q_proj)[0].weight
                ly = _Layer()
                ly.ln1, ly.eps1 = layer.input_layernorm.weight, _eps(layer.input_layernorm)
                ly.ln2, ly.eps2 = (
                    layer.post_attention_layernorm.weight,
                    _eps(layer.post_attention_layernorm),
                )
                ly.qkv = pack(
                    torch.cat(
                        [
                            effective_weight(a.q_proj),
                            effective_weight(a.k_proj),
                            effective_weight(a.v_proj),
                        ]
                    ),
                    _cat_bias([a.q_proj, a.k_proj, a.v_proj], w.dtype, w.device),
                )
                ly.o = pack(effective_weight(a.o_proj), linear_parts(a.o_proj)[0].bias)
                ly.gu = pack(
                    torch.cat([effective_weight(m.gate_proj), effective_weight(m.up_proj)]),
                    _cat_bias([m.gate_proj, m.up_proj], w.dtype, w.device),
                )
                ly.down = pack(effective_weight(m.down_proj), linear_parts(m.down_proj)[0].bias)
                self.layers.append(ly)
        self.inter = linear_parts(inner.layers[0].mlp.gate_proj)[0].out_features
        self._cos = self._sin = None
        self.kernels = self._kernels(model, cfg)
        self.all_layers = None  # every layer in one call (kernels.StepLayers), where it applies
        if self.kernels is not None and self.kernels.dtype == torch.bfloat16:
            self.all_layers = step_layers(
                self.layers, self.norm_w, self.norm_eps, self.n_heads, self.n_kv, self.head_dim
            )

    def _kernels(self, model, cfg):
        """The C kernels for the work between the products (speed/kernels.py), where they
        were built and every weight the step reads has the activations' dtype (so every
        product's output has it too: a mixed-dtype model keeps torch's ops); else None."""
        dt = self.norm_w.dtype
        names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        linears = [
            linear_parts(getattr(layer.self_attn, n, None) or getattr(layer.mlp, n))[0].weight
            for layer in model.model.layers
            for n in names
        ]
        norms = [w for ly in self.layers for w in (ly.ln1, ly.ln2)]
        if (
            cfg.hidden_act in ("silu", "swish")
            and all(w.dtype == dt and w.is_contiguous() for w in norms)
            and self.embed.weight.dtype == dt
            and all(w.dtype == dt for w in linears)
            and linear_parts(model.lm_head)[0].weight.dtype == dt
        ):
            return step_kernels(dt, self.n_heads, self.n_kv, self.head_dim)
        return None

    @classmethod
    def build(cls, model, total_len: int) -> FastDecoder | None:
        """A decoder for ``model``, or None when this module does not reproduce it (see
        ``why_unsupported``) or autocast is on (the caller then runs the model itself)."""
        dev = next(model.parameters()).device
        if torch.is_autocast_enabled(dev.type):
            return None
        if why_unsupported(model, total_len) is not None:
            return None
        if _kept is None:
            return cls(model)
        key = _weights_key(model)
        hit = _kept.get(id(model))
        if hit is not None and hit[0] == key:
            return hit[1]
        _kept[id(model)] = (key, cls(model))
        return _kept[id(model)][1]

    def rotary_tables(self, total_len: int, dtype: torch.dtype) -> None:
        """cos/sin for positions 0..total_len-1, from the model's own rotary module."""
        dev = self.norm_w.device
        pos = torch.arange(total_len, device=dev)[None]
        probe = torch.empty(1, 1, self.head_dim, dtype=dtype, device=dev)
        cos, sin = self.rotary(probe, pos)  # (1, T, D) in dtype
        self._cos, self._sin = cos[0].contiguous(), sin[0].contiguous()

    @torch.no_grad()
    def step(
        self,
        ids: torch.Tensor,  # (n,) the tokens just drawn
        pos: torch.Tensor,  # (n,) their rotary positions
        keys: list[torch.Tensor],  # per layer (n, KVH, T, D), written in place at slot
        values: list[torch.Tensor],
        slot: int,  # cache index of these tokens (the same for every row)
        attend: torch.Tensor,  # (n, slot + 1) bool: which cache entries each row sees
        chunks=None,  # row_chunks(): rows whose first slots are the same (kernels only)
    ) -> torch.Tensor:
        """Logits (n, V) for the next token of each row: float32, or, from the C kernels
        of a bf16 model, the head's bf16 output (what ``.float()`` would widen exactly; the
        sampler reads bf16 as it is, sparing a float32 copy of (n, V) a step)."""
        if self.kernels is not None and ids.device.type == "cpu":
            return self._step_kernels(ids, pos, keys, values, slot, attend, chunks)
        n = ids.shape[0]
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        g = H // KV
        x = self.embed(ids)  # (n, C)
        cos = self._cos[pos][:, None, :]  # (n, 1, D)
        sin = self._sin[pos][:, None, :]
        mask = attend[:, None, None, :]  # (n, 1, 1, S)
        half = D // 2
        for i, ly in enumerate(self.layers):
            h = _rms(x, ly.ln1, ly.eps1)
            qkv = ly.qkv(h)  # (n, (H + 2 KV) D)
            qk = qkv[:, : (H + KV) * D].view(n, H + KV, D)  # rotary on q and k at once
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, (H + KV) * D :].view(n, KV, D)
            kc, vc = keys[i], values[i]
            kc[:, :, slot] = k
            vc[:, :, slot] = v
            # the g query heads of a key/value head attend as g query rows of that head
            q = q.reshape(n, KV, g, D)
            o = decode_attention(q, kc, vc, attend, self.scale)  # the C kernel, if any
            if o is None:
                o = F.scaled_dot_product_attention(
                    q, kc[:, :, : slot + 1], vc[:, :, : slot + 1], attn_mask=mask, scale=self.scale
                )  # (n, KV, g, D)
            x = x + ly.o(o.reshape(n, H * D))
            h = _rms(x, ly.ln2, ly.eps2)
            gu = ly.gu(h)  # (n, 2 I)
            h = self.act(gu[:, : self.inter]) * gu[:, self.inter :]
            x = x + ly.down(h)
        x = _rms(x, self.norm_w, self.norm_eps)
        return self.head(x).float()

    def row_chunks(self, group: torch.Tensor | None, n: int, prefix: int):
        """What :meth:`step` takes as ``chunks``: rows with equal ``group`` ids (contiguous)
        share their first ``prefix`` cache slots, so the attention reads those once for them
        (kernels.row_chunks); None where the step does not run through the kernels."""
        if self.kernels is None:
            return None
        return row_chunks(group, n, prefix, self.n_heads // self.n_kv, self.n_kv)

    def _step_kernels(self, ids, pos, keys, values, slot, attend, chunks=None) -> torch.Tensor:
        """``step`` with the work between the products in C (``StepKernels``): per layer the
        four products and three calls, rotary + cache write + attention, residual add + norm
        (twice: the add closing the MLP opens the next layer's norm), SiLU x up."""
        K, L = self.kernels, self.layers
        if int(pos.max()) >= self._cos.shape[0] or int(pos.min()) < 0:
            raise IndexError(f"decode position past the rotary tables ({self._cos.shape[0]})")
        pos = pos.contiguous()
        attend = attend.contiguous()
        if chunks is None:  # every row alone, made once for all layers
            chunks = self.row_chunks(None, ids.shape[0], 0)
        x = self.embed(ids).contiguous()  # (n, C): the residual stream, updated in place
        h = torch.empty_like(x)
        if self.all_layers is not None and USE_STEP_LAYERS:
            self.all_layers(x, h, self._cos, self._sin, pos, keys, values, slot, attend,
                            self.scale, chunks)  # fmt: skip
            return self.head(h)
        K.add_rms(x, None, L[0].ln1, L[0].eps1, h)
        for i, ly in enumerate(L):
            o = K.rope_attention(
                ly.qkv(h), self._cos, self._sin, pos, keys[i], values[i], slot, attend,
                self.scale, chunks,
            )  # fmt: skip
            K.add_rms(x, ly.o(o), ly.ln2, ly.eps2, h)
            y = ly.down(K.silu_mul(ly.gu(h)))
            if i + 1 < len(L):
                K.add_rms(x, y, L[i + 1].ln1, L[i + 1].eps1, h)
            else:
                K.add_rms(x, y, self.norm_w, self.norm_eps, h)
        return self.head(h)


@contextlib.contextmanager
def keep_decoders():
    """Reuse the decoders ``FastDecoder.build`` makes inside this block for the same model,
    dropped when the outermost block ends. The block is what keeps a reused decoder current:
    wrap only code that does not update the weights (a round's generation, an evaluation).
    The key (each parameter's storage and version counter) is only a guard: fused AdamW
    updates in place without bumping version counters."""
    global _kept
    outer = _kept is not None
    if not outer:
        _kept = {}
    try:
        yield
    finally:
        if not outer:
            _kept = None


def _weights_key(model) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def _eps(norm) -> float:
    for name in ("variance_epsilon", "eps"):
        if hasattr(norm, name):
            return float(getattr(norm, name))
    raise ValueError(f"no epsilon on {type(norm).__name__}")


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMSNorm: normalise in float32, cast back, then scale."""
    return w * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
