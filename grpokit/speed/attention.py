"""Attention for the training forward on CPU: a forward and a backward of our own.

Where the C kernels build (``attention_train.c`` through ``kernels.py``), the forward and the
backward's softmax and its gradient are one C pass per key/value head each (``_forward``,
``_kernel_backward``); otherwise SDPA's forward and the torch backward below.

On CPU, SDPA's flash-attention backward is the slowest part of a GRPO training step on a
small model: measured here, 16 rows x 9 heads x 129 queries x 184 keys in bf16 took ~38 ms
backward against ~4 ms forward (a blocked kernel that recomputes softmax tiles one query
block at a time). With the short sequences of GRPO completions the whole (queries, keys)
score matrix of a few rows fits in memory, so the backward here recomputes it in one go
with batched products and elementwise passes: ~20 ms for the same shape. Past ~192 queries
a row SDPA's blocked kernel wins again (it skips masked blocks), so longer forwards keep it.

Mathematics (the usual attention backward, as flash attention does it on GPUs):

    S = scale * Q K^T (+ mask), P = softmax(S), O = P V
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = scale dS K,
    dK = scale dS^T Q

S, P, dP and dS are float32; the products that consume P and dS run in the inputs' dtype
(bf16 under autocast), as flash attention's do. Grouped-query attention runs on the key/value
heads directly (each key/value head's query heads stacked as extra query rows), so neither
the forward nor the backward repeats keys and values per query head.

Used through :func:`training_attention`, a context manager that routes transformers'
``sdpa`` attention to :func:`sdpa_train_attention` for the forwards that build a graph; the
no-grad forwards (reference, generation) and anything this does not cover (dropout, soft-
capping, attention sinks, non-CPU devices) go to transformers' own function.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from grpokit.speed import kernels

# bound on one (rows, heads, queries, keys) float32 block of the backward; larger batches
# are processed in row slices
_BLOCK_BYTES = 1 << 26
# In float32 SDPA's backward was as fast (27.7 vs 29.5 ms fwd+bwd for 16 x 9 x 129 x 184,
# GQA 3): the route applies to bf16/fp16 only unless this is set (tests set it).
FLOAT32_TOO = False
# Past this many queries SDPA's blocked backward wins (it skips fully masked blocks; this one
# computes every score). bf16 fwd+bwd, ours / SDPA, 9 heads, GQA 3, 16 rows: 65 queries x 120
# keys 0.45, 129 x 184 0.59, 129 x 320 0.70, 193 x 248 0.92, 225 x 280 1.42, 257 x 312 1.58;
# 8 rows x 513 x 568 1.50.
MAX_QUERIES = 192
# the C kernels (``attention_train.c``) for the forward (``_forward``) and the backward's P
# and dS (``_kernel_backward``) where they build; tests turn them off to compare with torch
USE_KERNEL = True


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        # q (B, G, R*Lq, D): the R query heads of key/value head G stacked; k, v (B, G, Lk, D);
        # mask: bool (B or 1, 1, R*Lq, Lk), True = attend, or None
        out = _forward(q, k, v, mask, scale)
        ctx.save_for_backward(q, k, v, out, mask)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, g_out):
        q, k, v, out, mask = ctx.saved_tensors
        scale = ctx.scale
        B, G, Lq, D = q.shape
        Lk = k.shape[2]
        dt = q.dtype
        ct = torch.promote_types(dt, torch.float32)  # scores and softmax: float32 at least
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        per_row = G * Lq * Lk * ct.itemsize
        step = max(1, _BLOCK_BYTES // max(per_row, 1))
        if _kernel_backward(q, k, v, out, g_out, mask, scale, step, (dq, dk, dv)):
            return dq, dk, dv, None, None
        empty_rows = mask is not None and not bool(mask.any(-1).all())
        for s in range(0, B, step):
            e = min(B, s + step)
            qs, ks, vs = q[s:e], k[s:e], v[s:e]
            gs, os_ = g_out[s:e], out[s:e]
            S = torch.matmul(qs.to(ct), ks.to(ct).transpose(-1, -2)).mul_(scale)
            if mask is not None:
                m = mask if mask.shape[0] == 1 else mask[s:e]
                S.masked_fill_(~m, float("-inf"))
            P = torch.softmax(S, dim=-1)
            del S
            if empty_rows:  # a query that sees no key: softmax gives NaN, its output is unused
                P.nan_to_num_(0.0)
            Pl = P.to(dt)
            dv[s:e] = torch.matmul(Pl.transpose(-1, -2), gs.to(dt))
            del Pl
            gf = gs.to(ct)
            dP = torch.matmul(gf, vs.to(ct).transpose(-1, -2))
            delta = (gf * os_.to(ct)).sum(-1, keepdim=True)
            dS = P.mul_(dP.sub_(delta)).mul_(scale)
            del dP
            dSl = dS.to(dt)
            dq[s:e] = torch.matmul(dSl, ks)
            dk[s:e] = torch.matmul(dSl.transpose(-1, -2), qs)
        return dq, dk, dv, None, None


def _forward(q, k, v, mask, scale):
    """The attention forward over stacked query heads (B, G, R*Lq, D) with a bool mask: the C
    kernel (``kernels.attention_forward``) where it applies, else SDPA. The training route and
    the no-grad grouped route both call this, so a no-grad forward's log-probs equal the
    training forward's bit for bit. The kernel: 16 rows x 3 key/value heads x 387 stacked
    queries x 184 keys, bf16, 2 threads (AMD EPYC family 26 model 2): SDPA 6.8-9.7 ms, the
    kernel 2.8-3.6 ms; its outputs differ from SDPA's by one bf16 unit on ~9% of entries (its
    sums in another order), from the float64 model of SDPA's rounding on 7e-5."""
    if USE_KERNEL:
        out = kernels.attention_forward(q, k, v, mask, scale)
        if out is not None:
            return out
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _kernel_backward(q, k, v, out, g_out, mask, scale, step, grads) -> bool:
    """The backward above with P and dS from the C kernel (``kernels.attention_grad_scores``:
    one pass per key/value head, the (queries, keys) tile in the cache, where torch made ~12
    passes over float32 score tensors and two float32 sgemms), the three products that consume
    them torch's; the same rounding points (P and dS in the inputs' dtype before those
    products). Fills ``grads`` (dq, dk, dv) and returns True, or False where the kernel does
    not apply (nothing written). Measured for 16 rows x 3 key/value heads x 3 x 168 queries x
    168 keys, bf16, 2 threads (AMD EPYC family 26 model 2), alternating, median of 9: 29.8-30.2
    -> 8.6-8.8 ms a layer's backward."""
    if not USE_KERNEL:
        return False
    dq, dk, dv = grads
    g_out, out = g_out.contiguous(), out.contiguous()
    for s in range(0, q.shape[0], step):
        e = min(q.shape[0], s + step)
        qs, ks, vs = q[s:e], k[s:e], v[s:e]
        m = mask if mask is None or mask.shape[0] == 1 else mask[s:e]
        got = kernels.attention_grad_scores(qs, ks, vs, out[s:e], g_out[s:e], m, scale)
        if got is None:
            if s == 0:
                return False
            raise RuntimeError("attention_grad_scores failed after its first slice (memory?)")
        P, dS = got
        dv[s:e] = torch.matmul(P.transpose(-1, -2), g_out[s:e])
        del P
        dq[s:e] = torch.matmul(dS, ks)
        dk[s:e] = torch.matmul(dS.transpose(-1, -2), qs)
    return True


