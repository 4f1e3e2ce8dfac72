"""The decode-attention C kernel (grpokit/speed/kernels.py) against torch's attention."""

import ctypes
import shutil

import pytest
import torch
import torch.nn.functional as F

from grpokit.speed import kernels

needs_cc = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler: the kernel is not built"
)


def _case(n, KV, g, D, T, S, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    H = KV * g
    # the decode loop's queries: a slice of the (n, H + KV, D) q/k block, not contiguous
    qk = torch.randn(n, H + KV, D, generator=gen).to(dtype)
    q = qk[:, :H].reshape(n, KV, g, D)
    k = torch.randn(n, KV, T, D, generator=gen).to(dtype)
    v = torch.randn(n, KV, T, D, generator=gen).to(dtype)
    attend = torch.ones(n, S, dtype=torch.bool)
    for i in range(n):  # left padding of different widths, and a masked slot mid-row
        attend[i, : (i * 7) % max(1, S - 2)] = False
        attend[i, S // 2] = i % 2 == 0
    attend[:, -1] = True  # every row sees its own new token
    return q, k, v, attend


def _reference(q, k, v, attend, scale):
    S = attend.shape[1]
    return F.scaled_dot_product_attention(
        q.float(),
        k[:, :, :S].float(),
        v[:, :, :S].float(),
        attn_mask=attend[:, None, None],
        scale=scale,
    )


@needs_cc
@pytest.mark.parametrize(
    "n,KV,g,D,T,S",
    [
        (32, 3, 3, 64, 200, 124),
        (5, 2, 1, 32, 40, 40),
        (3, 1, 16, 128, 9, 7),
        (2, 2, 7, 64, 5000, 4999),
        (3, 2, 2, 24, 30, 29),  # D not a multiple of 16: the scores' scalar loop
    ],
)
def test_kernel_matches_torch_attention(n, KV, g, D, T, S):
    """float32 to float rounding, bf16 within torch's own bf16 error of the float32 result;
    any slot count (the softmax runs online: no buffer of S scores); blocks of 16 keys and
    fewer (the scores' shuffle reduction), head sizes off the 16-lane grid."""
    scale = D**-0.5
    q, k, v, attend = _case(n, KV, g, D, T, S, torch.float32)
    got = kernels.decode_attention(q, k, v, attend, scale)
    assert got is not None and got.dtype == torch.float32
    torch.testing.assert_close(got, _reference(q, k, v, attend, scale), atol=2e-5, rtol=1e-4)
    q, k, v, attend = _case(n, KV, g, D, T, S, torch.bfloat16)
    got = kernels.decode_attention(q, k, v, attend, scale)
    assert got is not None and got.dtype == torch.bfloat16
    exact = _reference(q, k, v, attend, scale)
    ours = (got.float() - exact).abs().max().item()
    mask = attend[:, None, None]
    torchs = F.scaled_dot_product_attention(
        q, k[:, :, :S], v[:, :, :S], attn_mask=mask, scale=scale
    )
    theirs = (torchs.float() - exact).abs().max().item()
    assert ours <= max(1.5 * theirs, 1e-2), (ours, theirs)


@needs_cc
def test_kernel_declines_what_it_does_not_read():
    """Past its limits or layouts it returns None, and the decode loop keeps torch's path."""
    q, k, v, attend = _case(2, 1, 17, 64, 8, 8, torch.float32)  # g > 16
    assert kernels.decode_attention(q, k, v, attend, 0.1) is None
    q, k, v, attend = _case(2, 2, 2, 16, 8, 8, torch.float16)  # fp16
    assert kernels.decode_attention(q, k, v, attend, 0.1) is None
    q, k, v, attend = _case(2, 2, 2, 16, 8, 8, torch.float32)
    assert kernels.decode_attention(q, k[:, :, ::2], v[:, :, ::2], attend[:, :4], 0.1) is None
    assert kernels.decode_attention(q, k, v, attend.float(), 0.1) is None
    assert kernels.decode_attention(q, k, v, attend, 0.1) is not None


def test_without_the_kernel_the_decoder_keeps_torch_attention(monkeypatch, tmp_path):
    """``GRPOKIT_NO_KERNELS=1`` (or no compiler): no build, None, torch's attention."""
    monkeypatch.setattr(kernels, "_lib", None)
    monkeypatch.setenv("GRPOKIT_NO_KERNELS", "1")
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    q, k, v, attend = _case(2, 2, 2, 16, 8, 8, torch.float32)
    assert kernels.decode_attention(q, k, v, attend, 0.1) is None
    assert not (tmp_path / "kernels").exists()
    monkeypatch.setattr(kernels, "_lib", None)
    monkeypatch.delenv("GRPOKIT_NO_KERNELS")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(kernels, "library_path", lambda: tmp_path / "kernels" / "x.so")
    assert kernels.decode_attention(q, k, v, attend, 0.1) is None  # a failed build: logged


@needs_cc
def test_build_is_keyed_by_source_and_cpu(monkeypatch, tmp_path):
    """A fresh cache builds the library once; its name carries the source, flags and CPU."""
    monkeypatch.setattr(kernels, "_lib", None)
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    monkeypatch.delenv("GRPOKIT_NO_KERNELS", raising=False)
    path = kernels.library_path()
    assert path.parent == tmp_path / "kernels" and not path.exists()
    q, k, v, attend = _case(3, 2, 2, 16, 8, 8, torch.float32)
    assert kernels.decode_attention(q, k, v, attend, 0.25) is not None
    assert path.exists()
    monkeypatch.setattr(kernels, "_cpu_key", lambda: "another cpu")
    assert kernels.library_path() != path


def _torch_draw(logits, temperature, min_p, u):
    from grpokit.rollout.sampler import draw, filter_min_p

    scores = filter_min_p(logits / temperature, min_p)
    return draw(scores.softmax(-1), None, u.clone())


@needs_cc
@pytest.mark.parametrize("V", [49_152, 1_000, 513, 7])
@pytest.mark.parametrize("temperature,min_p", [(1.0, None), (0.7, None), (1.3, 0.05)])
def test_sample_kernel_draws_what_the_torch_ops_draw(V, temperature, min_p):
    """The same uniforms give the same tokens as softmax + cumsum + searchsorted (the
    distributions agree to float rounding; these draws never land on a boundary), masked
    tokens (-inf) are never drawn, and a row stride other than V is read as such."""
    gen = torch.Generator().manual_seed(V)
    wide = torch.randn(64, V + 5, generator=gen) * 4
    logits = wide[:, :V]  # rows V + 5 apart
    logits[:, : V // 10] = float("-inf")
    u = torch.rand(64, 1, generator=gen)
    got = kernels.sample_tokens(logits, temperature, min_p, u)
    assert got is not None and got.dtype == torch.int64
    assert torch.equal(got, _torch_draw(logits, temperature, min_p, u))
    assert (got >= V // 10).all()


@needs_cc
@pytest.mark.parametrize("min_p", [None, 0.05])
def test_sample_kernel_draws_from_bf16_what_their_float32_copy_draws(min_p):
    """bf16 logits (a bf16 model's decode step), a row stride other than V included: the
    tokens the kernel draws from their float32 copy, from the same uniforms; the same for a
    row it cannot draw (left to torch's ops)."""
    gen = torch.Generator().manual_seed(9)
    wide = (torch.randn(48, 49_157, generator=gen) * 4).bfloat16()
    logits = wide[:, :49_152]
    logits[:, :4_000] = float("-inf")
    u = torch.rand(48, 1, generator=gen)
    got = kernels.sample_tokens(logits, 0.8, min_p, u)
    assert got is not None and torch.equal(
        got, kernels.sample_tokens(logits.float(), 0.8, min_p, u)
    )
    assert torch.equal(got, _torch_draw(logits.float(), 0.8, min_p, u))
    logits[7, 9] = float("nan")
    assert kernels.sample_tokens(logits, 0.8, min_p, u) is None


@needs_cc
def test_sample_kernel_is_an_exact_categorical_sample():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0] + [0.0] * 600)  # past one 512 block
    probs[600] = 0.25
    probs = probs / probs.sum()
    logits = probs.log().repeat(40_000, 1)  # log 0 = -inf: never drawn
    gen = torch.Generator().manual_seed(3)
    got = kernels.sample_tokens(logits, 1.0, None, torch.rand(40_000, 1, generator=gen))
    freq = torch.bincount(got, minlength=probs.numel()) / 40_000.0
    assert freq[probs == 0].sum() == 0
    # 4 sigma of a binomial proportion at n=40k is about 0.01
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)


@needs_cc
def test_sample_kernel_leaves_what_it_cannot_draw_to_torch():
    u = torch.full((2, 1), 0.5)
    ok = torch.zeros(2, 10)
    for bad in (float("nan"), float("inf")):
        x = ok.clone()
        x[1, 3] = bad
        assert kernels.sample_tokens(x, 1.0, None, u) is None
    assert kernels.sample_tokens(torch.full((2, 10), float("-inf")), 1.0, None, u) is None
    assert kernels.sample_tokens(ok.half(), 1.0, None, u) is None
    assert kernels.sample_tokens(ok.t().contiguous().t(), 1.0, None, u) is None  # columns
    assert kernels.sample_tokens(ok, 1.0, None, u.double()) is None
    assert kernels.sample_tokens(ok, 1.0, None, u[:1]) is None
    assert torch.equal(kernels.sample_tokens(ok, 1.0, None, u), torch.tensor([5, 5]))


def _head_reference(x, scale, t):
    """float64 log-softmax statistics of x (n, V) * scale at targets t."""
    z = x.double() * scale
    ls = torch.log_softmax(z, -1)
    lp = ls.gather(-1, t[:, None]).squeeze(1)
    return lp, z.gather(-1, t[:, None]).squeeze(1) - lp, -(ls.exp() * ls).sum(-1), ls.exp()


@needs_cc
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("V", [1, 17, 300, 1000])
@pytest.mark.parametrize("scale", [1.0, 1 / 0.7])
def test_head_log_softmax_matches_float64(dtype, V, scale):
    """Log-probs, lse, entropy and the kept softmax of the C head against float64, over
    vocabularies that are not whole vector or block lengths, from a strided (sliced) input."""
    g = torch.Generator().manual_seed(V)
    n = 7
    x = (torch.randn(n, V + 3, generator=g) * 4).to(dtype)[:, 2 : V + 2]
    t = torch.randint(0, V, (n,), generator=g)
    logp, lse, ent = torch.empty(n), torch.empty(n), torch.empty(n)
    probs = torch.empty(n, V, dtype=dtype)
    assert kernels.head_log_softmax(x, scale, t, logp, lse, ent, probs)
    rlp, rlse, rent, rp = _head_reference(x, scale, t)
    torch.testing.assert_close(logp.double(), rlp, atol=2e-5, rtol=0)
    torch.testing.assert_close(lse.double(), rlse, atol=2e-5, rtol=0)
    torch.testing.assert_close(ent.double(), rent, atol=2e-5, rtol=0)
    # the softmax in x's dtype: bf16, one rounding (a unit at most); float32, exp of a log-prob
    # whose float32 error grows with its size (|log p| up to ~60 here: ~1e-5 relative)
    rel = 2.0**-7 if dtype == torch.bfloat16 else 3e-5
    assert ((probs.double() - rp).abs() <= rel * rp + 1e-30).all()
    # without entropy and softmax: the same log-probs, nothing else touched
    lp2, lse2 = torch.full((n,), 5.0), torch.empty(n)
    assert kernels.head_log_softmax(x, scale, t, lp2, lse2)
    assert torch.equal(lp2, logp) and torch.equal(lse2, lse)


@needs_cc
def test_head_log_softmax_declines_what_torch_must_decide():
    """Rows that are not finite, targets outside the vocabulary and inputs it does not read
    return False, so linear_logprobs runs torch's operations (NaN, or torch's index error)."""
    x = torch.randn(3, 40)
    t = torch.tensor([1, 2, 3])
    out = (torch.empty(3), torch.empty(3))
    assert kernels.head_log_softmax(x, 1.0, t, *out)
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[1, 5] = bad
        assert not kernels.head_log_softmax(y, 1.0, t, *out)
    assert not kernels.head_log_softmax(x, 1.0, torch.tensor([1, 40, 3]), *out)
    assert not kernels.head_log_softmax(x, 1.0, torch.tensor([1, -1, 3]), *out)
    assert not kernels.head_log_softmax(x.half(), 1.0, t, *out)  # fp16: torch's
    assert not kernels.head_log_softmax(x.t().contiguous().t(), 1.0, t, *out)  # column-major
    assert not kernels.head_log_softmax(x, 0.0, t, *out)
    assert not kernels.head_log_softmax(x, 1.0, t.int(), *out)


@needs_cc
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_logprobs_with_the_c_head_equals_torch(dtype):
    """linear_logprobs with the C head (softmax_rows) against torch's chunk operations: the
    same log-probs, entropies and gradients (through the kept softmax and through the
    recomputing backward) up to float32 summation order and one rounding of the softmax."""
    from grpokit.algo import linear_logprobs

    g = torch.Generator().manual_seed(5)
    N, H, V = 45, 32, 777
    h0 = torch.randn(N, H, generator=g)
    w0 = torch.randn(V, H, generator=g) * 0.3
    t = torch.randint(0, V, (N,), generator=g)
    up = torch.randn(N, generator=g)

    def declines(*args):  # a softmax_rows that takes no chunk: torch's float32 blocks then
        return False

    for keep in (1 << 28, 0):
        res = []
        for rows in (None, kernels.head_log_softmax, declines):
            h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
            lp, ent = linear_logprobs(
                h, w, t, temperature=0.7, compute_dtype=dtype, with_entropy=True,
                chunk_tokens=16, keep_bytes=keep, softmax_rows=rows,
            )  # fmt: skip
            res.append((lp, ent, *torch.autograd.grad((lp * up).sum(), (h, w))))
        (lp_a, ent_a, gh_a, gw_a), (lp_b, ent_b, gh_b, gw_b), declined = res
        for a, b in zip(res[0], declined):  # the product's output upcast: the same numbers
            assert torch.equal(a, b)
        torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=0)
        tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: one rounding of the softmax
        torch.testing.assert_close(gh_b, gh_a, atol=tol, rtol=tol)
        torch.testing.assert_close(gw_b, gw_a, atol=tol, rtol=tol)


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 50), (4, 37, 576)])  # one thread; rows split over threads
def test_rms_norm_kernels_match_autograd_through_transformers_ops(dtype, shape):
    """The C RMSNorm's output and both gradients against autograd through LlamaRMSNorm's
    operations (upcast, pow, mean, rsqrt, product, cast, weight product) in float64 where
    torch rounds nothing, and against the same operations in x's dtype."""
    g = torch.Generator().manual_seed(len(shape))
    C = shape[-1]
    x0 = (torch.randn(shape, generator=g) * 3).to(dtype)
    w0 = torch.randn(C, generator=g) * 0.5 + 1
    dy = torch.randn(shape, generator=g)
    eps = 1e-5

    def torch_norm(x, w):
        hs = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
        r = torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + eps)
        return w * (hs * r).to(x.dtype)

    y, r = kernels.rms_norm_forward(x0, w0, eps)
    dx, dw = kernels.rms_norm_backward(dy, x0, w0, r)
    assert (
        y.dtype == dw.dtype == torch.float32 and dx.dtype == dtype and r.shape == (x0.numel() // C,)
    )
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    ty = torch_norm(x, w)
    ty.backward(dy)
    if dtype == torch.float32:  # float32 throughout: against float64
        x64, w64 = x0.double().requires_grad_(), w0.double().requires_grad_()
        y64 = torch_norm(x64, w64)
        y64.backward(dy.double())
        torch.testing.assert_close(y.double(), y64, rtol=2e-6, atol=1e-6)
        torch.testing.assert_close(dx.double(), x64.grad, rtol=1e-5, atol=2e-6)
        torch.testing.assert_close(dw.double(), w64.grad, rtol=1e-5, atol=1e-4)
    # against torch's own operations in x's dtype: bf16 roundings at the same points
    bf = dtype == torch.bfloat16
    torch.testing.assert_close(y, ty.detach(), rtol=1e-2 if bf else 1e-5, atol=1e-5)
    torch.testing.assert_close(
        dx.float(), x.grad.float(), rtol=1e-2 if bf else 1e-5, atol=1e-2 if bf else 1e-6
    )
    torch.testing.assert_close(dw, w.grad, rtol=1e-3 if bf else 1e-5, atol=1e-3)
    assert kernels.rms_norm_backward(dy, x0, w0, r, need_w=False)[1] is None
    # what the kernels do not read: a bf16 weight, a strided input
    assert not kernels.rms_norm_applies(x0, w0.bfloat16())
    assert not kernels.rms_norm_applies(x0.transpose(0, -1), torch.ones(x0.shape[0]))
    assert kernels.rms_norm_forward(x0, w0.bfloat16(), eps) is None


def _has_flag(name: str) -> bool:
    try:
        return f" {name}" in open("/proc/cpuinfo").read()
    except OSError:
        return False


def _has_amx() -> bool:
    return _has_flag("amx_bf16") and _has_flag("amx_tile")


@needs_cc
@pytest.mark.parametrize("M", [1, 5, 16, 17, 32, 33, 70])
@pytest.mark.parametrize(
    "N, K, bias", [(960, 576, False), (48, 64, True), (16, 32, True), (80, 96, True)]
)
@pytest.mark.parametrize("isa", ["amx", "avx512"])
def test_packed_products_match_float32_sums(M, N, K, bias, isa, monkeypatch):
    """The decode loop's bf16 products (amx_linear.c) on AMX and on AVX512-BF16 (oneDNN
    capped below AMX: the bf16 golden runs' setting): x w^T + b summed in float32, rounded
    once to bf16; rows in the kernels' groups (AMX 32, AVX512 8 / 4 / 2 / 1), past them, and
    column blocks in threes and the rest. Where the CPU lacks the ISA, there is no packer
    (the decoder keeps oneDNN)."""
    if isa == "avx512":
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    pack = kernels.packed_linear_packer()
    have = _has_amx() if isa == "amx" else _has_flag("avx512_bf16")
    if not have:
        assert pack is None or (isa == "amx" and pack(*_w(N, K)).isa == 1)
        pytest.skip(f"no {isa} bf16 products on this CPU")
    assert pack is not None
    gen = torch.Generator().manual_seed(M * 1000 + N)
    w = torch.randn(N, K, generator=gen).to(torch.bfloat16)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    b = torch.randn(N, generator=gen).to(torch.bfloat16) if bias else None
    linear = pack(w, b)
    assert linear.isa == (2 if isa == "amx" else 1)
    got = linear(x)
    want = x.float() @ w.float().t() + (b.float() if bias else 0.0)
    assert got.dtype == torch.bfloat16 and got.shape == (M, N)
    # one bf16 rounding of a float32 sum: within half a bf16 unit of the exact value
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-3)
    if isa == "amx":  # the weights' prefetch (any distance, past the end too) moves no value
        ahead = ctypes.c_int.in_dll(kernels._load(), "amx_prefetch")
        assert ahead.value == 2
        try:
            for d in (0, 1, 40):
                ahead.value = d
                assert torch.equal(linear(x), got)
        finally:
            ahead.value = 2


