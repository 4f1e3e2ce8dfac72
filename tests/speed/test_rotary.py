"""The training route's C rotary embedding and SwiGLU product (grpokit/speed/rotary.py,
elementwise_train.c) against transformers' and torch's operations."""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama import modeling_llama

from grpokit.speed import kernels, layers, rotary

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C kernels here")


def _tables(B, T, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 300, (B, T), generator=g).float()  # left padding: rows differ
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _qk(B, T, H, KV, D, dtype, seed=1):
    """q and k as Llama's attention makes them: (B, T, heads * D) products viewed as
    (B, heads, T, D) through a transpose (not contiguous)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H * D, generator=g).to(dtype).view(B, T, H, D).transpose(1, 2)
    k = torch.randn(B, T, KV * D, generator=g).to(dtype).view(B, T, KV, D).transpose(1, 2)
    return q.requires_grad_(), k.requires_grad_()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("batch_tables", [True, False], ids=["per-row", "shared"])
def test_rotary_equals_transformers_bit_for_bit(dtype, batch_tables):
    B, T, H, KV, D = 3, 19, 6, 2, 32
    cos, sin = _tables(B if batch_tables else 1, T, D)
    q0, k0 = _qk(B, T, H, KV, D, dtype)
    q1, k1 = (t.detach().clone().requires_grad_() for t in (q0, k0))
    g = torch.Generator().manual_seed(2)
    gq, gk = (torch.randn(t.shape, generator=g).to(dtype) for t in (q0, k0))
    amp = dict(device_type="cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    with torch.autocast(**amp):
        ref_q, ref_k = modeling_llama.apply_rotary_pos_emb(q0, k0, cos, sin)
        ref_q, ref_k = ref_q.to(dtype), ref_k.to(dtype)  # the attention's cast
        fn = rotary.rotary(modeling_llama.apply_rotary_pos_emb)
        out_q, out_k = fn(q1, k1, cos, sin)
    assert out_q.dtype == dtype and out_q.is_contiguous()
    assert torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k)
    torch.autograd.backward([ref_q, ref_k], [gq, gk])
    torch.autograd.backward([out_q, out_k], [gq, gk])
    assert torch.equal(q1.grad, q0.grad) and torch.equal(k1.grad, k0.grad)
    assert q1.grad.stride() == q1.stride()  # the input's layout: no copy in the view's backward


def test_rotary_runs_the_original_where_the_kernel_does_not_apply():
    cos, sin = _tables(2, 5, 16)
    q, k = _qk(2, 5, 4, 2, 16, torch.bfloat16)
    fn = rotary.rotary(modeling_llama.apply_rotary_pos_emb)
    # bf16 outside autocast: transformers' float32 result, not a bf16 one
    out_q, _ = fn(q, k, cos, sin)
    assert out_q.dtype == torch.float32
    # another unsqueeze_dim: the original's broadcasting
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    with torch.autocast("cpu", torch.bfloat16):
        a, _ = fn(qt, kt, cos, sin, unsqueeze_dim=2)
        b, _ = modeling_llama.apply_rotary_pos_emb(qt, kt, cos, sin, unsqueeze_dim=2)
    assert torch.equal(a, b)


def test_lean_layers_swap_rotary_in_and_out():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    original = modeling_llama.apply_rotary_pos_emb
    with rotary.lean_rotary(model) as n:
        assert n == 1
        assert modeling_llama.apply_rotary_pos_emb.grpokit_original is original
        with rotary.lean_rotary(model) as n2:  # nested: not wrapped twice
            assert n2 == 0
    assert modeling_llama.apply_rotary_pos_emb is original


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_silu_mul_kernels_against_torch(dtype):
    g0 = (torch.randn(4, 33, 96, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    u0 = torch.randn(4, 33, 96, generator=torch.Generator().manual_seed(4)).to(dtype)
    dy = torch.randn(4, 33, 96, generator=torch.Generator().manual_seed(5)).to(dtype)
    g, u = g0.clone().requires_grad_(), u0.clone().requires_grad_()
    y = F.silu(g) * u
    y.backward(dy)
    assert kernels.silu_mul_applies(g0, u0)
    y1 = kernels.silu_mul_forward(g0, u0)
    dg, du = kernels.silu_mul_backward(dy, g0, u0)
    # exp within 2 ulp of torch's: a bf16 result can differ in its last bit, rarely; float32
    # ones in their last bits (silu's gradient 1 + g (1 - s) loses digits where s is near 1)
    bf16 = dtype == torch.bfloat16
    tol = dict(rtol=8e-3, atol=1e-5) if bf16 else dict(rtol=1e-4, atol=1e-6)
    for got, want in ((y1, y), (dg, g.grad), (du, u.grad)):
        torch.testing.assert_close(got, want.detach(), **tol)
        assert not bf16 or (got == want).float().mean() > 0.95
    assert kernels.silu_mul_backward(dy, g0, u0, need_g=False)[0] is None
    assert torch.equal(kernels.silu_mul_backward(dy, g0, u0, need_g=False)[1], du)
    # the lean MLP's recomputation of the down projection's input is the forward's pass
    assert torch.equal(layers.silu_times(g0, u0), y1)
