import pytest
import torch

from grpokit.algo import entropy_from_logits, selective_log_softmax


def test_matches_naive_fp32():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 4
    ids = torch.randint(0, 50, (3, 7), generator=g)
    naive = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    for chunk in (1, 2, 5):
        torch.testing.assert_close(
            selective_log_softmax(logits, ids, chunk), naive, atol=1e-5, rtol=0
        )


def test_bf16_input_upcast():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 5, 40, generator=g) * 3).bfloat16()
    ids = torch.randint(0, 40, (2, 5), generator=g)
    out = selective_log_softmax(logits, ids)
    assert out.dtype == torch.float32
    naive = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, naive, atol=1e-5, rtol=0)


def test_gradient_matches_naive():
    logits = torch.randn(2, 4, 11, requires_grad=True)
    ids = torch.randint(0, 11, (2, 4))
    selective_log_softmax(logits, ids).sum().backward()
    g1 = logits.grad.clone()
    logits.grad = None
    torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).sum().backward()
    torch.testing.assert_close(g1, logits.grad)


def test_entropy():
    logits = torch.zeros(2, 3, 8)
    torch.testing.assert_close(
        entropy_from_logits(logits), torch.full((2, 3), torch.log(torch.tensor(8.0)).item())
    )
    peaked = torch.full((1, 1, 4), -1e4)
    peaked[..., 0] = 0
    assert entropy_from_logits(peaked).abs().max() < 1e-5


def _naive_linear(h, w, b, t, temperature, cd):
    lg = torch.nn.functional.linear(h.to(cd), w.to(cd), b.to(cd)).double() / temperature
    logp = torch.log_softmax(lg, -1)
    return logp.gather(-1, t[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def test_linear_logprobs_matches_naive_values_and_gradients():
    from grpokit.algo import linear_logprobs

    g = torch.Generator().manual_seed(2)
    N, H, V = 37, 16, 300
    for temperature in (1.0, 0.7):
        # one token per chunk, ragged last chunk, all in one chunk; softmax kept or recomputed
        for chunk, keep in ((1, 0), (5, 1 << 28), (5, 0), (64, 1 << 28)):
            h = torch.randn(N, H, dtype=torch.float64, generator=g).requires_grad_()
            w = torch.randn(V, H, dtype=torch.float64, generator=g).requires_grad_()
            b = torch.randn(V, dtype=torch.float64, generator=g).requires_grad_()
            t = torch.randint(0, V, (N,), generator=g)
            up = torch.randn(N, dtype=torch.float64, generator=g)
            lp, ent = linear_logprobs(
                h, w, t, bias=b, temperature=temperature, with_entropy=True,
                chunk_tokens=chunk, keep_bytes=keep,
            )  # fmt: skip
            grads = torch.autograd.grad((lp * up).sum(), (h, w, b))
            rlp, rent = _naive_linear(h, w, b, t, temperature, torch.float64)
            rgrads = torch.autograd.grad((rlp * up).sum(), (h, w, b))
            # log-probs and entropies are stored in float32
            torch.testing.assert_close(lp.double(), rlp, atol=1e-5, rtol=0)
            torch.testing.assert_close(ent.double(), rent, atol=1e-4, rtol=0)
            for a, r in zip(grads, rgrads):
                torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)


def test_linear_logprobs_bf16_compute_matches_autocast_path():
    """bf16 matmuls with float32 weights, as under autocast: same values as casting
    hidden and weight to bf16 and doing the softmax in float32."""
    from grpokit.algo import linear_logprobs

    g = torch.Generator().manual_seed(3)
    N, H, V = 20, 32, 500
    h = torch.randn(N, H, generator=g).requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.2).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the caller's context is ignored inside
        lp, ent = linear_logprobs(h, w, t, compute_dtype=torch.bfloat16, chunk_tokens=6)
    assert lp.dtype == torch.float32 and ent is None
    gh, gw = torch.autograd.grad(lp.sum(), (h, w))
    assert gh.dtype == h.dtype and gw.dtype == w.dtype
    zero = torch.zeros(V)
    rlp, _ = _naive_linear(h, w, zero, t, 1.0, torch.bfloat16)
    rgh, rgw = torch.autograd.grad(rlp.sum(), (h, w))
    torch.testing.assert_close(lp.double(), rlp, atol=1e-5, rtol=0)
    torch.testing.assert_close(gh, rgh.float(), atol=1e-2, rtol=1e-2)  # bf16 matmul rounding
    torch.testing.assert_close(gw, rgw.float(), atol=1e-2, rtol=1e-2)