def _w(N, K):
    return torch.zeros(N, K, dtype=torch.bfloat16), None


@needs_cc
def test_packed_products_decline_what_they_do_not_take(monkeypatch):
    pack = kernels.packed_linear_packer()
    if pack is None:
        pytest.skip("no AMX or AVX512-BF16 on this CPU")
    w = torch.zeros(48, 64, dtype=torch.bfloat16)
    assert pack(torch.zeros(40, 64, dtype=torch.bfloat16), None) is None  # N % 16
    assert pack(torch.zeros(48, 48, dtype=torch.bfloat16), None) is None  # K % 32
    assert pack(w.float(), None) is None
    assert pack(w, None)(torch.zeros(0, 64, dtype=torch.bfloat16)).shape == (0, 48)  # no rows
    with pytest.raises(ValueError, match="packed_linear"):
        pack(w, None)(torch.zeros(2, 32, dtype=torch.bfloat16))
    # oneDNN capped below AMX (the bf16 golden runs): the decode products stay off AMX
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert kernels.packed_linear_isa() == 1
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert kernels.packed_linear_isa() == (2 if _has_amx() else 1)
    monkeypatch.setattr(kernels, "AVX512_PRODUCTS", False)  # the switch for comparisons
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert kernels.packed_linear_packer() is None


