"""Training forwards of decoder pieces that keep fewer activations for the backward, with
the same values and gradients.

A gated MLP ``down(silu(gate(x)) * up(x))`` under plain autograd keeps four (tokens,
intermediate) tensors a layer for its backward: the gate and up outputs, ``silu(gate)``
(for the product's gradient) and the product (the down projection's input). ``silu(gate)``
is one elementwise op away from the gate output, so :class:`SiLUMul` keeps only the gate
and up outputs and recomputes it in the backward, with the same operations autograd runs
(``silu``, ``silu_backward``, the two products), so forward and gradients are
bit-identical. The product itself (the down projection's input) is not kept either:
:func:`recomputed_when_saved` stores, in its place, how to make it again from gate and up.
Llama's RMSNorm keeps its input, its normalised input and a (tokens, 1) reciprocal; the
normalised input is made again the same way (and where the C kernels build and the weight is
float32, :class:`RMSNormFunction` runs forward and backward as one pass a row each way,
keeping the input and reciprocal only). Together, for SmolLM2-135M in float32, 43.7 ->
27.1 KiB a token a layer (``bench/kept_activations.py``), about 1 GB less for a 16 x
140-token micro-batch. Under bf16 autocast, q/k/v and gate/up also share one bf16 cast of
their normed input (:class:`SharedCastLinears`) where autocast made and kept one per layer:
three (tokens, hidden) bf16 tensors a layer fewer, 207 MiB for a 16 x 129-token
micro-batch of SmolLM2-135M; the same values, and gradients up to the order of one float32
sum (see the class).

A PEFT LoRA layer with dropout keeps, through PEFT's own forward, the dropout's noise and
its output, two (tokens, in_features) float tensors per adapted layer: for SmolLM2-135M with
``lora_dropout`` 0.05 on every linear layer, 28 KiB a token a layer on top of the 44 KiB of
the model's own activations (measured with ``saved_tensors_hooks``). :class:`DropoutLinear`
keeps the layer's input (shared by q/k/v and by gate/up, kept by the adapter anyway) and a
one-byte mask drawn by :func:`keep_mask` in one C pass of a counter hash (0.17 ms for a
(16, 129, 576) mask, torch's CPU ``bernoulli_`` 5.6 ms, the numpy streams used before 2.8 ms:
config (c)'s training step 6.86 -> 5.81 s). The dropout's ``1 / (1 - p)`` and the
adapter's scaling are one scalar inside B's product, which also adds the base layer's output
(``addmm``): no elementwise pass scales the (tokens, in) input or the (tokens, out) output.
Values and gradients equal PEFT's for a given mask up to float rounding (products summed in
another order); the masks themselves come from another generator than PEFT's, so a run with
LoRA dropout draws other (equally likely) masks than PEFT would. Under bf16 autocast the LoRA
layers of q/k/v and of gate/up run through :class:`SharedCastLinears` instead (o too, and
down through :class:`SwiGLUDown`): the base layers and the adapters' A products read one
bf16 cast of their input, each mask applied to that cast, and the input's gradient parts
(the adapters' masked) summed in one C pass; the same numbers as :class:`DropoutLinear`'s
path, bit for bit, on the same masks.

:func:`lean_layers` swaps these into a model for the duration of a block: the MLPs whose
forward is Llama's (Llama, Mistral, Qwen2/3, SmolLM3, OLMo share it, checked by its code),
the norms whose forward is Llama's RMSNorm, and PEFT LoRA ``Linear`` layers with one plain
adapter.
"""

from __future__ import annotations

import contextlib
import math
import types

import numpy as np
import torch
import torch.nn.functional as F

from grpokit.speed import kernels
from grpokit.speed.rotary import lean_rotary, same_function, walked_modules
from grpokit.speed.weights import linear_parts

# RMSNorm through the C kernels where they build and apply (False: torch's operations; for
# comparisons)
USE_RMS_KERNEL = True
# SwiGLU's silu(gate) * up, forward and backward, through the C kernels (elementwise_train.c)
# where they build and apply (False: torch's operations; for comparisons)
USE_SILU_KERNEL = True


class SiLUMul(torch.autograd.Function):
    """``silu(g) * u``, keeping ``g`` and ``u`` (not ``silu(g)``) for the backward."""

    @staticmethod
    def forward(ctx, g, u):
        ctx.save_for_backward(g, u)
        return silu_times(g, u)

    @staticmethod
    def backward(ctx, grad):
        g, u = ctx.saved_tensors
        need_g, need_u = ctx.needs_input_grad[:2]
        if USE_SILU_KERNEL and kernels.silu_mul_applies(g, u):
            return kernels.silu_mul_backward(grad, g, u, need_g, need_u)
        grad_g = grad_u = None
        if need_g:
            grad_g = torch.ops.aten.silu_backward(grad * u, g)
        if need_u:
            grad_u = grad * F.silu(g)
        return grad_g, grad_u


