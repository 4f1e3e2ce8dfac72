"""grpokit's attention backward (SDPA forward, batched float32 backward) against SDPA's own
autograd, alone and inside the trainer's training forward."""

import contextlib
import dataclasses
import shutil

import pytest
import torch
import torch.nn.functional as F

from grpokit.speed import attention as A
from grpokit.speed import kernels

needs_cc = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler: the kernel is not built"
)


def _repeat(x, r):
    b, g, n, d = x.shape
    return x[:, :, None].expand(b, g, r, n, d).reshape(b, g * r, n, d)


def _inputs(dtype, B=5, H=6, G=2, Lq=7, Lk=11, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=g).to(dtype)
    k = torch.randn(B, G, Lk, D, generator=g).to(dtype)
    v = torch.randn(B, G, Lk, D, generator=g).to(dtype)
    mask = A.causal_mask(Lq, Lk, "cpu").expand(B, 1, Lq, Lk).clone()
    mask[1, :, :, :3] = False  # left padding of one row
    mask[2, :, 0, :] = False  # a query that sees nothing (a padding position)
    up = torch.randn(B, H, Lq, D, generator=g).to(dtype)
    return q, k, v, mask, up


def _grads(fn, q, k, v, up):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), up))


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.bfloat16, 5e-2)])
def test_attention_matches_sdpa_autograd(dtype, atol, monkeypatch):
    q, k, v, mask, up = _inputs(dtype)
    R = q.shape[1] // k.shape[1]
    live = mask.any(-1, keepdim=True)  # (B, 1, Lq, 1): rows with at least one key

    def ref(q, k, v):
        out = F.scaled_dot_product_attention(q, _repeat(k, R), _repeat(v, R), attn_mask=mask)
        return out * live  # SDPA's output for a query without keys is not defined

    def ours(q, k, v):
        return A.attention(q, k, v, mask, q.shape[-1] ** -0.5) * live

    expect = _grads(ref, q, k, v, up)
    got = _grads(ours, q, k, v, up)
    for a, b in zip(got, expect):
        assert a.dtype == dtype and torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b.double(), atol=atol, rtol=atol)
    # the backward in row slices (a bound on its float32 blocks) gives the same numbers
    monkeypatch.setattr(A, "_BLOCK_BYTES", 1)
    for a, b in zip(_grads(ours, q, k, v, up), got):
        assert torch.equal(a, b)


def _both_paths(dtype, monkeypatch, mask_kind="rows", **shape):
    """Outputs and gradients of A.attention by the C kernel's backward and by torch's (the
    kernel's forward on both)."""
    q, k, v, mask, up = _inputs(dtype, **shape)
    if mask_kind == "shared":
        mask = mask[:1]
    elif mask_kind == "none":
        mask = None
    scale = q.shape[-1] ** -0.5

    def ours(q, k, v):
        return A.attention(q, k, v, mask, scale)

    monkeypatch.setattr(A, "FLOAT32_TOO", True)
    monkeypatch.setattr(A, "USE_KERNEL", True)
    calls = []
    real = kernels.attention_grad_scores
    monkeypatch.setattr(kernels, "attention_grad_scores", lambda *a: calls.append(1) or real(*a))
    got = _grads(ours, q, k, v, up)
    assert calls, "the kernel was not called"
    # the torch backward after the same (kernel) forward: the kernel declines
    monkeypatch.setattr(kernels, "attention_grad_scores", lambda *a: calls.append(1))
    calls.clear()
    expect = _grads(ours, q, k, v, up)
    assert calls
    return got, expect


@needs_cc
@pytest.mark.parametrize("mask_kind", ["rows", "shared", "none"])
@pytest.mark.parametrize(
    "shape",
    [dict(), dict(B=3, H=9, G=3, Lq=21, Lk=37, D=64), dict(B=3, H=2, G=1, Lq=5, Lk=16, D=16)],
)
def test_kernel_backward_equals_the_torch_backward_float32(shape, mask_kind, monkeypatch):
    """float32: the same mathematics, only sums in another order (a query row without keys
    gets zero gradients on both paths); odd key counts (past the kernel's 16-key blocks),
    query counts past its 4-row blocks, one mask for all rows, no mask."""
    got, expect = _both_paths(torch.float32, monkeypatch, mask_kind, **shape)
    for a, b in zip(got, expect):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