@needs_cc
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_transposed_copies_whole_blocks_tails_and_column_slices(dtype):
    """kernels.transposed moves every value: whole 16 x 16 blocks, the rows and columns past
    them, one-row and one-column tensors, a column slice of a wider tensor (its row stride)."""
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(100, 300, generator=g).to(dtype)
    cases = [
        torch.randn(r, c, generator=g).to(dtype)
        for r, c in ((64, 48), (2064, 576), (17, 33), (15, 16), (16, 15), (1, 7), (7, 1), (0, 5))
    ]
    cases += [wide[:, 17:250], wide[3:90, 32:64]]  # fmt: skip
    for x in cases:
        got = kernels.transposed(x)
        assert got is not None and got.is_contiguous(), tuple(x.shape)
        assert torch.equal(got, x.t()), tuple(x.shape)
    # what it does not take: float32, a column stride, three dimensions
    assert kernels.transposed(torch.zeros(4, 4)) is None
    assert kernels.transposed(wide.t()) is None
    assert kernels.transposed(torch.zeros(2, 4, 4, dtype=dtype)) is None


@needs_cc
def test_summed_as_float_adds_in_autograd_s_order_bit_for_bit():
    """kernels.summed_as_float: parts[0].float(), then .add_(p.float()) for each later part,
    bit for bit (float32 sums of bf16 values in that order: a reordering changes last bits);
    it declines float32 parts, mixed shapes and non-contiguous parts."""
    g = torch.Generator().manual_seed(0)
    scales = (1e3, 1.0, 1e-3, 7.0)
    parts = [(torch.randn(3, 77, 129, generator=g) * s).bfloat16() for s in scales]
    for k in range(1, 5):
        want = parts[0].float()
        for p in parts[1:k]:
            want = want.add_(p.float())
        got = kernels.summed_as_float(parts[:k])
        assert got.dtype == torch.float32 and torch.equal(got, want), k
    rev = parts[2].float().add_(parts[1].float()).add_(parts[0].float())
    assert not torch.equal(kernels.summed_as_float(parts[:3]), rev)  # the order is seen
    assert kernels.summed_as_float([p.float() for p in parts]) is None
    assert kernels.summed_as_float([parts[0], parts[1][:, :5]]) is None
    assert kernels.summed_as_float([parts[0], parts[1].transpose(1, 2)]) is None