def attention(q, k, v, mask, scale, stacked_mask=None):
    """Attention over (B, H, Lq, D) queries and (B, G, Lk, D) keys/values with H = R*G
    (query head h reads key/value head h // R, as transformers' ``repeat_kv``); ``mask`` is
    a bool (B or 1, 1, Lq, Lk) mask (True = attend) or None (no mask); ``stacked_mask``:
    :func:`grouped_mask` of it when already made. Returns (B, H, Lq, D). Differentiable with
    the backward above."""
    B, H, Lq, D = q.shape
    G = k.shape[1]
    R = H // G
    qp = q.reshape(B, G, R * Lq, D)
    mp = stacked_mask
    if mask is not None and mp is None:
        mp = grouped_mask(mask, R)
    out = AttentionFunction.apply(qp, k, v, mp, scale)
    return out.view(B, H, Lq, D)


def grouped_mask(mask: torch.Tensor, R: int) -> torch.Tensor:
    """A (B or 1, 1, Lq, Lk) mask for the R query heads of each key/value head stacked as
    R x Lq rows: (B or 1, 1, R * Lq, Lk), a copy."""
    n, Lq, Lk = mask.shape[0], mask.shape[-2], mask.shape[-1]
    return mask[:, :, None].expand(n, 1, R, Lq, Lk).reshape(n, 1, R * Lq, Lk)


