"""Rotary position embedding for the training and log-prob forwards in one C pass each way.

transformers' ``apply_rotary_pos_emb(q, k, cos, sin)`` is ``x * cos + rotate_half(x) * sin``:
a slice, a negation, a concatenation, two products and a sum for each of q and k, and under
bf16 autocast the products promote the bf16 query to float32 (cos and sin come in the
float32 residual stream's dtype), so the attention casts the float32 result back to bf16
after. Autograd then runs the chain backward again, op by op. Measured for SmolLM2-135M's
(16, 9, 129, 64) queries and (16, 3, 129, 64) keys, bf16, 2 threads (Intel Xeon family 6 model
167): 4.7 ms forward and 2.3 ms backward a layer, for a step of config (a) (two micro-batches,
30 layers, a training and a reference forward) ~0.6 s. The C passes: 0.15 ms forward and 0.37
ms backward for those queries.

:func:`lean_rotary` swaps the function, inside a block, for :func:`rotary` where the module
holding it has exactly Llama's (Mistral, Qwen2/3, SmolLM3 share it): one pass of
``kernels.rope_forward`` per tensor, writing the rounded result in the attention's dtype
(under bf16 autocast: bf16, the value the attention's cast would make; float32 otherwise:
the same float32 numbers) and contiguous, so the attention's grouped reshape needs no copy.
:class:`RotaryFunction`'s backward is one pass of ``kernels.rope_backward`` writing the
input's gradient in the input's memory layout. Values and gradients equal transformers' bit
for bit (tests/speed/test_rotary.py); anything the kernels do not read (another dtype, a
layout with a strided last dimension, ``unsqueeze_dim`` other than 1) runs the original.
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import torch

from grpokit.speed import kernels

USE_ROPE_KERNEL = True  # False: transformers' operations (for comparisons)


class RotaryFunction(torch.autograd.Function):
    """(rope(q), rope(k)) with ``kernels.rope_forward``; the backward from the saved
    tables only (the inputs are not kept, as autograd's products do not keep them)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        ctx.layouts = [(t.shape, t.stride(), t.dtype) for t in (q, k)]
        return kernels.rope_forward(q, cos, sin), kernels.rope_forward(k, cos, sin)

    @staticmethod
    def backward(ctx, g_q, g_k):
        cos, sin = ctx.saved_tensors
        grads = []
        for g, (shape, stride, dtype), need in zip((g_q, g_k), ctx.layouts, ctx.needs_input_grad):
            if not need:
                grads.append(None)
                continue
            if g is None:
                g = torch.zeros(shape, dtype=dtype)
            grads.append(kernels.rope_backward(g, cos, sin, shape, stride, dtype))
        return grads[0], grads[1], None, None


def _applies(q, k, cos, sin) -> bool:
    if not (kernels.rope_applies(q, cos, sin) and kernels.rope_applies(k, cos, sin)):
        return False
    if q.dtype != k.dtype or q.shape[0] != k.shape[0]:
        return False
    if q.dtype == torch.float32:
        return True
    # a bf16 result stands for the float32 one only where the attention casts to bf16 anyway
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == q.dtype


def rotary(original):
    """A drop-in for ``original`` (transformers' ``apply_rotary_pos_emb``) through the C
    kernels where they apply."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if not (USE_ROPE_KERNEL and unsqueeze_dim == 1 and _applies(q, k, cos, sin)):
            return original(q, k, cos, sin, unsqueeze_dim)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return RotaryFunction.apply(q, k, cos, sin)
        return kernels.rope_forward(q, cos, sin), kernels.rope_forward(k, cos, sin)

    apply_rotary_pos_emb.grpokit_original = original
    return apply_rotary_pos_emb


def _llama_rotary():
    try:
        from transformers.models.llama import modeling_llama
    except ImportError:  # pragma: no cover - transformers without llama
        return None
    return getattr(modeling_llama, "apply_rotary_pos_emb", None)


def same_function(fn, ref) -> bool:
    """Whether ``fn`` is exactly ``ref`` (bytecode, names, constants; under decorators)."""
    a = getattr(inspect.unwrap(fn), "__code__", None)
    b = getattr(inspect.unwrap(ref), "__code__", None)
    if a is None or b is None:
        return False
    return (a.co_code, a.co_names, a.co_consts) == (b.co_code, b.co_names, b.co_consts)


def walked_modules(model_or_modules):
    """The modules of a model, or a list of them already walked (``layers.lean_layers`` walks
    a model once for all its scans: ~7 ms a walk for SmolLM2-135M with LoRA's 2,500 modules)."""
    if isinstance(model_or_modules, list):
        return model_or_modules
    return model_or_modules.modules()


def rotary_modules(model) -> list:
    """The Python modules whose ``apply_rotary_pos_emb`` ``model``'s attention layers call
    and which is exactly Llama's (``model``: a model, or the list of its modules)."""
    ref = _llama_rotary()
    found, seen = {}, set()
    for m in walked_modules(model):
        if type(m) in seen:  # (one look a class)
            continue
        seen.add(type(m))
        mod = sys.modules.get(type(m).__module__)
        fn = getattr(mod, "apply_rotary_pos_emb", None) if mod is not None else None
        if fn is None or hasattr(fn, "grpokit_original") or id(mod) in found:
            continue
        if ref is not None and same_function(fn, ref):
            found[id(mod)] = mod
    return list(found.values())


@contextlib.contextmanager
def lean_rotary(model, enabled: bool = True):
    """Inside the block, ``model``'s attention layers apply rotary embeddings through
    :func:`rotary` (``model``: a model, or the list of its modules). Yields the number of
    modules swapped."""
    swapped = []
    if enabled and kernels.available():
        for mod in rotary_modules(model):
            original = mod.apply_rotary_pos_emb
            mod.apply_rotary_pos_emb = rotary(original)
            swapped.append((mod, original))
    try:
        yield len(swapped)
    finally:
        for mod, original in swapped:
            mod.apply_rotary_pos_emb = original
