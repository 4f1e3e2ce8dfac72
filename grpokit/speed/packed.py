"""A micro-batch whose rows share prompts as ONE packed sequence through the decoder.

The shared-prompt forward (``grpokit.forward``) ran the model twice a micro-batch: once over
the distinct prompts (u rows), once over the completions (n rows) against the prompts' KV
cache. Every layer then ran every one of its operations twice, the second time on a few
dozen tokens (2 prompts x 53 in config (a)), and every weight gradient came in two parts,
each cast and added on its own; the cache's index and concatenation a layer on top.
Packed, the same tokens (each distinct prompt but its last token once, then each row's
[last prompt token | completion]) are one (1, u Lp + n Lc) sequence: the linear layers, norms
and MLPs run once over all of them, and only the attention sees the rows
(:func:`packed_attention`): the prompts' queries against their own prompt (causal, left
padding masked), each row's queries against [its prompt's keys | its own keys] (causal,
padding masked), exactly the keys, values, positions and masks the two forwards used, by
the same attention function (``grpokit.speed.attention.attention``, the C kernels where they
build). Config (a)'s training step (Intel Xeon family 6 model 167, bf16): see docs/speed.md.

Only where that attention is what the model computes: every attention module runs Llama's
forward (Llama, SmolLM, Mistral without a sliding window ...; checked by its code), no
attention dropout, rows within the training route's lengths, a low-precision autocast; the
caller keeps the two forwards elsewhere (:func:`applies`).
"""

from __future__ import annotations

import contextlib
import math

import torch

from grpokit.speed import attention as attn


class Packing:
    """The rows of one packed forward: optionally a ``prefix`` of L tokens common to every
    prompt (run once; positions 0 .. L - 1), then ``u`` distinct prompts (or their suffixes
    after the prefix) of ``Lp`` tokens (left-padded: ``prompt_mask`` (u, Lp)), then ``n`` rows
    of ``Lc`` tokens (``row_mask`` (n, Lc), True for real tokens), row i reading prompt
    ``inverse[i]``. Builds the attentions' boolean masks once a forward (every layer shares
    them): the prefix causal; a prompt against [the prefix | itself, causal, padding
    masked]; a row against [the prefix | its prompt, padding masked | itself, causal, padding
    masked]."""

    def __init__(self, prompt_mask, inverse: torch.Tensor, row_mask, prefix: int = 0):
        self.u, self.Lp = prompt_mask.shape
        self.n, self.Lc = row_mask.shape
        self.L, self.inverse = prefix, inverse
        dev = prompt_mask.device
        pm = prompt_mask.bool()
        mp = attn.causal_mask(self.Lp, self.Lp, dev)[0] & pm[:, None, :]  # (u, Lp, Lp)
        if not prefix:  # a left pad then sees no key: it attends to itself (its output is
            # never read; a query row with no key gives NaN through SDPA, 0 through the kernel)
            empty = ~mp.any(-1, keepdim=True)
            mp = mp | (empty & torch.eye(self.Lp, dtype=torch.bool, device=dev)[None])
        seen = torch.ones(1, 1, prefix, dtype=torch.bool, device=dev)  # the prefix: every key
        self.prompt_mask = torch.cat([seen.expand(self.u, self.Lp, prefix), mp], -1)[:, None]
        right = attn.causal_mask(self.Lc, self.Lc, dev)[0] & row_mask.bool()[:, None, :]
        parts = [seen.expand(self.n, self.Lc, prefix),
                 pm[inverse][:, None, :].expand(self.n, self.Lc, self.Lp), right]  # fmt: skip
        self.row_mask = torch.cat(parts, dim=-1)[:, None]  # (n, 1, Lc, L + Lp + Lc)
        self.prefix_mask = attn.causal_mask(prefix, prefix, dev)  # (1, 1, L, L)
        self._grouped: dict = {}

    def grouped(self, R: int):
        """The masks (prefix, prompts, rows) with each key/value head's R query heads stacked
        (see ``attention.grouped_mask``), made once."""
        if R not in self._grouped:
            masks = (self.prefix_mask, self.prompt_mask, self.row_mask)
            self._grouped[R] = [attn.grouped_mask(m, R).contiguous() for m in masks]
        return self._grouped[R]


_ACTIVE: list[Packing] = []
# The one prefix row's queries (its attention computes all L x L scores of one row: the
# training route's bound on queries is for a batch of rows)
MAX_PREFIX = 4 * attn.MAX_QUERIES


def _rows(x: torch.Tensor, lo: int, hi: int, m: int, L: int) -> torch.Tensor:
    """Tokens lo..hi of (heads, T, D) as (m, heads, L, D)."""
    return x[:, lo:hi].unflatten(1, (m, L)).transpose(0, 1)


def packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention-interface function for a :func:`packed_attention` block: query
    (1, H, T, D) and key/value (1, G, T, D) of the packed sequence; transformers' own mask is
    not read (the packing's are). Returns ((1, T, H, D), None)."""
    pk = _ACTIVE[-1]
    extras = ("softcap", "s_aux", "position_bias", "sliding_window")
    if dropout or any(kwargs.get(x) is not None for x in extras) or query.shape[0] != 1:
        raise RuntimeError(
            "packed forward: the attention asked for something the packing does not compute "
            f"(dropout {dropout}, {[x for x in extras if kwargs.get(x) is not None]})"
        )
    if torch.is_autocast_enabled("cpu"):
        dt = torch.get_autocast_dtype("cpu")
    else:
        dt = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    H, G, D = query.shape[1], key.shape[1], query.shape[-1]
    scale = scaling if scaling is not None else 1.0 / math.sqrt(D)
    q, k, v = query[0].to(dt), key[0].to(dt), value[0].to(dt)
    L, u, n = pk.L, pk.u, pk.n
    Np, T = L + u * pk.Lp, q.shape[1]
    mask_f, mask_p, mask_r = pk.grouped(H // G)
    outs = []
    with torch.autocast("cpu", enabled=False):
        if L:
            k0, v0 = k[None, :, :L].contiguous(), v[None, :, :L].contiguous()
            o0 = attn.attention(q[None, :, :L], k0, v0, None, scale, stacked_mask=mask_f)
            outs.append(o0[0].transpose(0, 1))
        kp, vp = _rows(k, L, Np, u, pk.Lp), _rows(v, L, Np, u, pk.Lp)
        kpp, vpp = (_with_prefix(k0, kp, u), _with_prefix(v0, vp, u)) if L else (kp, vp)
        op = attn.attention(_rows(q, L, Np, u, pk.Lp), kpp.contiguous(), vpp.contiguous(),
                            None, scale, stacked_mask=mask_p)  # fmt: skip
        outs.append(op.transpose(1, 2).reshape(-1, H, D))
        kr = torch.cat([kp[pk.inverse], _rows(k, Np, T, n, pk.Lc)], dim=2)
        vr = torch.cat([vp[pk.inverse], _rows(v, Np, T, n, pk.Lc)], dim=2)
        if L:
            kr, vr = _with_prefix(k0, kr, n), _with_prefix(v0, vr, n)
        orow = attn.attention(_rows(q, Np, T, n, pk.Lc), kr, vr, None, scale,
                              stacked_mask=mask_r)  # fmt: skip
        outs.append(orow.transpose(1, 2).reshape(-1, H, D))
    return torch.cat(outs)[None], None


def _with_prefix(x0: torch.Tensor, x: torch.Tensor, m: int) -> torch.Tensor:
    """[the prefix's (1, G, L, D) | x (m, G, S, D)] along the keys, for each of the m rows."""
    return torch.cat([x0.expand(m, -1, -1, -1), x], dim=2)


@contextlib.contextmanager
def packed_attention(packing: Packing):
    """Inside the block transformers' ``sdpa`` attention is :func:`packed_sdpa` over
    ``packing``'s rows."""
    _ACTIVE.append(packing)
    try:
        with attn._sdpa_as(packed_sdpa):
            yield
    finally:
        _ACTIVE.pop()


def applies(model, Lp: int, Lc: int, prefix: int = 0) -> bool:
    """Whether a packed forward computes what ``model``'s own forward would: sdpa attention,
    every attention module running Llama's forward, no attention dropout in training mode,
    no sliding window, both lengths within the training route's (``attention.MAX_QUERIES``),
    in a low precision (the training attention's own route; float32 too where
    ``attention.FLOAT32_TOO`` sends float32 there)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(cfg, "sliding_window", None) or (
        model.training and getattr(cfg, "attention_dropout", 0.0)
    ):
        return False
    if max(Lp, Lc) > attn.MAX_QUERIES or prefix > MAX_PREFIX:
        return False
    if torch.is_autocast_enabled("cpu"):
        dt = torch.get_autocast_dtype("cpu")
    else:
        dt = next(model.parameters()).dtype
    if dt.itemsize >= 4 and not attn.FLOAT32_TOO:
        return False
    from grpokit.speed.layers import _llama_forward, _same_code

    ref = _llama_forward("LlamaAttention")
    found = [m for m in model.modules() if _same_code(m, ref)]
    return len(found) == getattr(cfg, "num_hidden_layers", -1)
