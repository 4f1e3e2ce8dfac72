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


def lower_frozen_linears(model, dtype: torch.dtype) -> int:
    """Store the weights of ``model``'s plain ``nn.Linear`` layers (the output head included,
    untied from a float32 input embedding, which stays as it is) in ``dtype``.

    For a frozen model run under autocast to ``dtype``, whose products cast their weights
    to ``dtype`` anyway: the log-probs are bit-identical, the per-forward casts of every
    weight go (about a 3-byte-per-parameter pass each reference micro-batch), and the
    weights take half the memory. Norms, embeddings and everything outside the products stay
    in their dtype. Returns the number of layers lowered."""
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    n = 0
    for m in model.modules():
        if type(m) is not torch.nn.Linear or m.weight.dtype == dtype:
            continue
        if m is out_emb and in_emb is not None and m.weight is in_emb.weight:
            m.weight = torch.nn.Parameter(m.weight.detach().to(dtype), requires_grad=False)
        else:
            m.to(dtype)
        n += 1
    return n