@needs_cc
def test_kernel_backward_rounds_where_the_torch_backward_rounds_bf16(monkeypatch):
    """bf16: P and dS rounded to bf16 before the products that consume them, on both paths;
    they differ only where a float32 sum in another order lands on the other side of a bf16
    rounding boundary (one unit in the last place on a few entries)."""
    got, expect = _both_paths(torch.bfloat16, monkeypatch, B=4, H=9, G=3, Lq=33, Lk=40, D=64)
    for a, b in zip(got[1:], expect[1:]):
        diff = (a.float() - b.float()).abs()
        assert (diff > 0).float().mean() < 0.02
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=2e-2)


@needs_cc
def test_kernel_scores_alone():
    """P and dS of the kernel against their definition in float64."""
    q, k, v, mask, up = _inputs(torch.float32, B=3, H=4, G=2, Lq=6, Lk=19, D=32)
    qp = q.reshape(3, 2, 12, 32)
    mp = A.grouped_mask(mask, 2)
    out = torch.randn(3, 2, 12, 32)
    g = up.reshape(3, 2, 12, 32)
    P, dS = kernels.attention_grad_scores(qp, k, v, out, g, mp, 0.3)
    S = (qp.double() @ k.double().transpose(-1, -2) * 0.3).masked_fill(~mp, float("-inf"))
    Pd = torch.softmax(S, -1).nan_to_num(0.0)
    dP = g.double() @ v.double().transpose(-1, -2)
    dSd = Pd * (dP - (g.double() * out.double()).sum(-1, keepdim=True)) * 0.3
    torch.testing.assert_close(P.double(), Pd, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(dS.double(), dSd, atol=1e-5, rtol=1e-4)
    dead = [0, 6]  # query 0 of both stacked query heads sees no key (row 2)
    assert (P[2, :, dead] == 0).all() and (dS[2, :, dead] == 0).all()
    assert kernels.attention_grad_scores(qp.double(), k, v, out, g, mp, 0.3) is None


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["rows", "shared", "none"])
def test_kernel_forward_equals_sdpa(dtype, mask_kind):
    """The forward kernel against SDPA on stacked query heads: float32 within 1e-6; bf16 within
    one bf16 unit (SDPA's sums run in another order); a query that sees no key gives 0."""
    q, k, v, mask, _ = _inputs(dtype, B=4, H=9, G=3, Lq=37, Lk=70, D=64)
    qp = q.reshape(4, 3, 3 * 37, 64)
    mp = {"rows": A.grouped_mask(mask, 3), "shared": A.grouped_mask(mask[:1], 3), "none": None}
    mp = mp[mask_kind]
    got = kernels.attention_forward(qp, k, v, mp, 0.125)
    want = F.scaled_dot_product_attention(qp, k, v, attn_mask=mp, scale=0.125)
    live = torch.ones(1, 1, 3 * 37, 1, dtype=torch.bool) if mp is None else mp.any(-1, True)
    tol = 1e-6 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close((got * live).float(), (want * live).float(), atol=tol, rtol=tol)
    assert (got * ~live == 0).all()
    if mask_kind == "rows":
        assert (got[2, :, [0, 37, 74]] == 0).all()  # query 0 of row 2 sees nothing


def test_attention_without_mask_and_causal():
    q, k, v, _, up = _inputs(torch.float64, Lq=6, Lk=6)
    causal = A.causal_mask(6, 6, "cpu")
    ref = _grads(
        lambda q, k, v: F.scaled_dot_product_attention(
            q, _repeat(k, 3), _repeat(v, 3), is_causal=True
        ),
        q, k, v, up,
    )  # fmt: skip
    got = _grads(lambda q, k, v: A.attention(q, k, v, causal, 8**-0.5), q, k, v, up)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    full = _grads(lambda q, k, v: A.attention(q, k, v, None, 8**-0.5), q, k, v, up)
    ref_full = _grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, _repeat(k, 3), _repeat(v, 3)),
        q, k, v, up,
    )  # fmt: skip
    for a, b in zip(full, ref_full):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_training_attention_routes_only_graph_building_cpu_forwards():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with A.training_attention():
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is A.sdpa_train_attention
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    with A.training_attention(enabled=False):
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before


