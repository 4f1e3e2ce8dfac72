"""Per-token log-probabilities and entropy without a full (B, T, V) float32 log-softmax."""

from __future__ import annotations

import torch


def selective_log_softmax(
    logits: torch.Tensor, ids: torch.Tensor, chunk_rows: int = 1
) -> torch.Tensor:
    """``log_softmax(logits, -1).gather(-1, ids)`` computed ``chunk_rows`` sequences at a time.

    Args:
        logits: (B, T, V) in any float dtype; each chunk is upcast to float32.
        ids: (B, T) token ids.
    Returns:
        (B, T) float32 log-probabilities.
    At most a (chunk_rows, T, V) float32 temporary exists at once.
    """
    parts = []
    for s in range(0, logits.shape[0], chunk_rows):
        lg = logits[s : s + chunk_rows].float()  # (b, T, V)
        picked = lg.gather(-1, ids[s : s + chunk_rows].unsqueeze(-1)).squeeze(-1)  # (b, T)
        parts.append(picked - torch.logsumexp(lg, dim=-1))
    return torch.cat(parts, dim=0)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = 1) -> torch.Tensor:
    """Entropy of each token's distribution, (B, T, V) -> (B, T) float32, chunked by rows."""
    parts = []
    for s in range(0, logits.shape[0], chunk_rows):
        logp = torch.log_softmax(logits[s : s + chunk_rows].float(), dim=-1)  # (b, T, V)
        parts.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(parts, dim=0)