@needs_cc
@pytest.mark.parametrize("shape", [(2125, 576), (7, 13), (3, 33)])
def test_keep_times_bits_are_the_float_products(shape):
    """bf16 ``x * keep`` bit for bit as the float product rounded back: a kept value is x, a
    dropped one x's signed zero (-0 for a negative), a dropped infinity NaN, and NaN in comes
    out quiet with its payload (x | 0x40) whatever the mask; any length (a tail past the last
    32 values). float32 too."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g).bfloat16()
    keep = (torch.rand(shape, generator=g) > 0.3).to(torch.uint8)
    bits = x.view(torch.int16).view(-1)
    special = [0x7F80, 0xFF80, 0x7F81, 0xFF81, 0x7FC0, 0x0000, 0x8000, 0xBFC0, 0x0001]
    for at in (0, bits.numel() - len(special)):  # in the first 32 and in the tail
        for i, v in enumerate(special):
            bits[at + i] = v - (1 << 16) if v >= 1 << 15 else v
        keep.view(-1)[at : at + len(special)] = torch.tensor(
            [0, 0, 0, 1, 0, 0, 0, 0, 1][: len(special)]
        )
    got = kernels.keep_times(x, keep).view(torch.int16).view(-1).int() & 0xFFFF
    u = x.view(torch.int16).view(-1).int() & 0xFFFF
    k = keep.view(-1).bool()
    mag = u & 0x7FFF
    want = torch.where(k, u, u & 0x8000)
    want = torch.where(~k & (mag == 0x7F80), torch.full_like(u, 0xFFC0), want)
    want = torch.where(mag > 0x7F80, u | 0x40, want)
    assert torch.equal(got, want)
    product = (x.float() * keep.float()).bfloat16()
    finite = ~product.isnan()
    assert torch.equal(kernels.keep_times(x, keep)[finite], product[finite])
    xf = torch.randn(shape, generator=g)
    assert torch.equal(kernels.keep_times(xf, keep), xf * keep)


@needs_cc
def test_summed_as_float_with_masks_is_keep_times_then_the_sum():
    """With masks, each masked part is kernels.keep_times' ``p * keep`` (negative zeros
    included) before the same float32 sum, bit for bit; a mask of another shape or dtype is
    declined."""
    g = torch.Generator().manual_seed(1)
    parts = [(torch.randn(2, 65, 131, generator=g) * s).bfloat16() for s in (1e2, 1.0, 3e-2)]
    keeps = [(torch.rand(p.shape, generator=g) > 0.3).to(torch.uint8) for p in parts]
    for masks in ([keeps[0], None, keeps[2]], [None, keeps[1], None], keeps):
        want = None
        for p, m in zip(parts, masks):
            q = (p if m is None else kernels.keep_times(p, m)).float()
            want = q if want is None else want.add_(q)
        got = kernels.summed_as_float(parts, masks)
        assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())
        assert not torch.equal(got, kernels.summed_as_float(parts))  # the masks are applied
    assert kernels.summed_as_float(parts, [keeps[0].bool(), None, None]) is None
    assert kernels.summed_as_float(parts, [keeps[0][:, :5], None, None]) is None
    assert kernels.summed_as_float(parts, [None, None]) is None