def silu_times(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` without a graph: one C pass where the kernels read the tensors (the
    same rounding as torch's two operations; silu's exp within 2 ulp of torch's), else
    torch's operations. Deterministic, so a recomputation gives the same values."""
    if USE_SILU_KERNEL and kernels.silu_mul_applies(g, u):
        return kernels.silu_mul_forward(g, u)
    return F.silu(g) * u


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u``; through :class:`SiLUMul` when a gradient is recorded."""
    if torch.is_grad_enabled() and (g.requires_grad or u.requires_grad):
        return SiLUMul.apply(g, u)
    return silu_times(g, u)


_GOLDEN = 0x9E3779B97F4A7C15  # the counter's step (SplitMix64's)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keep_mask(shape, p: float) -> torch.Tensor:
    """A uint8 tensor of ``shape`` whose entries are independently 1 with probability ``1 -
    p`` (to within 2**-32: an entry is a uniform 32-bit integer compared with ``ceil(p *
    2**32)``), what ``torch.empty(shape).bernoulli_(1 - p)`` gives, in one C pass (0.1-0.2
    against 2.8 ms for a (16, 129, 576) mask here with the numpy PCG64 streams it replaced,
    and ~20x bernoulli_).

    Reproducible from torch's global generator, which it advances by exactly one draw (a
    64-bit seed): ``torch.manual_seed`` fixes the masks, and the RNG state a checkpoint saves
    restores them. Entries 2j and 2j + 1 are the two halves of SplitMix64's output for the
    counter ``seed + (j + 1) * 0x9E3779B97F4A7C15`` (a hash of seed and position), so the mask
    is the same whatever the number of threads, and the same from the C kernel
    (``kernels.dropout_keep``) or, without the library, from numpy here."""
    n = math.prod(shape)
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
    k = math.ceil(p * 2**32)
    keep = kernels.dropout_keep(tuple(shape), seed, k)
    if keep is not None:
        return keep
    pairs = -(-n // 2)
    j = np.arange(1, pairs + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _splitmix64(np.uint64(seed) + j * np.uint64(_GOLDEN))
    r = np.empty(2 * pairs, dtype=np.uint64)
    r[0::2], r[1::2] = h >> np.uint64(32), h & np.uint64(0xFFFFFFFF)
    return torch.from_numpy((r[:n] >= k).astype(np.uint8)).view(tuple(shape))


class DropoutLinear(torch.autograd.Function):
    """``F.linear(x * keep, w)``: a LoRA adapter's ``lora_A(lora_dropout(x))`` without the
    dropout's ``1 / (1 - p)`` scale, which the caller folds into the adapter's own scaling (a
    scalar applied inside B's product: no pass over any tensor). It keeps ``x`` and a one-byte
    mask for the backward instead of the dropout's float noise and its output, both (tokens,
    in_features) float tensors per adapted layer; ``x`` is shared by the layers that read it
    (q/k/v, gate/up) and kept by the adapter anyway. The mask comes from :func:`keep_mask`.
    Drawing the mask again in the backward instead of keeping it was measured and dropped (it
    doubled the costliest op of the phase)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")  # the backward runs under the forward's autocast
    def forward(ctx, x, w, p: float):
        # uint8: torch's CPU kernels convert bool operands through a slow scalar copy (a bf16
        # (2064, 1536) multiply: 1.55 ms by a bool mask, 0.39 ms by a uint8 one)
        keep = keep_mask(x.shape, p)
        ctx.save_for_backward(x, w, keep)
        xd = kernels.keep_times(x, keep) if x.is_contiguous() else None
        return F.linear(x * keep if xd is None else xd, w)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        x, w, keep = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            xd = x * keep
            grad_w = grad.reshape(-1, grad.shape[-1]).t().mm(xd.reshape(-1, xd.shape[-1]))
        if ctx.needs_input_grad[0]:
            grad_x = grad.matmul(w) * keep
        return grad_x, grad_w, None


def _lean_lora_forward(self, x, *args, **kwargs):
    """PEFT's LoRA ``Linear.forward`` for one plain adapter in training: ``base(x) + scaling *
    B(A(dropout(x)))`` with the dropout through :class:`DropoutLinear` (under no_grad it keeps
    nothing anyway: PEFT's own path) and the scaling (times the dropout's ``1 / (1 - p)``)
    inside B's product, which also adds the base output (one ``addmm``: no separate scale and
    add passes over the (tokens, out_features) output)."""
    (a,) = linear_parts(self)[1]  # the one unmerged active adapter (lean_loras)
    result = self.base_layer(x, *args, **kwargs)
    drop = self.lora_dropout[a]
    A, B = self.lora_A[a], self.lora_B[a]
    xa, scale = x.to(A.weight.dtype), self.scaling[a]
    if isinstance(drop, torch.nn.Dropout) and drop.training and drop.p > 0:
        if torch.is_grad_enabled():
            # under autocast the product casts x itself: no float32 copy of a bf16 input
            # (kept for the backward too), the same values
            xd = x if torch.is_autocast_enabled(x.device.type) else xa
            h, scale = DropoutLinear.apply(xd, A.weight, drop.p), scale / (1 - drop.p)
        else:
            h = A(drop(xa))
    else:
        h = A(drop(xa))
    if B.bias is not None or not isinstance(scale, (int, float)):
        return (result + B(h) * scale).to(result.dtype)
    out = torch.addmm(
        result.reshape(-1, result.shape[-1]), h.reshape(-1, h.shape[-1]), B.weight.t(), alpha=scale
    )
    return out.view(result.shape).to(result.dtype)


class _Recompute:
    """What a saved tensor became inside :func:`recomputed_when_saved`: how to make it again."""

    __slots__ = ("fn", "shape", "stride", "offset")

    def __init__(self, fn, shape, stride, offset):
        self.fn, self.shape, self.stride, self.offset = fn, shape, stride, offset


@contextlib.contextmanager
def recomputed_when_saved(t: torch.Tensor, fn):
    """Inside the block, where autograd saves ``t`` (or a view of it) for the backward it
    keeps ``fn`` instead, and the backward calls ``fn()`` for the values: ``fn`` must give
    ``t``'s values again bit for bit from tensors that are kept anyway (the recomputation is
    the same operations on the same inputs), so nothing changes but what is alive.

    Other saved tensors go to the saved-tensor hooks already set outside the block (an
    activation offload, a memory probe), or are kept as autograd keeps them. ``t`` must own
    its storage, contiguously; otherwise (or without a gradient being recorded, for a tensor
    subclass, or on a torch that cannot name the outer hooks) the block changes nothing."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None or type(t) is not torch.Tensor or not torch.is_grad_enabled():
        yield
        return
    storage = t.untyped_storage()
    ours = (
        t.is_contiguous()
        and t.storage_offset() == 0
        and storage.nbytes() == t.numel() * t.element_size()
    )
    ptr, dtype = storage.data_ptr(), t.dtype
    outer = top(False)
    outer_pack, outer_unpack = outer if outer else (torch.Tensor.detach, None)

    def pack(s):
        mine = ours and type(s) is torch.Tensor and s.dtype == dtype
        if mine and s.untyped_storage().data_ptr() == ptr:
            return _Recompute(fn, s.shape, s.stride(), s.storage_offset())
        return (outer_pack(s),)

    def unpack(packed):
        if isinstance(packed, _Recompute):
            return packed.fn().as_strided(packed.shape, packed.stride, packed.offset)
        return outer_unpack(packed[0]) if outer_unpack else packed[0]

    del t, storage
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


class SharedCastLinears(torch.autograd.Function):
    """Several bias-free linear layers reading one input under autocast, with the input cast
    to ``cdtype`` once and that one cast kept for the backward. Autocast casts it for each
    layer and each layer keeps its own copy: Llama's q/k/v kept three (tokens, hidden) bf16
    copies of one normed input, gate and up two. The same operations otherwise (each layer's
    product of the cast input and its cast weight; in the backward each layer's input
    gradient rounded to ``cdtype``, then summed in the input's dtype, the last layer's
    first): the same values, the same weight gradients, and the input's gradient the same
    float32 sum of the same terms. Autograd adds those terms in the order they become ready,
    which is this one in a plain forward (bit for bit in the tests) but not always (the
    shared-prompt forward's keys and values go through the cache first): the sum's rounding
    can then differ in its last bit, and the run's later numbers with it.

    A layer may carry a LoRA adapter (``adapters[i]``: its dropout probability and scaling;
    its base weight frozen): ``base(x) + scaling * B(A(dropout(x)))`` as PEFT computes it,
    from the same one cast: the dropout's 0/1 mask (:func:`keep_mask`, drawn in the layers'
    order as :class:`DropoutLinear` draws them) applied to the cast (``bf16(x) * keep`` is
    ``bf16(x * keep)``), its ``1 / (1 - p)`` folded into the scaling inside B's product,
    which adds into the base layer's output (``addmm_``). In the backward the adapter's input
    gradient (masked) joins the parts of the one float32 sum. Where every q/k/v (gate/up)
    carries one, this removes per layer and micro-batch the second cast of the normed input
    (the adapter's own), the float32 casts and adds of each part, and the masked float32
    copy (:class:`DropoutLinear` reads the float32 input).

    (Stacking the weights into one product was measured and dropped: the same outputs, but
    gate/up as one (tokens, 2 x intermediate) product made the training step slower.)"""

    @staticmethod
    def forward(ctx, x, cdtype, adapters, *tensors):
        # the layers' weights (for their gradients), their casts to cdtype (_cast), then a
        # (A, B, A's cast, B's cast) for each layer with an adapter, in the layers' order
        n = len(adapters)
        weights, ws, lora = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        with torch.autocast(x.device.type, enabled=False):
            xc = x.to(cdtype)
            outs = tuple(F.linear(xc, w) for w in ws)
            kept = _adapters_forward(xc, outs, adapters, lora[2::4], lora[3::4])
        # the input only for weight gradients (frozen plain layers need their casts only)
        keep_x = bool(lora) or any(ctx.needs_input_grad[3 : 3 + n])
        ctx.save_for_backward(xc if keep_x else None, *ws, *lora[2::4], *lora[3::4], *kept)
        ctx.x_dtype, ctx.x_shape, ctx.weights, ctx.adapters = x.dtype, x.shape, weights, adapters
        ctx.lora_dtypes = [(a.dtype, b.dtype) for a, b in zip(lora[0::4], lora[1::4])]
        return outs

    @staticmethod
    def backward(ctx, *grads):
        xc, *saved = ctx.saved_tensors
        n = len(ctx.adapters)
        ws = saved[:n]
        parts, masks, gws = [], [], [None] * n
        with torch.autocast(ws[0].device.type, enabled=False):
            gs = [None if g is None else g.to(ws[0].dtype) for g in grads]
            lora_grads = _adapters_backward(ctx, xc, gs, ws, saved[n:], parts, masks)
            wanted = [i for i in range(n) if gs[i] is not None and ctx.needs_input_grad[3 + i]]
            if wanted:
                x2 = xc.reshape(-1, xc.shape[-1])
                rows = [gs[i].reshape(-1, gs[i].shape[-1]) for i in wanted]
                for i, gw in zip(wanted, weight_grads(rows, x2, [ctx.weights[i] for i in wanted])):
                    gws[i] = gw
        gx = _input_grad(parts, ctx.x_dtype, masks)
        return (gx, None, None, *gws, *[None] * n, *lora_grads)


def _adapters_forward(xc, outs, adapters, a_casts, b_casts) -> list:
    """Adds each adapter's ``scale * B(A(xc * keep))`` into its layer's output (in place:
    the outputs are fresh products) for :class:`SharedCastLinears`; the tensors its backward
    needs: the masks (None without dropout), then the (tokens, rank) products ``A(...)``."""
    keeps, hs, k = [], [], 0
    for out, spec in zip(outs, adapters):
        if spec is None:
            continue
        p, scale = spec
        keep = keep_mask(xc.shape, p) if p > 0 else None
        h = F.linear(xc if keep is None else _masked(xc, keep), a_casts[k])
        out.view(-1, out.shape[-1]).addmm_(h.view(-1, h.shape[-1]), b_casts[k].t(), alpha=scale)
        keeps.append(keep)
        hs.append(h)
        k += 1
    return keeps + hs


def _adapters_backward(ctx, xc, gs, ws, saved, parts, masks) -> list:
    """The adapters' part of :class:`SharedCastLinears`' backward: appends each layer's input
    gradient parts to ``parts`` (the base layer's, then the adapter's, the last layer's
    first, as autograd orders them) and their dropout masks to ``masks`` (None for a part
    without one: applied when the parts are summed, :func:`_input_grad`); returns the
    adapters' weight gradients (A's, B's, then None for their casts) for the backward."""
    n, m = len(ctx.adapters), len(saved) // 4
    a_casts, b_casts, keeps, hs = saved[:m], saved[m : 2 * m], saved[2 * m : 3 * m], saved[3 * m :]
    slot, k = [], 0  # each layer's place among the adapters (None: no adapter)
    for spec in ctx.adapters:
        slot.append(None if spec is None else k)
        k += spec is not None
    grads = [[None] * 4 for _ in range(m)]
    need_x = ctx.needs_input_grad[0]
    for i in reversed(range(n)):
        g, k = gs[i], slot[i]
        if g is None:
            continue
        if need_x:
            parts.append(g.matmul(ws[i]))
            masks.append(None)
        if k is None:
            continue
        scale, keep = ctx.adapters[i][1], keeps[k]
        g2 = g.reshape(-1, g.shape[-1])
        gh = g2.mm(b_casts[k]).mul_(scale)  # (tokens, rank)
        need = ctx.needs_input_grad[3 + 2 * n + 4 * k :][:2]
        x2 = xc.reshape(-1, xc.shape[-1])
        grads[k] = _adapter_weight_grads(need, gh, g2, x2, keep, hs[k], scale, ctx.lora_dtypes[k])
        if need_x:
            parts.append(gh.mm(a_casts[k]).view(ctx.x_shape))
            masks.append(keep)
    return [t for four in grads for t in four]


def _adapter_weight_grads(need, gh, g2, x2, keep, h, scale, dtypes) -> list:
    """One adapter's A and B gradients (where ``need`` says), then None for their casts:
    ``gh`` its (tokens, rank) gradient before A, ``g2`` the layer's (tokens, out) output
    gradient, ``x2`` the layer's (tokens, in) input before the dropout mask ``keep``, ``h``
    the saved A product, ``dtypes`` A's and B's."""
    gA = gB = None
    if need[0]:
        xd = x2 if keep is None else _masked(x2, keep.view(x2.shape))
        gA = gh.t().mm(xd).to(dtypes[0])
    if need[1]:
        h2 = h.reshape(-1, h.shape[-1])
        if TRANSPOSED_B_GRAD:  # (h^T g)^T: see TRANSPOSED_B_GRAD
            gB = h2.t().mm(g2).t().mul_(scale)
            # a copy laid out as B (.to() hands a bf16 B the transposed view itself)
            gB = torch.empty(gB.shape, dtype=dtypes[1], device=gB.device).copy_(gB)
        else:
            gB = g2.t().mm(h2).mul_(scale).to(dtypes[1])
    return [gA, gB, None, None]


# A LoRA B's (out, rank) gradient g^T h computed as (h^T g)^T, the (rank, tokens) x (tokens,
# out) product, which oneDNN runs faster than (out, tokens) x (tokens, rank): 2,125 tokens,
# rank 16, bf16, 2 threads (AMD EPYC family 25 model 17): gate/up 0.751 -> 0.437 ms, down
# 0.317 -> 0.183, q/o 0.281 -> 0.203, k/v 0.091 -> 0.079 (~0.06 s a step of bench/speed.py's
# (c)); bit-identical results at these shapes. False: g^T h (for comparisons)
TRANSPOSED_B_GRAD = True


def _masked(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``t * keep`` for a uint8 0/1 mask of its shape: one C pass where that applies."""
    out = kernels.keep_times(t, keep) if t.is_contiguous() else None
    return t * keep if out is None else out


# The input gradient of SharedCastLinears' layers summed by one C pass (False: a cast and an
# add a layer, as autograd; for comparisons)
SUMMED_INPUT_GRAD = True


def _input_grad(parts, dtype: torch.dtype, masks=None) -> torch.Tensor | None:
    """The layers' input gradients ``parts`` (each in the cast's dtype, the last layer's
    first; with ``masks``, each part whose mask is not None times its 0/1 mask) each cast to
    ``dtype`` and summed in that order, as autograd sums them: where they are bf16 and
    ``dtype`` float32, one C pass (``kernels.summed_as_float``, bit for bit) in place of a
    cast and an add a layer (q/k/v: 5 passes over (tokens, hidden) float32; with LoRA's
    dropout, and a masking pass an adapter)."""
    if not parts:
        return None
    masks = [None] * len(parts) if masks is None else masks
    if SUMMED_INPUT_GRAD and dtype == torch.float32:
        out = kernels.summed_as_float(parts, masks)
        if out is not None:
            return out
    parts = [p if m is None else _masked(p, m) for p, m in zip(parts, masks)]
    gx = parts[0].to(dtype)
    for p in parts[1:]:
        gx = gx.add_(p.to(dtype))
    return gx


# weight gradients on AMX from products of two plain operands, one of them transposed by a
# C pass first (False: oneDNN's product of the transposed view everywhere; for comparisons)
TRANSPOSED_WEIGHT_GRAD = True

# weight gradients added into the weights' float32 .grad by one C pass in the backward,
# inside weight_grads_into_grad (False: handed to autograd, which casts and adds them)
OWN_GRAD_ACCUMULATION = True
_INTO_GRAD = [0]


@contextlib.contextmanager
def weight_grads_into_grad():
    """Inside the block, :class:`SharedCastLinears` and :class:`SwiGLUDown` add their weights'
    gradients into the weights' float32 ``.grad`` themselves, in one C pass
    (``kernels.into_float``), and hand autograd none for them: what autograd does with
    them is a float32 cast of the bf16 gradient and an in-place add into ``.grad`` (two
    passes and a temporary; the same sums, bit for bit). For a backward that accumulates
    into ``.grad`` (``loss.backward()``), never ``torch.autograd.grad``; a weight without a
    float32 ``.grad`` of its shape, or with hooks, gets its gradient from autograd as ever."""
    _INTO_GRAD[0] += 1
    try:
        yield
    finally:
        _INTO_GRAD[0] -= 1


def _grad_to_add_into(w: torch.Tensor) -> torch.Tensor | None:
    """``w.grad`` where the backward may add ``w``'s gradient into it itself, else None."""
    if not (OWN_GRAD_ACCUMULATION and _INTO_GRAD[0]) or not w.is_leaf:
        return None
    g = w.grad
    if g is None or w._backward_hooks or w._post_accumulate_grad_hooks:
        return None
    if g.layout != torch.strided or g.dtype != torch.float32 or not g.is_contiguous():
        return None
    return g if g.shape == w.shape else None


def weight_grads(gs: list[torch.Tensor], x: torch.Tensor, weights: list) -> list:
    """The weight gradients ``g.t() @ x`` of bias-free linear layers reading one (tokens,
    in) input ``x`` in bf16, for their (tokens, out) output gradients ``gs`` and their
    ``weights``: a gradient in the weight's dtype for each, or None for one added into the
    weight's ``.grad`` here (:func:`weight_grads_into_grad`). oneDNN on AMX multiplies a
    transposed first operand at half its rate or less for these shapes, so there (unless
    :data:`TRANSPOSED_WEIGHT_GRAD` is off) one operand is transposed by a C pass first
    (``kernels.transposed``) and the product reads two plain ones: a ``g`` with fewer
    columns than ``x`` itself (a down projection's 576 x 1536, k/v's 192 x 576: 5.0 -> 2.2 and
    0.80 -> 0.52 ms for 2,064 tokens), else ``x``, once for all the layers, and the product is
    the gradient's transpose ``x.t() @ g`` (gate/up's 1536 x 576: 6.0-6.4 -> 4.2-4.3 ms for
    both with x's transpose, q/o's 576 x 576: 1.6 -> 1.4; Intel Xeon family 6 model 167, 2
    threads), turned back in the pass that widens it to float32. The same products, summed by
    oneDNN in another order: a result can differ in its last bit."""
    transpose, xt, out = transposer(), None, []
    for g, w in zip(gs, weights):
        flip = False
        if transpose is None:
            p = g.t().mm(x)
        elif g.shape[1] < x.shape[1]:
            p = transpose(g).mm(x)
        else:
            xt = transpose(x) if xt is None else xt
            p, flip = xt.mm(g), True
        into = _grad_to_add_into(w)
        if into is not None and kernels.into_float(p, into, flip) is not None:
            torch.autograd.graph.increment_version(into)  # "reached" (KeptGradients)
            out.append(None)
            continue
        made = kernels.into_float(p, None, flip) if w.dtype == torch.float32 else None
        out.append(made if made is not None else (p.t() if flip else p).to(w.dtype).contiguous())
    return out


def transposer():
    """``kernels.transposed`` where weight gradients have one operand transposed by it
    before their product (:func:`weight_grads`: the narrower gradient or the layers' input;
    the output layer's blocks, ``grpokit.algo.linear_logprobs``'s ``transpose``): on AMX,
    unless :data:`TRANSPOSED_WEIGHT_GRAD` is off. Else None."""
    return kernels.transposed if TRANSPOSED_WEIGHT_GRAD and kernels.amx_products() else None


# Inside lean_layers: the weights' casts to the autocast dtype made in this block, as
# autocast's own cache keeps them for its region (one cast a weight a forward, however many
# times the shared-prompt forward runs the layers); {id(weight): (weight, version, cast)}.
# Inside step_casts, every lean_layers block shares that block's cache. A frozen weight's
# cast is kept on the weight itself, across blocks (see _cast).
_CASTS: list[dict] = []
_STEP_CASTS: list[dict] = []


@contextlib.contextmanager
def step_casts(enabled: bool = True):
    """One cast of each trained weight for every training forward inside the block (an
    optimizer step's micro-batches: the weights change only at the step, after the block),
    not one a micro-batch. The casts are those the backward keeps anyway, so the memory peak
    does not grow; they are dropped at the block's end, before the optimizer step. The
    caller must not update the weights inside (fused AdamW writes in place without bumping
    the version counters that would otherwise tell)."""
    if not enabled:
        yield
        return
    _STEP_CASTS.append({})
    try:
        yield
    finally:
        _STEP_CASTS.pop()


def _cast(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``w.detach().to(dtype)``, made once: for a trained weight once a lean_layers block (it
    changes every step), for a frozen one once until it changes in place (its version
    counter), kept on the weight. Autocast caches the casts of weights that require grad for
    its region only, and never those of frozen weights: LoRA's base layers (and the reference
    forward, the same layers with the adapter off) cast every weight at every call, several
    times a micro-batch: ~0.2 s of config (c)'s training step and as much of its reference
    forward (SmolLM2-135M, LoRA on every linear layer); kept, 2 bytes a weight (212 MB)."""
    if not w.requires_grad:
        hit = w.__dict__.get("_grpokit_cast")
        if hit is not None and hit[0] == w._version and hit[1].dtype == dtype:
            return hit[1]
        c = w.detach().to(dtype)
        w.__dict__["_grpokit_cast"] = (w._version, c)
        return c
    cache = _CASTS[-1] if _CASTS else None
    hit = None if cache is None else cache.get(id(w))
    if hit is not None and hit[0] is w and hit[1] == w._version and hit[2].dtype == dtype:
        return hit[2]
    c = w.detach().to(dtype)
    if cache is not None:
        cache[id(w)] = (w, w._version, c)
    return c


def shared_cast(x: torch.Tensor, layers, cast: bool = True) -> tuple[torch.Tensor, ...] | None:
    """``tuple(layer(x) for layer in layers)`` through :class:`SharedCastLinears` where that
    changes what is kept: a gradient recorded, under CPU autocast to a dtype ``x`` is not in
    (so each layer would cast and keep its own copy), every layer a plain bias-free
    ``nn.Linear`` over ``x``'s features, or PEFT's LoRA ``Linear`` around a frozen one with
    one plain adapter (:func:`lora_parts`), the base weights float and of one dtype. None
    elsewhere. ``cast=False``: also for an ``x`` already in the autocast dtype (nothing is
    shared then; the weights' gradients come from :func:`weight_grads`, an adapter's input
    gradient joins the base layer's in one sum)."""
    dev = x.device.type
    if not (torch.is_grad_enabled() and dev == "cpu" and torch.is_autocast_enabled(dev)):
        return None
    cdtype = torch.get_autocast_dtype(dev)
    if (cast and x.dtype == cdtype) or not x.is_floating_point():
        return None
    ws, adapters, lora = [], [], []
    for m in layers:
        if type(m) is torch.nn.Linear and m.bias is None:
            ws.append(m.weight)
            adapters.append(None)
            continue
        parts = lora_parts(m)
        if parts is None:
            return None
        base, A, B, p, scale = parts
        ws.append(base.weight)
        adapters.append((p, scale))
        lora += [A.weight, B.weight, _cast(A.weight, cdtype), _cast(B.weight, cdtype)]
    if len({w.dtype for w in ws}) != 1 or not ws[0].is_floating_point():
        return None
    if ws[0].shape[1] != x.shape[-1]:
        return None
    casts = (_cast(w, cdtype) for w in ws)
    return SharedCastLinears.apply(x, cdtype, tuple(adapters), *ws, *casts, *lora)


# LoRA layers through SharedCastLinears under autocast (False: _lean_lora_forward's
# DropoutLinear, each layer casting its input itself; for comparisons)
SHARED_LORA_CASTS = True


def lora_parts(mod):
    """(base layer, A, B, dropout probability, scaling) of PEFT's LoRA ``Linear`` on CPU with
    one active plain unmerged adapter (:func:`_one_adapter`) whose :class:`SharedCastLinears`
    form is PEFT's forward: a bias-free frozen base layer, bias-free A and B, ``nn.Dropout`` (its
    probability in training, 0 in eval) or ``nn.Identity``, a number for the scaling; the
    probability is 0 without dropout and the scaling includes its ``1 / (1 - p)``. None for
    anything else (and with :data:`SHARED_LORA_CASTS` off)."""
    one = _one_adapter(mod) if SHARED_LORA_CASTS else None
    if one is None:
        return None
    base, a = one
    A, B, drop, scale = mod.lora_A[a], mod.lora_B[a], mod.lora_dropout[a], mod.scaling[a]
    if base.bias is not None or base.weight.requires_grad or not isinstance(scale, (int, float)):
        return None
    if any(type(t) is not torch.nn.Linear or t.bias is not None for t in (A, B)):
        return None
    if type(drop) is torch.nn.Identity or (type(drop) is torch.nn.Dropout and not drop.training):
        return base, A, B, 0.0, scale
    if type(drop) is not torch.nn.Dropout or not 0 <= drop.p < 1:
        return None
    return base, A, B, drop.p, scale / (1 - drop.p) if drop.p > 0 else scale


class SwiGLUDown(torch.autograd.Function):
    """``down(silu(g) * u)`` for a bias-free down projection under CPU autocast, with ``g``
    and ``u`` in the autocast dtype: keeps ``g``, ``u`` and the weight's cast, not the
    product ``silu(g) * u``. The backward computes the product's gradient first, then one C
    pass makes ``silu(g) * u`` again together with ``g``'s and ``u``'s gradients (one exp and
    one read of ``g`` and ``u`` an element; :class:`SiLUMul` and the recomputation of its
    output made two), then the weight's gradient from it (:func:`weight_grads`). The same
    operations on the same values as :class:`SiLUMul` followed by
    ``shared_cast(m, (down,), cast=False)`` with ``m`` recomputed: the same numbers, bit for
    bit. A LoRA down projection (``adapter``: its dropout probability and scaling, then A, B
    and their casts) adds its adapter as :class:`SharedCastLinears` does, its input-gradient
    part (masked) added to the base layer's before the pass, its A's gradient from the
    product made again there."""

    @staticmethod
    def forward(ctx, g, u, adapter, weight, wc, *lora):
        m = kernels.silu_mul_forward(g, u)
        with torch.autocast(g.device.type, enabled=False):
            y = F.linear(m, wc)
            kept = []
            if adapter is not None:
                kept = _adapters_forward(m, (y,), (adapter,), lora[2:3], lora[3:4])
        ctx.save_for_backward(g, u, wc, *lora[2:], *kept)
        ctx.weight, ctx.adapter = weight, adapter
        ctx.lora_dtypes = [t.dtype for t in lora[:2]]
        return y

    @staticmethod
    def backward(ctx, dy):
        g, u, wc, *lora = ctx.saved_tensors
        need_g, need_u, _, need_w = ctx.needs_input_grad[:4]
        with torch.autocast(g.device.type, enabled=False):
            dy = dy.to(wc.dtype)
            dy2 = dy.reshape(-1, dy.shape[-1])
            gh = None if ctx.adapter is None else dy2.mm(lora[1]).mul_(ctx.adapter[1])
            if need_g or need_u:
                dm = dy.matmul(wc)
                if gh is not None:  # the adapter's part, masked, as _input_grad adds it
                    part = gh.mm(lora[0]).view(dm.shape)
                    dm = dm.add_(part if lora[2] is None else _masked(part, lora[2]))
                m, dg, du = kernels.silu_mul_backward_remake(dm, g, u, need_g, need_u)
            else:
                m, dg, du = kernels.silu_mul_forward(g, u), None, None
            m2, dw = m.reshape(-1, m.shape[-1]), None
            if need_w:
                (dw,) = weight_grads([dy2], m2, [ctx.weight])
            lora_grads = []
            if gh is not None:  # (lora: A's and B's casts, the mask, A's product)
                need, scale = ctx.needs_input_grad[5:7], ctx.adapter[1]
                args = (gh, dy2, m2, lora[2], lora[3], scale, ctx.lora_dtypes)
                lora_grads = _adapter_weight_grads(need, *args)
        return dg, du, None, dw, None, *lora_grads


# SwiGLUDown where it applies (False: SiLUMul, then the down projection; for comparisons)
FUSED_SWIGLU_DOWN = True


def swiglu_down(g: torch.Tensor, u: torch.Tensor, down) -> torch.Tensor | None:
    """``down(silu(g) * u)`` through :class:`SwiGLUDown` where it applies (a gradient
    recorded, CPU autocast to ``g``'s and ``u``'s dtype, ``down`` a plain bias-free
    ``nn.Linear`` with a float weight or a LoRA layer around one (:func:`lora_parts`), the C
    kernels for them); None elsewhere."""
    dev = g.device.type
    if not (FUSED_SWIGLU_DOWN and USE_SILU_KERNEL and torch.is_grad_enabled() and dev == "cpu"):
        return None
    if not torch.is_autocast_enabled(dev):
        return None
    parts = None if type(down) is torch.nn.Linear else lora_parts(down)
    if parts is None and type(down) is not torch.nn.Linear:
        return None
    base = down if parts is None else parts[0]
    cdtype, w = torch.get_autocast_dtype(dev), base.weight
    if base.bias is not None or g.dtype != cdtype or not w.is_floating_point():
        return None
    if not (g.requires_grad or u.requires_grad or w.requires_grad or parts is not None):
        return None
    if w.shape[1] != g.shape[-1] or not kernels.silu_mul_applies(g, u):
        return None
    if parts is None:
        return SwiGLUDown.apply(g, u, None, w, _cast(w, cdtype))
    _, A, B, p, scale = parts
    lora = (A.weight, B.weight, _cast(A.weight, cdtype), _cast(B.weight, cdtype))
    return SwiGLUDown.apply(g, u, (p, scale), w, _cast(w, cdtype), *lora)


def _lean_forward(self, x):
    """Llama's MLP, keeping gate and up (:class:`SiLUMul`) and not the down projection's
    input, which the backward makes again from them; under autocast gate and up share one
    cast of ``x`` (:func:`shared_cast`), kept once, not twice, and the down projection's
    backward remakes its input in the pass of SiLU's backward (:func:`swiglu_down`)."""
    g, u = shared_cast(x, (self.gate_proj, self.up_proj)) or (self.gate_proj(x), self.up_proj(x))
    out = swiglu_down(g, u, self.down_proj)
    if out is not None:
        return out
    m = silu_mul(g, u)
    with recomputed_when_saved(m, lambda: silu_times(g.detach(), u.detach())):  # the same pass
        out = shared_cast(m, (self.down_proj,), cast=False)  # (its weight's gradient, faster)
        return self.down_proj(m) if out is None else out[0]


def _shared_qkv(attn) -> list:
    """(layer, forward) swaps making ``attn``'s q, k and v projections share one cast of
    their input (:func:`shared_cast`): ``q_proj`` computes all three and hands k and v to
    ``k_proj`` and ``v_proj`` when they are called next on the same input, as Llama's
    attention forward does (checked by its code in :func:`qkv_attentions`); any other call
    runs the layer's own forward (a LoRA layer's :func:`_lean_lora_forward`). ``o_proj``
    (whose input is already in the autocast dtype) runs through it too, with nothing to
    share: for its weight's gradient (:func:`weight_grads`), or its adapter's input gradient
    summed with the base layer's."""
    handed: dict = {}
    q, k, v, o = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj

    def q_forward(self, x):
        handed.clear()
        outs = shared_cast(x, (q, k, v))
        if outs is None:
            return _own_forward(self, x)
        handed.update(x=x, k=outs[1], v=outs[2])
        return outs[0]

    def handed_on(name):
        def forward(self, x):
            if handed.get("x") is x and name in handed:
                out = handed.pop(name)
                if "k" not in handed and "v" not in handed:
                    handed.clear()
                return out
            return _own_forward(self, x)

        return forward

    def o_forward(self, x):
        out = shared_cast(x, (self,), cast=False)
        return _own_forward(self, x) if out is None else out[0]

    swaps = [(q, q_forward), (k, handed_on("k")), (v, handed_on("v"))]
    return swaps + [(o, o_forward)] if _shareable(o) else swaps


def _shareable(layer) -> bool:
    """Whether :func:`shared_cast` may take ``layer``: a plain ``nn.Linear``, or a LoRA layer
    it runs with its adapter (:func:`lora_parts`)."""
    return type(layer) is torch.nn.Linear or lora_parts(layer) is not None


def _own_forward(layer, x):
    """What ``layer`` runs inside :func:`lean_layers` where :func:`shared_cast` does not
    apply: a plain layer's product, a LoRA layer's :func:`_lean_lora_forward`."""
    if type(layer) is torch.nn.Linear:
        return F.linear(x, layer.weight, layer.bias)
    return _lean_lora_forward(layer, x)


def qkv_attentions(model) -> list[torch.nn.Module]:
    """The attention modules of ``model`` whose forward is Llama's (its code, under
    transformers' decorators) with q/k/v projections :func:`shared_cast` may take (plain
    ``nn.Linear``, or PEFT LoRA layers with one plain adapter: :func:`_shareable`)."""
    ref = _llama_forward("LlamaAttention")
    names = ("q_proj", "k_proj", "v_proj")
    return [
        m
        for m in walked_modules(model)
        if _same_code(m, ref) and all(_shareable(getattr(m, n, None)) for n in names)
    ]


class RMSNormFunction(torch.autograd.Function):
    """Llama's RMSNorm with a float32 weight, forward and backward each one C call
    (``kernels.rms_norm_forward`` / ``rms_norm_backward``: one pass a row where autograd
    ran ~10 over (tokens, hidden) float32 tensors), keeping the input and the (tokens,)
    reciprocal, as the lean torch path below does. Sums in another order than torch's."""

    @staticmethod
    def forward(ctx, x, w, eps: float):
        y, r = kernels.rms_norm_forward(x, w, eps)  # the caller checked that it applies
        ctx.save_for_backward(x, w, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, r = ctx.saved_tensors
        out = kernels.rms_norm_backward(dy, x, w, r, ctx.needs_input_grad[1])
        if out is None:  # not expected: forward and backward read the same tensors
            raise RuntimeError(f"RMSNorm kernel declined its backward: dy {dy.dtype} {dy.shape}")
        return out[0] if ctx.needs_input_grad[0] else None, out[1], None


# Frozen float32 weights' autocast casts made once and kept (False: autocast's cast at every
# call; for comparisons)
FROZEN_CASTS = True


def frozen_linears(model) -> list[torch.nn.Module]:
    """``model``'s plain ``nn.Linear`` layers on CPU whose floating weight is not trained (a
    LoRA adapter's base layers, a frozen reference: float32, or lowered to bf16 by
    ``speed.weights.lower_frozen_linears``), for :func:`_frozen_cast_forward`."""
    return [
        m
        for m in walked_modules(model)
        if type(m) is torch.nn.Linear
        and not m.weight.requires_grad
        and m.weight.is_floating_point()
        and m.weight.device.type == "cpu"
    ]


# Inside lean_layers: the last input a frozen layer cast under autocast without grad, with its
# cast ((x, version, cast) or None): q, k and v (and gate and up) read one input, each of
# them cast it (False: a cast a layer; for comparisons)
SHARED_INPUT_CASTS = True
_INPUT_CAST: list = []


def _input_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)``; without grad, inside :func:`lean_layers`, the cast made for the same
    unchanged ``x`` by the last frozen layer that read it (the same values). With grad each
    layer's own cast stays (autograd sums their gradients in float32); an inference tensor
    (no version counter to tell a change) is cast each time."""
    if torch.is_grad_enabled() or not _INPUT_CAST or not SHARED_INPUT_CASTS or x.is_inference():
        return x.to(dtype)
    last = _INPUT_CAST[-1]
    if last is not None and last[0] is x and last[1] == x._version and last[2].dtype == dtype:
        return last[2]
    c = x.to(dtype)
    _INPUT_CAST[-1] = (x, x._version, c)
    return c


def _frozen_cast_forward(self, x):
    """``nn.Linear.forward`` of a frozen layer with, under CPU autocast, its weight's kept
    cast (:func:`_cast`) and, without grad, its input's cast shared with the layers before it
    that read the same input (:func:`_input_cast`; a reference forward cast each layer
    normed input five times a layer: ~45 ms of config (a)'s reference pass): the same
    values, the same product."""
    dev = x.device.type
    if not torch.is_autocast_enabled(dev) or not x.is_floating_point():
        return F.linear(x, self.weight, self.bias)
    dt = torch.get_autocast_dtype(dev)
    b = None if self.bias is None else self.bias.to(dt)
    with torch.autocast(dev, enabled=False):
        return F.linear(_input_cast(x, dt), _cast(self.weight, dt), b)


def _lean_norm_forward(self, hidden_states):
    """Llama's RMSNorm, the same operations, with the normalised input (what the product
    with the weight keeps) made again in the backward from the input and the (tokens, 1)
    reciprocal, which the backward keeps anyway; through :class:`RMSNormFunction` where
    the C kernels read the tensors (a float32 weight, under autocast)."""
    eps = self.variance_epsilon
    if USE_RMS_KERNEL and kernels.rms_norm_applies(hidden_states, self.weight):
        if torch.is_grad_enabled() and (hidden_states.requires_grad or self.weight.requires_grad):
            return RMSNormFunction.apply(hidden_states, self.weight, eps)
        return kernels.rms_norm_forward(hidden_states, self.weight, eps)[0]
    input_dtype = hidden_states.dtype
    hs = hidden_states.to(torch.float32)
    r = torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + eps)
    n = (hs * r).to(input_dtype)
    with recomputed_when_saved(n, lambda: (hs * r).to(input_dtype)):
        return self.weight * n


def _llama_forward(name: str):
    try:
        from transformers.models.llama import modeling_llama
    except ImportError:  # pragma: no cover - transformers without llama
        return None
    return getattr(getattr(modeling_llama, name, None), "forward", None)


_SAME_CODE: dict = {}  # (a class's forward, ref) -> whether their code is the same


def _same_code(mod, ref) -> bool:
    """Whether ``mod``'s class runs exactly ``ref``'s forward (bytecode, names, constants);
    remembered per (forward function, ``ref``): a LoRA model has thousands of modules, and
    each forward's lean_layers block asks for all of them."""
    fwd = getattr(type(mod), "forward", None)
    if fwd is None or ref is None:
        return False
    key = (fwd, ref)
    hit = _SAME_CODE.get(key)
    if hit is None:  # (under decorators such as deprecate_kwarg)
        hit = _SAME_CODE[key] = same_function(fwd, ref)
    return hit


def _is_silu(act) -> bool:
    if isinstance(act, torch.nn.SiLU):
        return True
    cls = type(act)  # transformers' own: F.silu(input)
    return cls.__name__ == "SiLUActivation" and cls.__module__ == "transformers.activations"


def gated_silu_mlps(model) -> list[torch.nn.Module]:
    """The MLP modules of ``model`` that compute exactly ``down(silu(gate(x)) * up(x))``:
    their class's forward has the bytecode of transformers' ``LlamaMLP.forward`` and their
    activation is SiLU."""
    ref = _llama_forward("LlamaMLP")
    return [
        m
        for m in walked_modules(model)
        if _same_code(m, ref) and _is_silu(getattr(m, "act_fn", None))
    ]


def rms_norms(model) -> list[torch.nn.Module]:
    """The norm modules of ``model`` whose class runs transformers' ``LlamaRMSNorm.forward``
    (Llama, Mistral, Qwen2/3, SmolLM3 share it; Gemma's ``1 + weight`` does not)."""
    ref = _llama_forward("LlamaRMSNorm")
    return [m for m in walked_modules(model) if _same_code(m, ref)]


def _one_adapter(mod):
    """(base layer, adapter name) of PEFT's LoRA ``Linear`` on CPU with exactly one active,
    plain, unmerged adapter (see ``grpokit.speed.weights.linear_parts``); None for anything
    else. A layer with any adapter merged is left alone: PEFT's forward then runs its base
    layer only."""
    if type(mod).__name__ != "Linear" or not type(mod).__module__.startswith("peft."):
        return None
    parts = linear_parts(mod)
    if parts is None or len(parts[1]) != 1 or getattr(mod, "merged", False):
        return None
    return (parts[0], parts[1][0]) if parts[0].weight.device.type == "cpu" else None


def lean_loras(model) -> list[torch.nn.Module]:
    """``model``'s PEFT LoRA ``Linear`` layers with exactly one active, plain, unmerged
    adapter, on CPU (:func:`_one_adapter`), for :func:`_lean_lora_forward`."""
    return [m for m in walked_modules(model) if _one_adapter(m) is not None]


# The reference forward of a LoRA policy switches its adapters off with adapters_off's own
# swap where it applies (False: PEFT's disable_adapter always; for comparisons)
OWN_ADAPTER_SWITCH = True
_PEFT_WRAPPERS = ("PeftModel", "LoraModel")


def _plain_lora_layers(model) -> list[torch.nn.Module] | None:
    """Every PEFT layer of ``model`` when each is a LoRA ``Linear`` with one plain, active,
    unmerged adapter on CPU (:func:`_one_adapter`) and nothing else of PEFT's is inside
    (modules_to_save wrappers, other tuners, prompt learning); else None."""
    layers = []
    for m in model.modules():
        cls = type(m)
        if not cls.__module__.startswith("peft."):
            continue
        if cls.__name__.startswith(_PEFT_WRAPPERS):
            continue
        if _one_adapter(m) is None or "forward" in m.__dict__:  # (another swap's)
            return None
        layers.append(m)
    return layers


def _base_forward(self, x, *args, **kwargs):
    return self.base_layer(x, *args, **kwargs)


@contextlib.contextmanager
def adapters_off(model):
    """``model`` (a PEFT LoRA model) computing its base model inside the block: what PEFT's
    ``disable_adapter()`` gives (a disabled LoRA layer returns its base layer's output), by
    giving each LoRA layer its base layer's forward for the block. PEFT's own switch enters
    and leaves every layer (~0.1 s a reference forward of SmolLM2-135M with LoRA on every
    linear layer, ~2,500 modules); this one walks once. Anything but plain single-adapter LoRA
    layers keeps PEFT's switch."""
    layers = _plain_lora_layers(model) if OWN_ADAPTER_SWITCH else None
    if not layers:
        with model.disable_adapter():
            yield
        return
    for m in layers:
        m.forward = types.MethodType(_base_forward, m)
    try:
        yield
    finally:
        for m in layers:
            m.__dict__.pop("forward", None)


@contextlib.contextmanager
def lean_layers(model, enabled: bool = True, grad: bool = True):
    """Inside the block, ``model``'s gated SiLU MLPs (see :func:`gated_silu_mlps`) keep gate
    and up only, its Llama RMSNorms (:func:`rms_norms`) their input and reciprocal only, and
    its single-adapter LoRA layers run :class:`DropoutLinear` (under autocast
    :class:`SharedCastLinears` / :class:`SwiGLUDown`): the same values, fewer tensors kept
    for the backward. Not for a model under activation checkpointing (its recomputed
    forward runs after the block). ``grad=False`` (a no-grad forward, where nothing is kept):
    the RMSNorms and the MLPs' silu(gate) * up only, for their one-pass C forwards. Either
    way the rotary embeddings run :mod:`grpokit.speed.rotary`'s C passes. Yields the number
    of modules swapped."""
    swaps, mods = [], list(model.modules())  # one walk for every scan below
    if enabled:
        swaps += [(m, _lean_norm_forward) for m in rms_norms(mods)]
        swaps += [(m, _lean_forward) for m in gated_silu_mlps(mods)]
        swaps += [(m, _frozen_cast_forward) for m in frozen_linears(mods) if FROZEN_CASTS]
    if enabled and grad:
        swaps += [(m, _lean_lora_forward) for m in lean_loras(mods)]
        swaps += [sw for m in qkv_attentions(mods) for sw in _shared_qkv(m)]
    for m, fwd in swaps:
        m.forward = types.MethodType(fwd, m)
    _CASTS.append(_STEP_CASTS[-1] if _STEP_CASTS else {})
    _INPUT_CAST.append(None)
    try:
        with lean_rotary(mods, enabled) as n_rotary:
            yield len(swaps) + n_rotary
    finally:
        _CASTS.pop()
        _INPUT_CAST.pop()
        for m, _ in swaps:
            m.__dict__.pop("forward", None)