# The training route's grouped mask, made once a forward (every layer's backward keeps the
# same one, instead of a copy each: 30 x 1.1 MiB for 16 rows x 129 x 183): (transformers'
# mask object, R, Lk, grouped mask); emptied with _MASK when the route's block ends
_TRAIN_MASK: list = []


def causal_mask(Lq: int, Lk: int, device) -> torch.Tensor:
    """(1, 1, Lq, Lk) bool: query i (the last Lq positions) sees keys 0 .. Lk - Lq + i."""
    qi = torch.arange(Lq, device=device)[:, None] + (Lk - Lq)
    return (torch.arange(Lk, device=device)[None, :] <= qi)[None, None]


def sdpa_train_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
    **kwargs,
):  # fmt: skip
    """transformers attention-interface function: :func:`attention` for CPU bf16/fp16
    forwards that build a graph, transformers' ``sdpa_attention_forward`` for everything
    else (through :func:`sdpa_shared_mask`)."""
    if torch.is_autocast_enabled("cpu"):
        dt = torch.get_autocast_dtype("cpu")
    else:
        dt = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    unsupported = (
        dropout
        or (dt.itemsize >= 4 and not FLOAT32_TOO)
        or not torch.is_grad_enabled()
        or query.shape[2] > MAX_QUERIES
        or query.device.type != "cpu"
        or not (query.requires_grad or key.requires_grad or value.requires_grad)
        or kwargs.get("softcap") is not None
        or kwargs.get("s_aux") is not None
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or kwargs.get("output_attentions", False)
        or (
            attention_mask is not None
            and (attention_mask.dtype != torch.bool or attention_mask.shape[1] != 1)
        )
        or query.shape[1] % key.shape[1] != 0
        or key.shape[-1] != value.shape[-1]
    )
    if unsupported:
        return sdpa_shared_mask(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            is_causal=is_causal, **kwargs,
        )  # fmt: skip
    Lq, Lk = query.shape[2], key.shape[2]
    mask = attention_mask
    if mask is not None:
        mask = mask[:, :, :, :Lk]
    else:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if causal and Lq > 1:
            mask = causal_mask(Lq, Lk, query.device)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    query, key, value = query.to(dt), key.to(dt), value.to(dt)
    R = query.shape[1] // key.shape[1]
    mp = None
    if mask is not None and attention_mask is not None:  # transformers' one mask a forward
        if _TRAIN_MASK and _TRAIN_MASK[0] is attention_mask and _TRAIN_MASK[1:3] == [R, Lk]:
            mp = _TRAIN_MASK[3]
        else:
            mp = grouped_mask(mask, R)
            _TRAIN_MASK[:] = [attention_mask, R, Lk, mp]
    with torch.autocast("cpu", enabled=False):
        out = attention(query, key, value, mask, scale, stacked_mask=mp)
    return out.transpose(1, 2).contiguous(), None


# The forward's boolean mask and its additive float form: (bool mask, dtype, float mask), then
# ((R, keys), that mask expanded to R x queries rows) once _grouped_no_grad has made it
_MASK: list = []


