"""The decode-attention C kernel (grpokit/speed/kernels.py) against torch's attention."""

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
    ],
)
def test_kernel_matches_torch_attention(n, KV, g, D, T, S):
    """float32 to float rounding, bf16 within torch's own bf16 error of the float32 result;
    any slot count (the softmax runs online: no buffer of S scores)."""
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
    assert kernels.sample_tokens(ok.to(torch.bfloat16), 1.0, None, u) is None
    assert kernels.sample_tokens(ok.t().contiguous().t(), 1.0, None, u) is None  # columns
    assert kernels.sample_tokens(ok, 1.0, None, u.double()) is None
    assert kernels.sample_tokens(ok, 1.0, None, u[:1]) is None
    assert torch.equal(kernels.sample_tokens(ok, 1.0, None, u), torch.tensor([5, 5]))
