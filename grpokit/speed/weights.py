"""Speed-ups that change how weights are stored or differentiated, never their values."""

from __future__ import annotations

import torch


def sparse_tied_embedding_grad(model) -> bool:
    """When the trained input embedding is tied to the output head, make its lookup's
    gradient sparse (the rows the batch used) instead of a dense (V, H) tensor.

    The head's gradient is dense and reaches the same parameter in the same backward, and
    autograd adds the sparse part into it, so ``.grad`` is dense as before (same values up to
    float summation order). What goes is, per lookup, a zero-filled (V, H) float32 tensor
    and one (V, H) addition: for a 49k x 576 embedding, 113 MB of fresh memory each, measured
    at 20-150 ms a lookup here (page faults), with two lookups a micro-batch under the
    shared-prompt forward. Not for an untied embedding, whose sparse gradient would reach
    the optimizer, nor a frozen one. Returns whether it applied."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if type(emb) is not torch.nn.Embedding or head is None:
        return False
    if emb.weight is not getattr(head, "weight", None) or not emb.weight.requires_grad:
        return False
    emb.sparse = True
    return True


class _ArriveLast(torch.autograd.Function):
    """The identity, as an autograd node made before the forward's lookups (see
    ``head_weight_arriving_last``)."""

    @staticmethod
    def forward(ctx, weight):
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        return grad


def head_weight_arriving_last(model, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (the output head's), routed so that its dense gradient reaches the
    parameter after the sparse gradients of the tied embedding's lookups
    (``sparse_tied_embedding_grad``). Call it before the forward that does the lookups.

    Why: autograd sums the gradients a parameter gets in one backward before accumulating
    them, and adds a sparse gradient into a dense one it already holds out of place: the
    dense (V, H) tensor copied into a fresh one, per lookup (three lookups a micro-batch
    with the shared-prompt forward: 3 x 113 MB for SmolLM2-135M). The other way round (the
    sparse parts first, the dense one last) it adds them into the dense gradient in place.
    Measured in ``bench/speed.py`` config (a): the profiler put 1.2-1.4 s of a training step
    on those copies, mostly fresh pages its own records made them touch; timed without it
    the step is the same on a repeated batch (7.04 s both ways) and ~7% faster a token with
    a new batch each step (3.18 vs 3.41 ms, lengths differing): a small gain. The backward runs its ready nodes newest first, so a node made before the
    lookups runs after them: the head's gradient passes through this one. Same values up to
    the order of the float sums; where the order cannot be had (the engine changes) the
    sum is the out-of-place one as before. Returns ``weight`` itself when the lookups are
    not sparse, the weight is not tied or no gradient is being recorded."""
    emb = model.get_input_embeddings()
    if not (torch.is_grad_enabled() and weight.requires_grad and getattr(emb, "sparse", False)):
        return weight
    if getattr(emb, "weight", None) is not weight:
        return weight
    return _ArriveLast.apply(weight)


def lower_frozen_linears(model, dtype: torch.dtype) -> int:
    """Store the weights of ``model``'s plain ``nn.Linear`` layers (the output head included,
    untied from a float32 input embedding, which stays as it is) in ``dtype``.

    For a frozen model run under autocast to ``dtype``, whose products cast their weights
    to ``dtype`` anyway: the log-probs are bit-identical, the per-forward casts of every
    weight go (about a 3-byte-per-parameter pass each reference micro-batch), and the
    weights take half the memory. Norms and everything outside the products stay in their
    dtype; so does the input embedding, except a tied one whose values are all exactly
    ``dtype`` values, which shares the lowered head weight (``_tie_exact_embedding``).
    Returns the number of layers lowered."""
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    n = 0
    for m in model.modules():
        if type(m) is not torch.nn.Linear or m.weight.dtype == dtype:
            continue
        if m is out_emb and in_emb is not None and m.weight is in_emb.weight:
            m.weight = torch.nn.Parameter(m.weight.detach().to(dtype), requires_grad=False)
            _tie_exact_embedding(in_emb, m.weight)
        else:
            m.to(dtype)
        n += 1
    return n


def _tie_exact_embedding(emb, low: torch.nn.Parameter) -> None:
    """Tie ``emb`` to the lowered head weight ``low`` when every one of its values is
    exactly a ``low.dtype`` value (a checkpoint stored in bf16 and loaded into float32; the
    GGUF-converted SmolLM2 that ``./run`` uses is not one), its lookups cast back to its
    dtype: the same activations bit for bit, and no second (V, H) table (a 49k x 576 float32
    one is 113 MB; Qwen2.5-0.5B's 152k x 896, 545 MB)."""
    if type(emb) is not torch.nn.Embedding or emb.weight.shape != low.shape:
        return
    dtype = emb.weight.dtype
    if not torch.equal(low.to(dtype), emb.weight):
        return
    emb.weight = low
    emb.register_forward_hook(lambda _m, _a, out: out.to(dtype))


def linear_parts(mod) -> tuple[torch.nn.Linear, list[str]] | None:
    """(the plain Linear, the LoRA adapters to add to its weight) of a plain ``Linear`` or
    of PEFT's LoRA ``Linear`` (its active adapters that are plain low-rank products and not
    already merged); None for anything else, including an adapter with DoRA, a LoRA bias or
    another variant, whose effect is not ``W + scaling B A``."""
    if type(mod) is torch.nn.Linear:
        return mod, []
    base = getattr(mod, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(mod, "get_delta_weight"):
        return None
    if getattr(mod, "disable_adapters", False):
        return base, []
    names = [a for a in mod.active_adapters if a in getattr(mod, "lora_A", {})]
    for a in names:
        if getattr(mod, "use_dora", {}).get(a) or getattr(mod, "lora_bias", {}).get(a):
            return None
        if getattr(mod, "lora_variant", {}).get(a) is not None:
            return None
    merged = set(getattr(mod, "merged_adapters", []))
    return base, [a for a in names if a not in merged]


def effective_weight(mod, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The weight a plain or LoRA ``Linear`` (see ``linear_parts``) multiplies by: a LoRA
    layer's base weight plus ``scaling B A`` of each of its active adapters (PEFT's own
    ``get_delta_weight``), summed in ``dtype`` (default: the base weight's). The layer is
    not modified (no merge / unmerge round trip)."""
    parts = linear_parts(mod)
    if parts is None:
        raise ValueError(
            f"{type(mod).__name__} is not a plain Linear or a plain LoRA Linear (DoRA, LoRA "
            "bias and other adapter variants cannot be merged into one weight here)"
        )
    base, adapters = parts
    with torch.no_grad():
        w = base.weight.detach() if dtype is None else base.weight.detach().to(dtype)
        for a in adapters:
            w = w + mod.get_delta_weight(a).to(w.dtype)
    return w