def sdpa_shared_mask(module, query, key, value, attention_mask, **kwargs):
    """transformers' ``sdpa_attention_forward`` with a boolean mask turned into SDPA's
    additive float mask (0 / -inf, as SDPA converts it) once per forward instead of once per
    layer. On CPU SDPA converts a boolean mask inside each call, and each layer's converted
    copy, an (N, 1, Lq, Lk) float32 tensor, stays saved for the backward: 30 copies of 77 MB
    for 16 rows of 1,075 tokens (SmolLM2-135M), growing with the square of the length. The
    float mask passed instead is one tensor that every layer's backward shares. The same
    values reach the same kernel, so the numbers are unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    m = attention_mask
    if m is not None and m.dtype == torch.bool and m.device.type == "cpu" and m.dim() == 4:
        if torch.is_autocast_enabled("cpu"):  # SDPA runs in the autocast dtype
            dt = torch.get_autocast_dtype("cpu")
        else:
            dt = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
        if not (_MASK and _MASK[0] is m and _MASK[1] == dt):
            additive = torch.zeros(m.shape, dtype=dt, device=m.device)
            _MASK[:] = [m, dt, additive.masked_fill_(~m, float("-inf"))]  # (+ grouped form)
        attention_mask = _MASK[2]
        grouped = _grouped_no_grad(module, query, key, value, attention_mask, kwargs)
        if grouped is not None:
            return grouped, None
        repeated = _gqa_repeated(module, query, key, value, attention_mask, kwargs)
        if repeated is not None:
            out = GQAFlashAttention.apply(
                query, key, value, *repeated, attention_mask, kwargs.get("scaling")
            )
            return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _grouped_no_grad(module, query, key, value, mask, kwargs):
    """A no-grad CPU forward's grouped-query attention without repeating keys and values:
    each key/value head's R query heads as R x Lq query rows of that head (the training
    route's layout), the float mask expanded to them once per forward. Returns transformers'
    (B, Lq, H, D) output, or None where this does not apply (a gradient recorded, no
    grouped heads, no mask, dropout, soft-capping and the like). This is the training
    route's layout and SDPA call (:func:`attention`), so a no-grad forward's log-probs (old,
    reference) equal the training forward's bit for bit under bf16; over repeated heads SDPA
    split the work otherwise (up to 0.16 apart in a bench batch's log-probs). Measured on
    config (a)'s reference log-probs (32 rows x 128 tokens, bf16, AMD EPYC family 26 model 2,
    same process, alternating): 2.72 -> 2.53 s, and no R-times copies of keys and values."""
    r = getattr(module, "num_key_value_groups", 1)
    extras = ("softcap", "position_bias", "cache", "s_aux", "output_attentions")
    if torch.is_autocast_enabled("cpu"):
        dt = torch.get_autocast_dtype("cpu")
    else:
        dt = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    if (
        r < 2
        or mask is None
        # where the training forward takes its own route (sdpa_train_attention), so that
        # the two compute alike; elsewhere both repeat keys and values (and a long forward
        # is spared an R-times copy of its mask)
        or (dt.itemsize >= 4 and not FLOAT32_TOO)
        or query.shape[2] > MAX_QUERIES
        or torch.is_grad_enabled()
        or query.device.type != "cpu"
        or kwargs.get("dropout")
        or any(kwargs.get(x) is not None and kwargs.get(x) is not False for x in extras)
        or query.shape[1] != r * key.shape[1]
        or mask.dim() != 4
        or mask.shape[1] != 1
        or mask.shape[2] != query.shape[2]
    ):
        return None
    B, H, Lq, D = query.shape
    G, Lk = key.shape[1], key.shape[2]
    scale = kwargs.get("scaling")
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    qs = query.reshape(B, G, r * Lq, D)
    keep = _bool_grouped(mask, r, Lk) if USE_KERNEL else None
    if keep is not None:  # the training route's call, so the same numbers
        out = _forward(qs.to(dt), key.to(dt), value.to(dt), keep, scale)
        return out.view(B, H, Lq, D).transpose(1, 2).contiguous()
    m = mask[..., :Lk]
    if len(_MASK) > 3 and _MASK[3] == (r, Lk):
        mp = _MASK[4]
    else:
        mp = grouped_mask(m, r)
        if _MASK and mask is _MASK[2]:
            _MASK[3:] = [(r, Lk), mp]
    out = F.scaled_dot_product_attention(qs, key, value, attn_mask=mp, scale=scale)
    return out.view(B, H, Lq, D).transpose(1, 2).contiguous()


def _bool_grouped(mask, r: int, Lk: int) -> torch.Tensor | None:
    """The boolean grouped mask (True = attend) of an additive 0 / -inf float mask, for the
    forward kernel: made once a forward from the boolean mask :func:`sdpa_shared_mask` turned
    into this one, else read off the values; None when the mask holds other values (biases)."""
    if _MASK and mask is _MASK[2]:
        if not (len(_MASK) > 3 and _MASK[3] == ("bool", r, Lk)):
            _MASK[3:] = [("bool", r, Lk), grouped_mask(_MASK[0][..., :Lk], r).contiguous()]
        return _MASK[4]
    m = mask[..., :Lk]
    keep = m == 0
    if not bool((keep | torch.isneginf(m)).all()):
        return None
    return grouped_mask(keep, r).contiguous()


def _repeat_kv(x: torch.Tensor, r: int) -> torch.Tensor:
    b, g, n, d = x.shape
    return x[:, :, None].expand(b, g, r, n, d).reshape(b, g * r, n, d)


class GQAFlashAttention(torch.autograd.Function):
    """SDPA's CPU flash attention over key/value heads repeated per query head (as
    transformers' ``repeat_kv`` does), saving the key/value heads unrepeated for the backward
    and repeating them again there: the same kernels on the same values as transformers'
    path, whose autograd keeps each layer's repeated copies, R times the key/value heads
    (SmolLM2: 3x, 2.4 GB of a 16-row, 1,075-token micro-batch)."""

    @staticmethod
    def forward(ctx, q, k, v, kk, vv, mask, scale):
        # kk, vv: k and v repeated (no graph); freed after this forward
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, kk, vv, 0.0, False, attn_mask=mask, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.scale, ctx.r = scale, q.shape[1] // k.shape[1]
        return out

    @staticmethod
    def backward(ctx, g_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        r = ctx.r
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g_out, q, _repeat_kv(k, r), _repeat_kv(v, r), out, lse, 0.0, False,
            attn_mask=mask, scale=ctx.scale,
        )  # fmt: skip
        b, g, n, d = k.shape  # the repeat's backward: a sum over each group's query heads
        return dq, dk.view(b, g, r, n, d).sum(2), dv.view(b, g, r, n, d).sum(2), *[None] * 4


def _gqa_repeated(module, query, key, value, mask, kwargs):
    """(key, value) repeated per query head when :class:`GQAFlashAttention` computes what
    transformers' sdpa path would (a float32 graph-building CPU forward with a float mask,
    grouped-query heads, no dropout, soft-capping, position bias or paged cache, and SDPA
    choosing its flash kernel for these inputs), else None."""
    r = getattr(module, "num_key_value_groups", 1)
    extras = ("softcap", "position_bias", "cache", "s_aux", "output_attentions")
    if (
        r < 2
        or kwargs.get("dropout")
        or any(kwargs.get(x) is not None and kwargs.get(x) is not False for x in extras)
        or not torch.is_grad_enabled()
        or torch.is_autocast_enabled("cpu")
        or not query.dtype == key.dtype == value.dtype == mask.dtype == torch.float32
        or query.shape[1] != r * key.shape[1]
        or query.shape[2] < 2
    ):
        return None
    with torch.no_grad():
        kk, vv = _repeat_kv(key, r), _repeat_kv(value, r)
    choice = torch._fused_sdp_choice(query, kk, vv, mask, 0.0, False, scale=kwargs.get("scaling"))
    if choice != int(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        return None
    return kk, vv


@contextlib.contextmanager
def _sdpa_as(fn):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    had = "sdpa" in local
    prev = local.get("sdpa")
    local["sdpa"] = fn
    try:
        yield
    finally:
        _MASK.clear()  # the backward keeps what it needs; the caches hold nothing past here
        _TRAIN_MASK.clear()
        if had:
            local["sdpa"] = prev
        else:
            local.pop("sdpa", None)


@contextlib.contextmanager
def training_attention(enabled: bool = True):
    """Route transformers' ``sdpa`` attention through :func:`sdpa_train_attention` inside
    the block (models loaded with ``attn_implementation="sdpa"``, the default)."""
    if not enabled:
        yield
        return
    with _sdpa_as(sdpa_train_attention):
        yield


@contextlib.contextmanager
def shared_mask_attention():
    """transformers' ``sdpa`` attention through :func:`sdpa_shared_mask` inside the block
    (inside :func:`training_attention`, whose fallback is that function already, nothing
    changes)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if ALL_ATTENTION_FUNCTIONS._local_mapping.get("sdpa") is sdpa_train_attention:
        yield
        return
    with _sdpa_as(sdpa_shared_mask):
        yield