@pytest.mark.parametrize("overrides", [{}, {"share_prompt_forward": False}, {"bf16": True}])
def test_trainer_forward_with_own_attention_backward(
    tmp_path, tiny_model_dir, overrides, monkeypatch
):
    """The trainer's training forward with ``attention_backward`` on and off: same log-probs
    (the forward is SDPA's either way) and the same gradients, through the shared-prompt KV
    cache, the padded batch, and under bf16 autocast."""
    from grpokit.speed.attention import training_attention
    from grpokit.testing import tiny_run_config
    from grpokit.trainer import GRPOTrainer
    from tests.trainer.test_forward_batches import _rollout

    monkeypatch.setattr(A, "FLOAT32_TOO", True)  # tight float32 check of the routing
    tr = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "run", **overrides))
    ro = _rollout(tr)
    rows = torch.tensor([4, 0, 5, 2])
    mask = ro.completion_mask[rows].float()
    out = {}
    calls = []
    orig = A.AttentionFunction.backward

    def counting(ctx, g):
        calls.append(1)
        return orig(ctx, g)

    for on in (True, False):
        tr.model.zero_grad(set_to_none=True)
        A.AttentionFunction.backward = staticmethod(counting)
        try:
            with training_attention(on):
                logp, _ = tr.logprobs(tr.model, ro, rows)
            (logp * mask * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        finally:
            A.AttentionFunction.backward = staticmethod(orig)
        grads = {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}
        out[on] = (logp * mask, grads)
        assert bool(calls) == on  # ours ran only when routed
        calls.clear()
    (l1, g1), (l0, g0) = out[True], out[False]
    torch.testing.assert_close(l1, l0, atol=1e-6 if not overrides.get("bf16") else 2e-2, rtol=0)
    tol = 1e-4 if not overrides.get("bf16") else 5e-2
    for n in g0:
        scale = g0[n].abs().max().clamp(min=1e-6)
        assert ((g1[n] - g0[n]).abs().max() / scale).item() < tol, n
    assert dataclasses.replace(tr.cfg).attention_backward is True


@pytest.mark.parametrize("why", ["float32", "long"])
def test_float32_and_long_forwards_keep_sdpa(tmp_path, tiny_model_dir, why, monkeypatch):
    """In float32 (where SDPA's backward measured as fast) and past MAX_QUERIES queries
    (where SDPA's blocked backward wins) the route is not taken."""
    from grpokit.speed.attention import training_attention
    from grpokit.testing import tiny_run_config
    from grpokit.trainer import GRPOTrainer
    from tests.trainer.test_forward_batches import _rollout

    if why == "long":
        monkeypatch.setattr(A, "MAX_QUERIES", 1)
    tr = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "run", bf16=why == "long"))
    ro = _rollout(tr)
    seen = []
    orig = A.AttentionFunction.apply
    try:
        A.AttentionFunction.apply = lambda *a: seen.append(1) or orig(*a)
        with training_attention():
            tr.logprobs(tr.model, ro, torch.tensor([0, 1]))
    finally:
        A.AttentionFunction.apply = orig
    assert not seen