def test_linear_logprobs_bf16_kept_softmax_backward_matches_recomputed():
    """The bf16 backward from the kept softmax (no (N, V) gradient block; the per-row factor
    applied outside the products) equals the one that recomputes each chunk's softmax, with
    a bias, only some inputs needing gradients, and a second backward through the same graph
    (the kept softmax is restored after its target entries were overwritten)."""
    from grpokit.algo import linear_logprobs

    g = torch.Generator().manual_seed(4)
    N, H, V = 29, 24, 400
    h0 = torch.randn(N, H, generator=g)
    w0 = torch.randn(V, H, generator=g) * 0.3
    b0 = torch.randn(V, generator=g) * 0.1
    t = torch.randint(0, V, (N,), generator=g)
    up = torch.randn(N, generator=g)
    for wants in ((True, True, True), (True, False, False), (False, True, True)):
        grads = []
        for keep in (1 << 28, 0):
            h, w, b = (x.clone().requires_grad_(r) for x, r in zip((h0, w0, b0), wants))
            lp, _ = linear_logprobs(
                h, w, t, bias=b, temperature=0.7, compute_dtype=torch.bfloat16,
                chunk_tokens=8, keep_bytes=keep,
            )  # fmt: skip
            inputs = [x for x, r in zip((h, w, b), wants) if r]
            first = torch.autograd.grad((lp * up).sum(), inputs, retain_graph=True)
            second = torch.autograd.grad((lp * up).sum(), inputs)
            for a, c in zip(first, second):
                assert torch.equal(a, c)
            grads.append(first)
        for a, c in zip(*grads):
            assert a.dtype == torch.float32
            torch.testing.assert_close(a, c, atol=2e-2, rtol=2e-2)  # bf16 rounding


def test_linear_logprobs_entropy_gradient_matches_naive():
    """With ``entropy_grad`` the fused head's entropies carry the gradient of -sum p log p
    (an entropy bonus), together with the log-probs' own, as autograd through the full
    logits gives it; chunked, with a bias and a temperature; without it they carry none."""
    from grpokit.algo import linear_logprobs

    g = torch.Generator().manual_seed(3)
    N, H, V, temp = 13, 8, 37, 0.7
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64).float()
    weight = torch.randn(V, H, generator=g) * 0.5
    bias = torch.randn(V, generator=g) * 0.1
    targets = torch.randint(0, V, (N,), generator=g)
    a, c = torch.randn(N, generator=g), torch.randn(N, generator=g)

    def naive(h, w, b):
        logits = (h @ w.t() + b) / temp
        ls = torch.log_softmax(logits, -1)
        ent = -(ls.exp() * ls).sum(-1)
        return ls.gather(-1, targets[:, None]).squeeze(-1), ent

    ins = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    lp, ent = naive(*ins)
    (a * lp + c * ent).sum().backward()
    want = [x.grad for x in ins]
    ins2 = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    lp2, ent2 = linear_logprobs(
        ins2[0], ins2[1], targets, bias=ins2[2], temperature=temp, with_entropy=True,
        entropy_grad=True, chunk_tokens=5,
    )  # fmt: skip
    assert torch.allclose(lp2, lp, atol=1e-5) and torch.allclose(ent2, ent, atol=1e-5)
    (a * lp2 + c * ent2).sum().backward()
    for got, exp in zip((x.grad for x in ins2), want):
        assert torch.allclose(got, exp, atol=1e-5, rtol=1e-4), (got - exp).abs().max()
    # the entropies alone (no log-prob term): only the entropy part of the gradient
    ins3 = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    _, ent3 = linear_logprobs(
        ins3[0], ins3[1], targets, bias=ins3[2], temperature=temp, with_entropy=True,
        entropy_grad=True, chunk_tokens=4,
    )  # fmt: skip
    ent3.sum().backward()
    ins4 = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    naive(*ins4)[1].sum().backward()
    for got, exp in zip((x.grad for x in ins3), (x.grad for x in ins4)):
        assert torch.allclose(got, exp, atol=1e-5, rtol=1e-4)
    # without entropy_grad the entropies are detached values
    _, ent5 = linear_logprobs(hidden.requires_grad_(), weight, targets, with_entropy=True)
    assert not ent5.requires_grad


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_low_precision_forward_chunks_change_no_value(monkeypatch, entropy_grad):
    """bf16 products run the forward in smaller chunks than the backward (cache-sized
    blocks, LOW_PRECISION_FORWARD_BUDGET): log-probs, entropies and gradients are the same,
    bit for bit, as one chunk over every token."""
    import grpokit.algo.logprobs as mod

    g = torch.Generator().manual_seed(5)
    N, H, V = 37, 16, 300
    h0, w0 = torch.randn(N, H, generator=g), torch.randn(V, H, generator=g) * 0.3
    t = torch.randint(0, V, (N,), generator=g)
    monkeypatch.setattr(mod, "LOW_PRECISION_FORWARD_BUDGET", 4 * V * 5)  # 16 a chunk (floor)
    outs = []
    for chunk in (None, N):  # None: the rule (16-token forward chunks); N: one chunk
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        lp, ent = mod.linear_logprobs(
            h, w, t, compute_dtype=torch.bfloat16, chunk_tokens=chunk, with_entropy=True,
            entropy_grad=entropy_grad,
        )  # fmt: skip
        loss = lp.sum() + (0.1 * ent.sum() if entropy_grad else 0.0)
        outs.append((lp.detach(), ent.detach(), *torch.autograd.grad(loss, (h, w))))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_forward_chunks_are_even_so_no_short_product_rereads_the_head(monkeypatch):
    """37 tokens at 16 a chunk run as 13 + 13 + 11, not 16 + 16 + 5: a short last chunk's
    product reads the whole (V, H) weight as a full one does (2,048 tokens at 682 a chunk
    were 682 x 3 + 2). The values are those of one chunk over every token, bit for bit."""
    import grpokit.algo.logprobs as mod

    g = torch.Generator().manual_seed(5)
    N, H, V = 37, 16, 300
    h, w = torch.randn(N, H, generator=g), torch.randn(V, H, generator=g) * 0.3
    t = torch.randint(0, V, (N,), generator=g)
    want, _ = mod.linear_logprobs(h, w, t, compute_dtype=torch.bfloat16, chunk_tokens=N)
    monkeypatch.setattr(mod, "LOW_PRECISION_FORWARD_BUDGET", 4 * V * 16)  # 16 a chunk
    sizes, orig = [], mod._chunk_forward
    monkeypatch.setattr(
        mod, "_chunk_forward", lambda hc, *a: sizes.append(hc.shape[0]) or orig(hc, *a)
    )
    got, _ = mod.linear_logprobs(h, w, t, compute_dtype=torch.bfloat16)
    assert sizes == [13, 13, 11]
    assert torch.equal(got, want)