def _chunk_tokens(vocab: int, budget_bytes: int = 1 << 27) -> int:
    """Tokens per chunk so one (chunk, V) float32 block stays within ``budget_bytes``."""
    return max(16, budget_bytes // (4 * max(vocab, 1)))


# The forward's chunks when the products run in bf16/fp16: a quarter of the 128 MiB block.
# Its float32 passes (upcast, log-softmax, gather, exp) then work on blocks that stay in
# cache, and its three work buffers take 80 MiB instead of 320 at the training step's memory
# peak. Measured (AMD EPYC family 26 model 2, AVX512-BF16, 2 threads, 2,728 tokens x 49,152
# vocab x 576, the same values bit for bit): no-grad forward 0.38 -> 0.28 s, forward and
# kept-softmax backward 1.05-1.07 -> 0.91-0.94 s. Not for float32 products (sgemm wants the
# larger blocks: forward and backward 3.5 -> 4.1 s at a quarter) nor for the backward that
# recomputes logits chunk by chunk (an entropy gradient: 1.58 -> 1.98 s at a quarter).
LOW_PRECISION_FORWARD_BUDGET = 1 << 25
# ... and with a ``softmax_rows`` (one C pass over each chunk's low-precision logits, no float32
# blocks): chunks of 4x as many tokens, 682 for a 49,152 vocabulary (67 MB of bf16 logits, the
# two float32 blocks of the quarter chunks not made). oneDNN repacks the (V, H) weight at each
# product call, a fixed ~5 ms for a 49k x 576 head, so fewer, larger calls: 2,048 x 49,152 x
# 576 bf16 at 170 tokens a call 108 ms, at 682 57 ms (2 threads, Intel Xeon family 6 model
# 167, AMX). False: the quarter chunks as before (for comparisons).
KERNEL_FORWARD_BUDGET = 1 << 27
KERNEL_CHUNKS = True


class _LinearLogProbs(torch.autograd.Function):
    """Log-probs of ``targets`` under ``softmax((hidden @ weight.T + bias) / temperature)``,
    token chunk by token chunk, never holding the (N, V) float32 logits. For the backward it
    keeps the softmax in ``cdtype`` when that fits in ``keep_bytes`` (one (N, V) bf16 block
    under mixed precision); otherwise the backward recomputes each chunk's logits (one extra
    matmul). With ``entropy_grad`` the entropies are differentiable too: their gradient
    w.r.t. the logits, -p (log p + H), needs log p, so the backward always recomputes the
    chunk's logits then (nothing (N, V) is kept)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_temp, cdtype, chunk, with_entropy,
                keep_bytes, entropy_grad=False, fwd_chunk=None, softmax_rows=None,
                transpose=None):  # fmt: skip
        N, V = hidden.shape[0], weight.shape[0]
        dev = hidden.device
        logp = torch.empty(N, dtype=torch.float32, device=dev)
        lse = torch.empty(N, dtype=torch.float32, device=dev)
        ent = torch.empty(N if with_entropy else 0, dtype=torch.float32, device=dev)
        grad_needed = any(ctx.needs_input_grad[:3])
        esize = torch.empty(0, dtype=cdtype).element_size()
        keep = grad_needed and not entropy_grad and N * V * esize <= keep_bytes
        # Work buffers of one fixed size, (chunk, V), whatever N is: allocations of varying
        # size fragment a heap that is never trimmed (./run's malloc settings), and the
        # process grew by ~0.1 GB a step that way.
        step = fwd_chunk or chunk
        rows = min(step, N)
        bufs = _ChunkBuffers(rows, V, cdtype, dev)
        probs = None
        if keep:  # rows rounded up to whole chunks: a few sizes only
            probs = torch.empty(-(-N // rows) * rows, V, dtype=cdtype, device=dev)
        # as many chunks as ``rows`` gives, of equal size: 2,048 tokens at 682 were three
        # products of 682 rows and one of 2, which reads the whole (V, H) weight as the others
        # do (AMD EPYC family 25 model 17, bf16, 49,152 x 576, 2 threads, forward with the C
        # softmax: 419-475 ms in chunks of 682, 335-356 in 4 x 512; the same values per row)
        even = -(-N // -(-N // rows)) if N else rows
        with torch.autocast(dev.type, enabled=False):
            w = weight.to(cdtype)
            b = None if bias is None else bias.to(cdtype)
            for s in range(0, N, even):
                e = min(N, s + even)
                _chunk_forward(hidden[s:e].to(cdtype), w, b, targets[s:e], inv_temp, bufs,
                               logp[s:e], lse[s:e], ent[s:e] if with_entropy else None,
                               probs[s:e] if keep else None, softmax_rows)  # fmt: skip
        # the cdtype copy of the weight (a fresh cast per call otherwise: 28M elements for a
        # 49k x 576 head) is kept for the backward instead of cast again there
        ctx.save_for_backward(hidden, w, b, targets, lse, logp, probs, ent)
        ctx.w_dtype = weight.dtype
        ctx.b_dtype = None if bias is None else bias.dtype
        ctx.inv_temp, ctx.cdtype, ctx.chunk = inv_temp, cdtype, chunk
        ctx.entropy_grad = bool(entropy_grad and with_entropy)
        ctx.transpose = transpose
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, w, b, targets, lse, logp, probs, ent = ctx.saved_tensors
        inv_temp, cdtype, chunk = ctx.inv_temp, ctx.cdtype, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        N, V, dev = hidden.shape[0], w.shape[0], hidden.device
        if g_logp is None:
            g_logp = torch.zeros(N, dtype=torch.float32, device=dev)
        if not ctx.entropy_grad or g_ent is None:
            g_ent = None  # (no entropy term: the log-prob gradient alone)
        if probs is not None and cdtype != torch.float32:
            return _backward_kept(ctx, hidden, w, targets, logp, probs, g_logp)
        g_h = torch.empty_like(hidden) if need_h else None
        g_w = torch.zeros(w.shape, dtype=torch.float32, device=dev) if need_w else None
        g_b = None
        if need_b and b is not None:
            g_b = torch.zeros(w.shape[0], dtype=torch.float32, device=dev)
        grad_buf = torch.empty(min(chunk, N), V, dtype=torch.float32, device=dev)
        p_buf = None if g_ent is None else torch.empty_like(grad_buf)
        low_buf = None
        if cdtype != torch.float32:
            low_buf = torch.empty(min(chunk, N), V, dtype=cdtype, device=dev)
        with torch.autocast(dev.type, enabled=False):
            rows = torch.arange(chunk, device=dev)
            for s in range(0, N, chunk):
                e = min(N, s + chunk)
                n = e - s
                g = g_logp[s:e].float() * inv_temp  # d logp / d logits = g (onehot - softmax)
                hc = hidden[s:e].to(cdtype)
                grad = grad_buf[:n]
                if probs is not None:
                    torch.mul(probs[s:e], (-g)[:, None], out=grad)
                else:
                    _linear_into(
                        hc, w, b, grad, None if low_buf is None else low_buf[:n], scale=inv_temp
                    )
                    grad.sub_(lse[s:e, None])  # log p
                    if g_ent is None:
                        grad.exp_().mul_(-g[:, None])
                    else:  # d/dz [g logp_t + ge H] = g (onehot - p) - ge p (log p + H)
                        ge = g_ent[s:e].float() * inv_temp
                        p = torch.exp(grad, out=p_buf[:n])
                        h_c = ent[s:e, None]
                        grad.add_(h_c).mul_(ge[:, None]).add_(g[:, None]).mul_(p).neg_()
                # the target's term from its float32 probability (no cancellation in 1 - p)
                p_t = logp[s:e].exp()
                t_grad = g * (1.0 - p_t)
                if g_ent is not None:
                    t_grad = t_grad - ge * p_t * (logp[s:e] + ent[s:e])
                grad[rows[:n], targets[s:e]] = t_grad
                if low_buf is not None:
                    grad = low_buf[:n].copy_(grad)
                if need_h:
                    g_h[s:e] = (grad @ w).to(hidden.dtype)
                if need_w:
                    g_w.add_(grad.t() @ hc)
                if g_b is not None:
                    g_b.add_(grad.float().sum(0))
        g_w = None if g_w is None else g_w.to(ctx.w_dtype)
        g_b = None if g_b is None else g_b.to(ctx.b_dtype)
        return g_h, g_w, g_b, *[None] * 10


class _ChunkBuffers:
    """The forward's work buffers, (rows, V) each, one fixed size whatever N is: the
    product's output in the compute dtype (``low``, None for float32 products) and two
    float32 blocks (logits then softmax, log-softmax) made on first use, which a
    ``softmax_rows`` that takes every chunk never makes."""

    def __init__(self, rows: int, V: int, cdtype: torch.dtype, dev):
        self.rows, self.V, self.dev = rows, V, dev
        self.low = None
        if cdtype != torch.float32:
            self.low = torch.empty(rows, V, dtype=cdtype, device=dev)
        self._f32 = None

    def float32(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._f32 is None:
            self._f32 = tuple(
                torch.empty(self.rows, self.V, dtype=torch.float32, device=self.dev)
                for _ in range(2)
            )
        return self._f32


def _chunk_forward(h, w, b, targets, inv_temp, bufs, logp, lse, ent, probs, softmax_rows):
    """One chunk of n tokens: fills ``logp`` and ``lse`` (n,), ``ent`` (n,) when given and
    the softmax into ``probs`` (n, V) when given. ``softmax_rows`` (see
    :func:`linear_logprobs`) takes the chunk's logits as the product left them; where it
    declines, torch's operations run."""
    n = h.shape[0]
    low = None if bufs.low is None else bufs.low[:n]
    if softmax_rows is not None:
        raw = bufs.float32()[0][:n] if low is None else low
        _product_into(h, w, b, raw)
        if softmax_rows(raw, inv_temp, targets, logp, lse, ent, probs):
            return
        lg, ls = (t[:n] for t in bufs.float32())
        _upcast_scaled(raw, lg, inv_temp)
    else:
        lg, ls = (t[:n] for t in bufs.float32())
        _linear_into(h, w, b, lg, low, scale=inv_temp)
    torch.ops.aten._log_softmax.out(lg, -1, False, out=ls)
    t = targets[:, None]
    lp = ls.gather(-1, t).squeeze(-1)
    logp.copy_(lp)
    lse.copy_(lg.gather(-1, t).squeeze(-1) - lp)
    if ent is None and probs is None:
        return
    p = torch.exp(ls, out=lg)  # the logits are no longer needed
    if ent is not None:  # H = -sum(p log p), one dot product per row: a loop of dots ran
        # 3-4x faster than a batched (1, V) x (V, 1) bmm
        for i in range(n):
            torch.dot(p[i], ls[i], out=ent[i])
        ent.neg_()
    if probs is not None:
        probs.copy_(p)


def _backward_kept(ctx, hidden, w, targets, logp, probs, g_logp):
    """Backward from the softmax kept in a low precision, without forming the (N, V)
    gradient: d logits = -g * Q, with Q the kept softmax whose target entries are set to
    p_t - 1 (from the float32 log-prob: no cancellation in 1 - p_t) and restored after (a
    second backward must see the softmax). The per-row factor -g moves out of the products,
    d hidden = diag(-g) (Q @ W) and d W = Q^T @ (diag(-g) hidden), so the only (N, V) work
    left is the two products, each one call over all N rows (float32 accumulation inside,
    one rounding of the result). Measured against the chunked form with a scaled bf16 block
    (a mixed-dtype multiply, 70 ms a 682 x 49k chunk here, plus zero-filled float32
    accumulators): 2048 tokens x 49k vocab, backward 0.44 -> 0.21 s."""
    need_h, need_w, need_b = ctx.needs_input_grad[:3]
    N, cdtype, dev = hidden.shape[0], ctx.cdtype, hidden.device
    with torch.autocast(dev.type, enabled=False):
        neg_g = g_logp.float() * -ctx.inv_temp  # d logp / d logits = g (onehot - softmax)
        q = probs.data[:N]  # .data: the overwrite and its restore are invisible to autograd
        at = (torch.arange(N, device=dev), targets)
        kept = q[at]
        q[at] = (logp.exp() - 1.0).to(cdtype)
        try:
            g_h = g_w = g_b = None
            if need_h:
                g_h = ((q @ w).float() * neg_g[:, None]).to(hidden.dtype)
            if need_w:
                hg = (hidden.float() * neg_g[:, None]).to(cdtype)
                g_w = _weight_grad(q, hg, ctx.w_dtype, ctx.transpose)
            if need_b and ctx.b_dtype is not None:
                g_b = (q.t() @ neg_g.to(cdtype)).to(ctx.b_dtype)
        finally:
            q[at] = kept
    return g_h, g_w, g_b, *[None] * 10


# vocabulary rows of the head's weight gradient a product computes (_weight_grad)
WEIGHT_GRAD_ROWS = 4096


def _weight_grad(q: torch.Tensor, hg: torch.Tensor, dtype: torch.dtype, transpose=None):
    """``(q.T @ hg).to(dtype)`` for the (N, V) kept softmax ``q`` and (N, H) ``hg``: the
    product in their dtype, :data:`WEIGHT_GRAD_ROWS` vocabulary rows at a time, each block
    rounded into the (V, H) result. The same values (each entry the same dot product over
    the N tokens), without a whole (V, H) low-precision product beside the float32 result:
    57 MB less at the training step's memory peak (this backward) for SmolLM2-135M's head.
    ``transpose`` (see :func:`linear_logprobs`): the product of plain operands, ``hg``'s
    transpose (made once) times each block of ``q`` as it lies, gives the block's gradient
    transposed, (H, rows), which is turned back (H x rows, small). A block of ``q`` itself
    was turned before (2,048 x 4,096 of a 49,152-column softmax: 4.2 ms a block, its rows
    98 KB apart); the backward's weight gradient, 2,048 tokens x 49,152 x 576: 126-160 ->
    94 ms (oneDNN on AMX, Intel Xeon family 6 model 167, 2 threads)."""
    if dtype == q.dtype:
        return q.t() @ hg
    V = q.shape[1]
    out = torch.empty(V, hg.shape[1], dtype=dtype, device=q.device)
    hgt = None if transpose is None else transpose(hg)
    for s in range(0, V, WEIGHT_GRAD_ROWS):
        block = q[:, s : s + WEIGHT_GRAD_ROWS]
        if hgt is None:
            out[s : s + WEIGHT_GRAD_ROWS] = block.t() @ hg
            continue
        gt = hgt @ block
        back = transpose(gt)
        out[s : s + WEIGHT_GRAD_ROWS] = gt.t() if back is None else back
    return out


def _product_into(x, w, b, dst) -> None:
    """dst (n, V) = x @ w.T + b in x's dtype, without allocating an (n, V) result."""
    if b is None:
        torch.mm(x, w.t(), out=dst)
    else:
        torch.addmm(b, x, w.t(), out=dst)  # one rounding, as linear()


def _upcast_scaled(src, out, scale: float) -> None:
    """out (float32) = src * scale: the upcast (where src is another buffer), then the scaling
    in float32 (the same values as a promoting multiply, which runs through hidden
    temporaries at twice the time of these two passes)."""
    if src is not out:
        out.copy_(src)
    if scale != 1.0:
        out.mul_(scale)


def _linear_into(x, w, b, out, low, scale: float = 1.0):
    """out (float32, (n, V)) = (x @ w.T + b) * scale, the product computed in x's dtype
    (through ``low`` when that is not float32), the scaling in float32."""
    dst = out if low is None else low
    _product_into(x, w, b, dst)
    _upcast_scaled(dst, out, scale)


def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    compute_dtype: torch.dtype | None = None,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    keep_bytes: int = 1 << 28,
    entropy_grad: bool = False,
    softmax_rows=None,
    transpose=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Fused output layer + log-softmax + gather (+ entropy) over N tokens.

    Args:
        hidden: (N, H) final hidden states of the positions that predict ``targets``.
        weight: (V, H) output embedding (``lm_head.weight``); ``bias``: (V,) or None.
        targets: (N,) token ids.
        temperature: logits are divided by it (the sampling distribution).
        compute_dtype: dtype of the two matmuls (bf16 under mixed precision); the
            softmax is always float32. Defaults to ``weight.dtype``.
    Returns:
        (N,) float32 log-probs (differentiable w.r.t. hidden, weight, bias) and, if asked,
        (N,) float32 entropies, differentiable too with ``entropy_grad`` (an entropy bonus;
        the backward then recomputes each chunk's logits), else detached.
        softmax_rows: optional faster forward of each token chunk's softmax statistics,
            ``softmax_rows(x, scale, targets, logp, lse, ent, probs) -> bool``: from the
            chunk's logits ``x`` (n, V) as the product left them (``compute_dtype``), fill
            ``logp`` = log_softmax(x * scale)[targets], ``lse`` = x[targets] * scale - logp,
            ``ent`` (entropy; None: not wanted) and ``probs`` (the softmax in x's dtype;
            None: not wanted); False where it does not apply (then torch's operations run).
            ``grpokit.speed.kernels.head_log_softmax`` is one.
        transpose: optional ``transpose(a) -> a.t().contiguous()`` (or None where it does not
            apply) for a faster weight gradient: the product reads plain operands (``hidden``'s
            side transposed once, each block of the kept softmax as it lies) and its (H, rows)
            result is turned back (the same products, summed in another order).
            ``grpokit.speed.kernels.transposed`` is one.
    Equals ``selective_log_softmax(linear(hidden, weight, bias) / temperature, targets)``
    up to the rounding of ``compute_dtype``, with at most one (chunk_tokens, V) float32
    block alive instead of the whole (N, V) logits and their gradient; the softmax is kept
    for the backward in ``compute_dtype`` when N x V of it fits in ``keep_bytes``, else
    recomputed there.
    """
    cd = compute_dtype or weight.dtype
    chunk = chunk_tokens or _chunk_tokens(weight.shape[0])
    fwd_chunk = chunk
    if not chunk_tokens and cd != torch.float32:
        budget = LOW_PRECISION_FORWARD_BUDGET
        if softmax_rows is not None and KERNEL_CHUNKS:
            budget = KERNEL_FORWARD_BUDGET
        fwd_chunk = _chunk_tokens(weight.shape[0], budget)
    logp, ent = _LinearLogProbs.apply(
        hidden,
        weight,
        bias,
        targets,
        1.0 / temperature,
        cd,
        chunk,
        with_entropy,
        keep_bytes,
        entropy_grad,
        fwd_chunk,
        softmax_rows,
        transpose,
    )
    return logp, (ent if with_entropy else None)