def _model_grads(model, ids, mask, shared: bool):
    model.zero_grad(set_to_none=True)
    ctx = A.shared_mask_attention() if shared else contextlib.nullcontext()
    with ctx:
        out = model(input_ids=ids, attention_mask=mask).logits
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_shared_mask_and_unrepeated_kv_change_no_bit(tiny_model_dir):
    """The float32 training forward with one float mask per forward and key/value heads saved
    unrepeated: bit-identical logits and gradients to transformers' sdpa path, one (rows, 1,
    L, L) mask alive instead of one per layer, and no (rows, heads, L, D) key/value copies."""
    from transformers import AutoModelForCausalLM

    from grpokit.memory import LiveTensors

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    cfg = model.config
    assert cfg.num_attention_heads > cfg.num_key_value_heads  # grouped-query heads
    g = torch.Generator().manual_seed(0)
    n, L = 3, 40
    ids = torch.randint(3, cfg.vocab_size, (n, L), generator=g)
    mask = torch.ones(n, L, dtype=torch.long)
    mask[1, :7] = 0  # left padding
    mask[2, :2] = 0
    with LiveTensors() as plain:
        want, want_g = _model_grads(model, ids, mask, shared=False)
    with LiveTensors() as shared:
        got, got_g = _model_grads(model, ids, mask, shared=True)
    assert torch.equal(got, want)
    assert want_g.keys() == got_g.keys()
    for k in want_g:
        assert torch.equal(got_g[k], want_g[k]), k

    def count(live, shape):
        return sum(s.shape == shape and s.dtype == torch.float32 for s in live.at_peak)

    layers, H, G = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    repeated = (n, G, H // G, L, cfg.hidden_size // H)  # repeat_kv's copies
    assert count(plain, (n, 1, L, L)) == layers and count(shared, (n, 1, L, L)) == 1
    assert count(plain, repeated) == 2 * layers and count(shared, repeated) == 0
    assert shared.peak_bytes < plain.peak_bytes


def test_checkpointed_model_keeps_transformers_attention(tiny_model_dir):
    """Checkpointed layers recompute their forward in the backward, outside the log-prob
    forward's attention routing: the forward must take the same path, or the recomputation
    saves other tensors and the backward fails."""
    from transformers import AutoModelForCausalLM

    from grpokit.forward import LogProbs
    from grpokit.models import enable_checkpointing
    from grpokit.rollout.base import Rollout

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    enable_checkpointing(model)
    model.train()
    g = torch.Generator().manual_seed(0)
    p_mask = torch.ones(3, 9, dtype=torch.long)
    p_mask[1, :4] = 0  # left padding: a boolean mask reaches the attention
    p_ids = torch.randint(3, 100, (3, 9), generator=g) * p_mask
    c_ids = torch.randint(3, 100, (3, 12), generator=g)
    ro = Rollout(
        p_ids, p_mask, c_ids, torch.ones_like(c_ids), torch.ones(3, dtype=torch.bool), [""] * 3
    )
    logp, _ = LogProbs(temperature=1.0, amp_dtype=None)(model, ro, slice(None))
    logp.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_no_grad_grouped_heads_without_repeated_keys(tiny_model_dir, monkeypatch):
    """A no-grad forward (reference, old log-probs) under the shared mask runs grouped-query
    attention on the key/value heads (query heads stacked as rows), not on keys and values
    repeated per query head: the same logits to float rounding, with the route counted."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(A, "FLOAT32_TOO", True)  # float32 takes it as the training route does
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    cfg = model.config
    assert cfg.num_attention_heads > cfg.num_key_value_heads
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (3, 33), generator=g)
    mask = torch.ones(3, 33, dtype=torch.long)
    mask[1, :5] = 0
    mask[2, :1] = 0
    taken = []
    real = A._grouped_no_grad
    monkeypatch.setattr(A, "_grouped_no_grad", lambda *a: taken.append(1) or real(*a))
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        with A.shared_mask_attention():
            got = model(input_ids=ids, attention_mask=mask).logits
    assert taken and len([t for t in taken if t]) == cfg.num_hidden_layers
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    attn = model.model.layers[0].self_attn
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    q = torch.zeros(1, H, 2, attn.head_dim)
    kv = torch.zeros(1, KV, 2, attn.head_dim)
    m = torch.zeros(1, 1, 2, 2)
    with torch.no_grad():
        assert real(attn, q, kv, kv, m, {}).shape == (1, 2, H, attn.head_dim)
    assert real(attn, q, kv, kv, m, {}) is None  # a gradient recorded: the training routes
    monkeypatch.setattr(A, "FLOAT32_TOO", False)
    with torch.no_grad():  # float32, where the training forward repeats keys and values too
        assert real(attn, q, kv, kv, m, {}) is None
        monkeypatch.setattr(A, "MAX_QUERIES", 1)  # and past the training route's length
        assert real(attn, q.bfloat16(), kv.bfloat16(), kv.bfloat16(), m.bfloat16(), {}) is None


def test_no_grad_grouped_attention_equals_the_training_route_s_bit_for_bit():
    """The no-grad route computes what the training forward's attention does (the same SDPA
    call on the same stacked layout), so old and reference log-probs equal the training
    forward's bit for bit under bf16 and the importance ratio starts at exactly 1. With keys
    and values repeated per head (the route before) SDPA splits the work otherwise and bf16
    outputs differed here by up to 1e-3 for this shape (0.16 in a bench batch's log-probs)."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    B, G, R, Lq, Lk, D = 16, 3, 3, 129, 184, 64  # the bench's shared-prompt forward
    q = torch.randn(B, G * R, Lq, D, generator=g).bfloat16()
    k = torch.randn(B, G, Lk, D, generator=g).bfloat16()
    v = torch.randn(B, G, Lk, D, generator=g).bfloat16()
    keep = torch.ones(B, 1, Lq, Lk, dtype=torch.bool).tril(Lk - Lq)
    keep[1, :, :, :20] = False  # a left-padded row
    additive = torch.zeros(keep.shape, dtype=torch.bfloat16).masked_fill_(~keep, float("-inf"))
    module = SimpleNamespace(num_key_value_groups=R)
    with torch.no_grad():
        got = A._grouped_no_grad(module, q, k, v, additive, {"scaling": D**-0.5})
        want = A.attention(q, k, v, keep, D**-0.5).transpose(1, 2)
    assert got is not None and torch.equal(got, want)


def test_training_route_makes_the_stacked_mask_once_a_forward(
    tmp_path, tiny_model_dir, monkeypatch
):
    """Every layer of one model call gets (and its backward keeps) the same stacked mask, not
    a copy each; a new call (another mask object) makes its own; the cache is emptied when
    the block ends."""
    from grpokit.speed.attention import training_attention
    from grpokit.testing import tiny_run_config
    from grpokit.trainer import GRPOTrainer
    from tests.trainer.test_forward_batches import _rollout

    monkeypatch.setattr(A, "FLOAT32_TOO", True)
    tr = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "run"))
    ro = _rollout(tr)
    seen = []
    orig = A.AttentionFunction.forward

    def recording(ctx, q, k, v, mask, scale):
        seen.append((mask.data_ptr(), tuple(mask.shape)))
        return orig(ctx, q, k, v, mask, scale)

    monkeypatch.setattr(A.AttentionFunction, "forward", staticmethod(recording))
    layers = tr.model.config.num_hidden_layers
    with training_attention(True):
        logp, _ = tr.logprobs(tr.model, ro, torch.tensor([4, 0, 5, 2]))
        assert A._TRAIN_MASK
    assert not A._TRAIN_MASK
    logp.sum().backward()
    assert len(seen) % layers == 0 and seen
    calls = [seen[i : i + layers] for i in range(0, len(seen), layers)]
    assert all(len(set(c)) == 1 for c in calls)  # one mask a model call


