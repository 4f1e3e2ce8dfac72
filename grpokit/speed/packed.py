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
    """The rows of one packed forward: ``u`` distinct prompts of ``Lp`` tokens (left-padded:
    ``prompt_mask`` (u, Lp)), then ``n`` rows of ``Lc`` tokens (``row_mask`` (n, Lc), True
    for real tokens), row i reading prompt ``inverse[i]``. Builds the two attentions' boolean
    masks once a forward (every layer shares them)."""

    def __init__(self, prompt_mask: torch.Tensor, inverse: torch.Tensor, row_mask: torch.Tensor):
        self.u, self.Lp = prompt_mask.shape
        self.n, self.Lc = row_mask.shape
        self.inverse = inverse
        dev = prompt_mask.device
        pm = prompt_mask.bool()
        own = attn.causal_mask(self.Lp, self.Lp, dev)[0]  # (1, Lp, Lp)
        mp = own & pm[:, None, :]
        # a left pad sees no key: it attends to itself (its output is never read; a query
        # row with no key would give NaN through SDPA, where the C kernel gives 0)
        empty = ~mp.any(-1, keepdim=True)
        mp = mp | (empty & torch.eye(self.Lp, dtype=torch.bool, device=dev)[None])
        self.prompt_mask = mp[:, None]  # (u, 1, Lp, Lp)
        left = pm[inverse][:, None, :].expand(self.n, self.Lc, self.Lp)
        right = attn.causal_mask(self.Lc, self.Lc, dev)[0] & row_mask.bool()[:, None, :]
        self.row_mask = torch.cat([left, right], dim=-1)[:, None]  # (n, 1, Lc, Lp + Lc)
        self._grouped: dict = {}

    def grouped(self, R: int):
        """The two masks with each key/value head's R query heads stacked (see
        ``attention.grouped_mask``), made once."""
        if R not in self._grouped:
            self._grouped[R] = (
                attn.grouped_mask(self.prompt_mask, R).contiguous(),
                attn.grouped_mask(self.row_mask, R).contiguous(),
            )
        return self._grouped[R]


_ACTIVE: list[Packing] = []


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
    Np, T = pk.u * pk.Lp, q.shape[1]
    kp, vp = _rows(k, 0, Np, pk.u, pk.Lp), _rows(v, 0, Np, pk.u, pk.Lp)
    kc = torch.cat([kp[pk.inverse], _rows(k, Np, T, pk.n, pk.Lc)], dim=2)
    vc = torch.cat([vp[pk.inverse], _rows(v, Np, T, pk.n, pk.Lc)], dim=2)
    mask_p, mask_c = pk.grouped(H // G)
    with torch.autocast("cpu", enabled=False):
        op = attn.attention(_rows(q, 0, Np, pk.u, pk.Lp), kp.contiguous(), vp.contiguous(),
                            None, scale, stacked_mask=mask_p)  # fmt: skip
        oc = attn.attention(_rows(q, Np, T, pk.n, pk.Lc), kc, vc, None, scale,
                            stacked_mask=mask_c)  # fmt: skip
    out = torch.cat([op.transpose(1, 2).reshape(Np, H, D), oc.transpose(1, 2).reshape(-1, H, D)])
    return out[None], None


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


def applies(model, Lp: int, Lc: int) -> bool:
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
    if max(Lp, Lc) > attn.MAX_QUERIES:
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