@pytest.mark.parametrize("rows", [7, 4096])
def test_weight_grad_in_vocabulary_blocks_equals_the_whole_product(rows, monkeypatch):
    """The head's weight gradient from the kept softmax, computed a block of vocabulary rows
    at a time (a last block shorter): the same float32 values as the whole bf16 product
    rounded once, bit for bit; in the products' own dtype it is that product."""
    from grpokit.algo import logprobs as LP

    monkeypatch.setattr(LP, "WEIGHT_GRAD_ROWS", rows)
    g = torch.Generator().manual_seed(0)
    q = torch.rand(37, 101, generator=g).bfloat16()
    hg = torch.randn(37, 24, generator=g).bfloat16()
    want = (q.t() @ hg).float()
    got = LP._weight_grad(q, hg, torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(LP._weight_grad(q, hg, torch.bfloat16), q.t() @ hg)


def test_weight_grad_blocks_through_a_transpose_give_the_same_gradient(monkeypatch):
    """With ``transpose`` the product reads plain operands: ``hg`` turned once, each
    vocabulary block of the kept softmax as it lies (a column slice), and each block's (H,
    rows) product turned back: the short last block too, and the gradient is the same dot
    products (float32 sums in the product's own order: close to the float64 value as the
    plain product is). A transpose that declines (None) leaves the plain product."""
    from grpokit.algo import logprobs as LP

    monkeypatch.setattr(LP, "WEIGHT_GRAD_ROWS", 40)
    g = torch.Generator().manual_seed(3)
    q = torch.rand(150, 101, generator=g).bfloat16()
    hg = torch.randn(150, 24, generator=g).bfloat16()
    seen = []

    def transpose(a):
        seen.append((tuple(a.shape), a.stride()))
        return a.t().contiguous()

    got = LP._weight_grad(q, hg, torch.float32, transpose)
    assert seen == [((150, 24), (24, 1)), ((24, 40), (40, 1)), ((24, 40), (40, 1)),
                    ((24, 21), (21, 1))]  # fmt: skip
    exact = q.double().t() @ hg.double()
    plain = LP._weight_grad(q, hg, torch.float32)
    torch.testing.assert_close(got.double(), exact, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got, plain, rtol=1e-2, atol=1e-2)
    assert torch.equal(LP._weight_grad(q, hg, torch.float32, lambda a: None), plain)
    # a transpose that turns hg but declines the blocks: their products turned by torch
    half = LP._weight_grad(q, hg, torch.float32, lambda a: a.t().contiguous() if a is hg else None)
    torch.testing.assert_close(half, plain, rtol=1e-2, atol=1e-2)