def _amx_here() -> bool:
    lib = kernels._load()
    return lib is not None and bool(lib.amx_linear_ready()) and kernels._onednn_allows_amx()


@pytest.mark.skipif(not _amx_here(), reason="no AMX here (or oneDNN capped below it)")
@pytest.mark.parametrize("D", [32, 64])
@pytest.mark.parametrize("shared_mask", [False, True])
def test_amx_attention_kernels_equal_the_fma_ones(D, shared_mask, monkeypatch):
    """The AMX forward and backward scores against the FMA kernels on the same inputs: the
    same products summed in another order, so equal but for a last bf16 bit here and there;
    partial 16-row blocks (M = 37), key counts off the 16/32 tiles (N = 29, 70), a row that
    sees no key, left padding, one mask for all rows or one a row."""
    g = torch.Generator().manual_seed(D)
    for B, G, M, N in ((3, 2, 37, 29), (2, 3, 21, 70)):
        q, k, v, o, go = (torch.randn(B, G, n, D, generator=g).bfloat16() for n in (M, N, N, M, M))
        mask = A.causal_mask(M, N, "cpu").expand(1 if shared_mask else B, 1, M, N).clone()
        if not shared_mask:
            mask[1, :, :, :5] = False  # left padding of one row
            mask[0, :, 3, :] = False  # a query that sees nothing
        res = {}
        for amx in (False, True):
            monkeypatch.setattr(kernels, "USE_AMX_ATTENTION", amx)
            res[amx] = (
                kernels.attention_forward(q, k, v, mask, 0.125),
                *kernels.attention_grad_scores(q, k, v, o, go, mask, 0.125),
            )
        for fma, amx in zip(res[False], res[True]):
            torch.testing.assert_close(amx, fma, rtol=1.6e-2, atol=2e-3)
            assert (amx == fma).float().mean() > 0.99
        if not shared_mask:
            assert not res[True][0][0, :, 3].any()  # no key: 0, as the FMA forward
