"""The gated MLP that keeps fewer activations: the same numbers as transformers' own forward
and backward, bit for bit, and one (tokens, intermediate) tensor a layer fewer kept."""

import contextlib

import pytest
import torch
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from grpokit.speed import kernels, layers
from grpokit.speed.layers import (
    SharedCastLinears,
    gated_silu_mlps,
    keep_mask,
    lean_layers,
    qkv_attentions,
    recomputed_when_saved,
    rms_norms,
)

SHAPE = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _llama(lora: bool = False):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    return model


def _run(model, ids, lean: bool, amp: bool):
    model.zero_grad(set_to_none=True)
    saved = {}  # distinct activations kept for the backward: tensors with a token dimension
    params = {p.data_ptr() for p in model.parameters()}
    tokens = {ids.shape[1], ids.numel()}  # (no weight here has such a dimension)

    def pack(t):
        if t.data_ptr() not in params and tokens & set(t.shape):
            saved[(t.data_ptr(), t.shape, t.dtype)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with lean_layers(model, enabled=lean), torch.autocast("cpu", torch.bfloat16, enabled=amp):
            out = model(input_ids=ids).logits
    loss = (out.float() ** 2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, sum(saved.values())


@pytest.mark.parametrize("rms_kernel", [False, True], ids=["torch-norm", "c-norm"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_same_values_and_gradients_with_less_kept(amp, lora, rms_kernel, monkeypatch):
    """Bit for bit with torch's RMSNorm and SiLU operations (the C rotary pass is bit for bit
    either way); with the C RMSNorm (its sums in another order) and SiLU (its exp within 2
    ulp of torch's) to float32 rounding."""
    if rms_kernel and not kernels.rms_norm_applies(torch.zeros(2), torch.zeros(2)):
        pytest.skip("no C kernels here")
    monkeypatch.setattr(layers, "USE_RMS_KERNEL", rms_kernel)
    monkeypatch.setattr(layers, "USE_SILU_KERNEL", rms_kernel)
    model = _llama(lora)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    out0, g0, kept0 = _run(model, ids, lean=False, amp=amp)
    out1, g1, kept1 = _run(model, ids, lean=True, amp=amp)
    assert g0.keys() == g1.keys() and len(g0) > 0
    if lora and amp:  # B's product adds the base output and the scale before one bf16 rounding
        _closer_to_float32(model, ids, (out0, g0), (out1, g1))
    elif rms_kernel:  # float32 sums in another order; under autocast a bf16 unit at most
        tol = dict(rtol=1e-2, atol=1e-2) if amp else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out1, out0, **tol)
        for n in g0:
            torch.testing.assert_close(g1[n], g0[n], **tol, msg=n)
    else:  # bit-identical
        assert torch.equal(out0, out1)
        for n in g0:
            assert torch.equal(g0[n], g1[n]), n
    # neither silu(gate) nor the product (down's input) is kept: two (3 x 11, 80) tensors a
    # layer in the activations' dtype (with LoRA under autocast PEFT keeps, in the product's
    # place, the bf16 cast its adapter makes of its float32 cast of the product; the lean
    # layer neither, the product made again in the backward serving the adapter too)
    T, L, h = 3 * 11, SHAPE["num_hidden_layers"], SHAPE["hidden_size"]
    mlp = T * 80 * (2 if amp else 4) * 2
    # nor the normalised input of each RMSNorm (two a layer and the final one), in float32,
    # which the product with the norm's weight keeps only when that weight is trained
    norms = (2 * L + 1) * T * h * 4 * (not lora)
    # under autocast one bf16 cast of the normed input for q/k/v and one for gate/up, not 3 + 2
    # (with LoRA the base layers keep none, their weights frozen, and the adapters' A one each)
    casts = 3 * T * h * 2 * amp
    assert kept0 - kept1 == L * (mlp + casts) + norms
    # the model is itself again after the block
    projections = [
        getattr(a, n) for a in qkv_attentions(model) for n in ("q_proj", "k_proj", "v_proj")
    ]
    swapped = gated_silu_mlps(model) + rms_norms(model) + projections
    assert all("forward" not in vars(m) for m in swapped)
    assert len(projections) == 3 * L  # LoRA layers too (under autocast: one cast)


@pytest.mark.skipif(not kernels.available(), reason="no C kernels here")
def test_weight_grads_added_by_the_layers_same_as_autograd(monkeypatch):
    """Two micro-batches' backwards into kept float32 gradient buffers (optim.KeptGradients),
    under bf16 autocast with the lean layers: inside weight_grads_into_grad (the trainer's
    backward) the seven linear layers' weights of each Llama layer get their gradients added
    by the layers themselves (two additions each), and every gradient is the same as
    autograd's cast-and-add outside the block, bit for bit."""
    added = []
    into_float = kernels.into_float

    def counted(src, dst, transposed):
        if dst is not None:
            added.append(tuple(dst.shape))
        return into_float(src, dst, transposed)

    monkeypatch.setattr(kernels, "into_float", counted)
    model = _llama()
    ids = torch.randint(0, 97, (2, 3, 11), generator=torch.Generator().manual_seed(2))
    grads = {}
    for own in (False, True):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        for mb in ids:
            with lean_layers(model), torch.autocast("cpu", torch.bfloat16):
                out = model(input_ids=mb).logits
            block = layers.weight_grads_into_grad() if own else contextlib.nullcontext()
            with block:
                (out.float() ** 2).mean().backward()
        grads[own] = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert len(added) == 2 * 7 * SHAPE["num_hidden_layers"]
    for n, g in grads[False].items():
        assert torch.equal(g, grads[True][n]), n
    assert any(g.abs().sum() > 0 for g in grads[True].values())


def _closer_to_float32(model, ids, peft, lean):
    """Under bf16 autocast PEFT rounds B's output, its scaled copy and the sum with the base
    output to bf16 one after the other; the lean layer's ``addmm`` rounds once: its logits and
    gradients are at least as close to the float32 ones as PEFT's, and close to PEFT's."""
    ref, gref, _ = _run(model, ids, lean=False, amp=False)

    def err(out, g):
        grad = sum((g[n] - gref[n]).double().norm() ** 2 for n in gref) ** 0.5
        return (out.float() - ref).abs().max().item(), grad.item()

    (o_peft, g_peft), (o_lean, g_lean) = err(*peft), err(*lean)
    assert o_lean <= o_peft and g_lean <= g_peft, (o_peft, o_lean, g_peft, g_lean)
    torch.testing.assert_close(lean[0].float(), peft[0].float(), rtol=0, atol=2 * o_peft)


def test_shared_cast_same_values_and_gradients_one_cast_kept():
    """Three bias-free layers over one float32 input under bf16 autocast, each cast by autocast
    and through SharedCastLinears: the same outputs and gradients bit for bit (the input's
    too: the same roundings summed in the same order); one bf16 copy of the input kept
    instead of three."""
    g = torch.Generator().manual_seed(0)
    sizes = (48, 16, 16)
    ws = [torch.nn.Parameter(torch.randn(n, 40, generator=g) * 0.1) for n in sizes]
    x0 = torch.randn(2, 33, 40, generator=g)
    ups = [torch.randn(2, 33, n, generator=g).bfloat16() for n in sizes]

    def run(shared: bool):
        kept = {}

        def pack(t):
            kept[t.data_ptr()] = t.numel() * t.element_size() * (t.numel() == x0.numel())
            return t

        x = x0.clone().requires_grad_()
        h = x * 1.0  # not a leaf (autocast caches a leaf's cast), as a normed input
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", torch.bfloat16):
                outs = (
                    SharedCastLinears.apply(
                        h, torch.bfloat16, (None,) * 3, *ws, *(w.bfloat16() for w in ws)
                    )
                    if shared
                    else [torch.nn.functional.linear(h, w) for w in ws]
                )
        torch.autograd.backward(outs, ups)
        grads = [w.grad.clone() for w in ws] + [x.grad.clone()]
        for w in ws:
            w.grad = None
        return [o.detach() for o in outs], grads, sum(kept.values())

    (o0, g0, k0), (o1, g1, k1) = run(False), run(True)
    assert all(a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b) for a, b in zip(o0, o1))
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(g0, g1))
    assert k0 == 3 * k1 == 3 * x0.numel() * 2


def test_qkv_hand_on_only_for_the_same_input():
    """In the block q_proj computes q, k and v; k_proj and v_proj return theirs for the same
    input and compute their own for another (the layers' own products either way)."""
    model = _llama()
    attn = qkv_attentions(model)[0]
    x, y = torch.randn(2, 5, 48), torch.randn(2, 5, 48)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        want = [attn.k_proj(y), attn.v_proj(x)]
    with lean_layers(model), torch.autocast("cpu", torch.bfloat16):
        attn.q_proj(x)
        got = [attn.k_proj(y), attn.v_proj(x)]  # k: another input, its own product
        attn.q_proj(x)
        handed = [attn.k_proj(x), attn.v_proj(x)]
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert handed[1].grad_fn is not None and "SharedCastLinears" in type(handed[1].grad_fn).__name__
    assert torch.equal(handed[1], got[1])


def test_which_mlps_it_takes():
    assert len(gated_silu_mlps(_llama())) == 3
    assert len(gated_silu_mlps(_llama(lora=True))) == 3
    qwen = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    assert len(gated_silu_mlps(qwen)) == 3  # the same forward, another class
    gelu = LlamaForCausalLM(LlamaConfig(**SHAPE, hidden_act="gelu"))
    assert gated_silu_mlps(gelu) == []  # another activation
    gemma = GemmaForCausalLM(GemmaConfig(**SHAPE, head_dim=8))
    assert gated_silu_mlps(gemma) == []  # gelu (tanh)
    assert len(rms_norms(_llama())) == len(rms_norms(qwen)) == 2 * 3 + 1
    assert rms_norms(gemma) == []  # its norm scales by 1 + weight
    with lean_layers(_llama(), enabled=False) as n:
        assert n == 0


def _lora_dropout_model(p=0.3):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(
        LlamaForCausalLM(LlamaConfig(**SHAPE)),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=p, target_modules="all-linear"),
    )
    with torch.no_grad():
        for n, q in model.named_parameters():
            if "lora_B" in n:
                q.normal_(0, 0.1)
    return model.train()


def _dropout_by_keep_mask(self, x):
    """``nn.Dropout`` with :func:`keep_mask`'s draws and plain autograd ops: PEFT's LoRA path
    with the lean layer's masks, to compare the two on the same draws."""
    if not self.training or self.p == 0:
        return x
    keep = keep_mask(x.shape, self.p)
    return x * torch.where(keep.bool(), x.new_ones(()).div_(1 - self.p), 0.0)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
def test_lora_dropout_same_values_on_the_same_masks_and_keeps_less(amp, monkeypatch):
    """PEFT's LoRA dropout keeps its noise and output per layer; the lean layer keeps the
    input and a one-byte mask: on the same masks, the same outputs and gradients up to float
    rounding (its scales sit inside the products) and the same random stream after, 2 x (tokens x in_features) floats a layer
    fewer, less the inputs it keeps (one per distinct input: q/k/v share one, gate/up another)."""
    model = _lora_dropout_model()
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    with monkeypatch.context() as m:
        m.setattr(torch.nn.Dropout, "forward", _dropout_by_keep_mask)
        torch.manual_seed(5)
        out0, g0, kept0 = _run(model, ids, lean=False, amp=amp)
    after0 = torch.get_rng_state()
    torch.manual_seed(5)
    out1, g1, kept1 = _run(model, ids, lean=True, amp=amp)
    assert torch.equal(torch.get_rng_state(), after0)  # the same draws, the same stream after
    # the scales are applied inside the products: equal up to float rounding
    torch.testing.assert_close(out1, out0, rtol=1e-5, atol=1e-5 if not amp else 2e-2)
    assert g0.keys() == g1.keys() and all("lora_" in n for n in g0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-6 if not amp else 1e-3)
    torch.manual_seed(5)
    with lean_layers(model):  # dropout is really on: another draw, other logits
        out2 = model(input_ids=ids).logits
        assert not torch.equal(out2, model(input_ids=ids).logits)
    # what the dropout costs: PEFT keeps its noise and dropped input in every adapted layer;
    # the lean layer keeps the layer's input, which the adapter keeps anyway without dropout,
    # and a one-byte mask
    L = SHAPE["num_hidden_layers"]
    no_drop = _lora_dropout_model(p=0.0)
    _, _, peft0 = _run(no_drop, ids, lean=False, amp=amp)
    _, _, lean0 = _run(no_drop, ids, lean=True, amp=amp)
    assert kept0 - peft0 > 3 * 11 * SHAPE["hidden_size"] * 4 * L
    T, h, ffn = 3 * 11, SHAPE["hidden_size"], SHAPE["intermediate_size"]
    # one byte an input entry of q, k, v, o, gate, up, down
    masks = L * T * (6 * h + ffn)
    # with or without dropout the lean layers keep one input for q/k/v and one for gate/up
    # (under autocast one bf16 cast of each, shared with the base layers: SharedCastLinears)
    assert kept1 - lean0 == masks < (kept0 - peft0) / (2 if amp else 3)
    assert len(gated_silu_mlps(model)) == L


@pytest.mark.parametrize("targets", ["all-linear", "q_v"])
@pytest.mark.parametrize("p", [0.3, 0.0])
def test_lora_layers_share_one_cast_same_numbers(p, targets, monkeypatch):
    """Under bf16 autocast the LoRA layers run through SharedCastLinears (q/k/v from one
    cast of their input, gate/up from another; o with its bf16 input; down through
    SwiGLUDown, its input remade in SiLU's backward pass), each adapter's dropout mask
    applied to that cast: the same masks drawn in the same order, and the same outputs and
    gradients as DropoutLinear's path, bit for bit, with fewer kept (no float32 input for the
    adapters); with adapters on q and v only, k's plain layer joins them."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=p,
        target_modules="all-linear" if targets == "all-linear" else ["q_proj", "v_proj"],
    )
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**SHAPE)), cfg).train()
    with torch.no_grad():
        for n, q in model.named_parameters():
            if "lora_B" in n:
                q.normal_(0, 0.1)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    shared = []
    real = layers._adapters_forward
    monkeypatch.setattr(
        layers,
        "_adapters_forward",
        lambda xc, outs, ad, *casts: (
            shared.append(sum(a is not None for a in ad)) or real(xc, outs, ad, *casts)
        ),
    )
    downs = []  # SwiGLUDown's adapters: the down projection's, remade in SiLU's backward
    fused = layers.SwiGLUDown.apply
    monkeypatch.setattr(
        layers.SwiGLUDown, "apply", lambda *a: downs.append(a[2]) or fused(*a), raising=False
    )
    runs = {}
    for on in (False, True):
        monkeypatch.setattr(layers, "SHARED_LORA_CASTS", on)
        torch.manual_seed(5)
        runs[on] = (*_run(model, ids, lean=True, amp=True), torch.get_rng_state())
    (o0, g0, k0, rng0), (o1, g1, k1, rng1) = runs[False], runs[True]
    L = SHAPE["num_hidden_layers"]
    # adapters through SharedCastLinears a layer: q/k/v, o, gate/up, down (or q and v)
    adapted = [n for n in shared if n]  # (frozen plain layers pass through it too)
    assert adapted == ([3, 1, 2, 1] * L if targets == "all-linear" else [2] * L)
    if targets == "all-linear":
        assert downs == [(p, 2.0 / (1 - p))] * L  # scaling alpha / r, the dropout's 1 / (1 - p)
    else:  # a plain frozen down projection: SwiGLUDown without an adapter, both runs
        assert downs == [None] * (2 * L)
    assert torch.equal(rng0, rng1) and torch.equal(o0, o1)
    assert g0.keys() == g1.keys() and len(g0) == 2 * L * (7 if targets == "all-linear" else 2)
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    assert any(g.abs().sum() > 0 for g in g1.values())
    T, h = 3 * 11, SHAPE["hidden_size"]
    if targets == "all-linear":  # a float32 input for q/k/v and for gate/up, a bf16 cast kept
        # (with dropout: DropoutLinear's input; without: each adapter's own bf16 cast, five,
        # and down's adapter's cast of the product, which the lean MLP makes again)
        fewer = 2 * T * h * (4 - 2) if p else 2 * T * h * (5 - 2) + T * 80 * 2
    else:  # q and v's adapters cast and keep the normed input (or keep it with dropout)
        fewer = T * h * (4 - 2) if p else T * h * (2 * 2 - 2)
    assert k0 - k1 == L * fewer


def test_no_lean_lora_without_dropout_or_with_two_adapters():
    from grpokit.speed.layers import lean_loras

    model = _lora_dropout_model(p=0.0)
    assert len(lean_loras(model)) == 3 * 7  # every adapted layer: the plain path is also PEFT's
    from peft import LoraConfig

    model.add_adapter("second", LoraConfig(r=2, target_modules=["q_proj"]))
    model.base_model.set_adapter(["default", "second"])
    assert len(lean_loras(model)) == 3 * 6  # q_proj runs two adapters: PEFT's own forward


def test_a_merged_adapter_keeps_peft_s_forward():
    from grpokit.speed.layers import lean_loras

    model = _lora_dropout_model()
    assert len(lean_loras(model)) == 3 * 7
    model.merge_adapter()  # PEFT's forward now runs the base layers (the merged weights) only
    assert lean_loras(model) == []


def test_keep_mask_rate_scale_and_reproducibility(monkeypatch):
    """Entries kept with probability 1 - p (the mean of 3M draws within 5 standard errors),
    neighbours uncorrelated, the same mask for the same seed whatever the threads and from
    the C kernel or numpy, one draw of torch's generator a mask, and the kept value torch's
    own dropout gives."""
    n = 1 << 20
    for p in (0.05, 0.3, 0.9):
        torch.manual_seed(0)
        keep = keep_mask((3, n), p)
        assert keep.dtype == torch.uint8 and keep.shape == (3, n)
        x = keep.double()
        rate, se = x.mean().item(), ((p * (1 - p)) / keep.numel()) ** 0.5
        assert abs(rate - (1 - p)) < 5 * se, (p, rate)
        assert not torch.equal(keep[0], keep[1])
        # the two halves of one hash and the next entry: no correlation beyond noise
        for lag in (1, 2, 3):
            a, b = x.flatten()[:-lag] - rate, x.flatten()[lag:] - rate
            corr = (a * b).mean().item() / (p * (1 - p))
            assert abs(corr) < 5 / keep.numel() ** 0.5, (p, lag, corr)
    torch.manual_seed(3)
    a = keep_mask((5, 7, 149_797), 0.2)  # an odd count: the last pair's high half alone
    after = torch.get_rng_state()
    torch.manual_seed(3)
    torch.randint(0, 2**63 - 1, (), dtype=torch.int64)
    assert torch.equal(torch.get_rng_state(), after)  # exactly one draw of torch's generator
    torch.set_num_threads(1)
    try:
        torch.manual_seed(3)
        assert torch.equal(keep_mask(a.shape, 0.2), a)  # one thread, the same mask
    finally:
        torch.set_num_threads(2)
    with monkeypatch.context() as m:  # without the library: numpy's the same numbers
        m.setattr(kernels, "dropout_keep", lambda *args: None)
        torch.manual_seed(3)
        assert torch.equal(keep_mask(a.shape, 0.2), a)
    assert keep_mask((4, 5), 0.0).all() and not keep_mask((4, 5), 1.0 - 2**-33).any()
    # torch's dropout value for a kept entry: 1 / (1 - p) rounded in the input's dtype
    p = 0.3
    ones = torch.ones(4096)
    dropped = torch.nn.functional.dropout(ones, p, training=True)
    assert set(dropped.unique().tolist()) == {0.0, ones.new_ones(()).div_(1 - p).item()}


def test_recomputed_when_saved_makes_views_again_and_keeps_outer_hooks():
    """A tensor saved inside the block (here through a reshape, as a linear layer saves a 3-D
    input) is made again by the function in the backward, with its view's shape; other saved
    tensors go through the hooks set outside; gradients are those of plain autograd."""
    torch.manual_seed(0)
    a = torch.randn(4, 6, 8, requires_grad=True)
    w = torch.randn(5, 8, requires_grad=True)

    def run(lean: bool):
        a.grad = w.grad = None
        calls = {"outer": 0, "made": 0}

        def outer_pack(t):
            calls["outer"] += 1
            return t.detach()

        def again():
            calls["made"] += 1
            return torch.tanh(a.detach())

        with torch.autograd.graph.saved_tensors_hooks(outer_pack, lambda t: t):
            t = torch.tanh(a)
            with recomputed_when_saved(t, again) if lean else contextlib.nullcontext():
                out = torch.nn.functional.linear(t, w)
        (out**2).sum().backward()
        return a.grad.clone(), w.grad.clone(), calls

    ga0, gw0, calls0 = run(False)
    ga1, gw1, calls1 = run(True)
    assert torch.equal(ga0, ga1) and torch.equal(gw0, gw1)
    assert calls1["made"] == 1 and calls0["made"] == 0
    assert calls1["outer"] == calls0["outer"] - 1  # the weight still through the outer hook


@pytest.mark.parametrize("exact", [True, False], ids=["bf16-values", "float32-values"])
def test_lowered_reference_shares_an_exact_tied_embedding(exact):
    """A frozen copy lowered to bf16 (the reference): a tied float32 embedding whose values
    are all bf16 values (a bf16 checkpoint) shares the bf16 head weight and its lookups give
    the same float32 activations (the same logits bit for bit); one with other values keeps
    its own float32 table."""
    import copy

    from grpokit.speed.weights import lower_frozen_linears

    model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True)).eval()
    if exact:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.bfloat16().float())
    low = copy.deepcopy(model)
    lower_frozen_linears(low, torch.bfloat16)
    emb, head = low.get_input_embeddings(), low.get_output_embeddings()
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        want, got = model(input_ids=ids).logits, low(input_ids=ids).logits
        acts = emb(ids)
    assert torch.equal(want, got)
    assert head.weight.dtype == torch.bfloat16 and acts.dtype == torch.float32
    assert (emb.weight is head.weight) == exact
    assert emb.weight.dtype == (torch.bfloat16 if exact else torch.float32)


def test_frozen_linear_casts_once_and_again_after_a_change():
    """A frozen float32 layer under bf16 autocast: the same output as autocast's own cast,
    bit for bit; its cast made once for many calls, made again when the weight changes in
    place; a trained layer and a forward without autocast are left to torch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.Linear(40, 8))
    model[0].requires_grad_(False)
    x = torch.randn(5, 48)
    assert layers.frozen_linears(model) == [model[0]]
    with torch.autocast("cpu", torch.bfloat16):
        want = model(x)
    with lean_layers(model), torch.autocast("cpu", torch.bfloat16):
        got = model(x)
        kept = model[0].weight.__dict__["_grpokit_cast"][1]
        assert torch.equal(got, want) and got.dtype == want.dtype == torch.bfloat16
        model(x)
        assert model[0].weight.__dict__["_grpokit_cast"][1] is kept  # not cast again
        with torch.no_grad():
            model[0].weight.mul_(2)
        again = model(x)
        assert model[0].weight.__dict__["_grpokit_cast"][1] is not kept
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(again, model(x))
    with lean_layers(model):
        assert model(x).dtype == torch.float32  # no autocast: the float32 product
    assert "forward" not in model[0].__dict__  # the layer is itself again after the block


def test_frozen_layers_reading_one_input_share_its_cast_without_grad(monkeypatch):
    """Frozen layers (float32, or lowered to bf16 as the reference is) reading one input under
    bf16 autocast without grad: one cast of the input for all of them (q/k/v, gate/up), the
    same outputs as autocast's bit for bit; a changed input is cast again; with grad each
    layer casts its own (their float32 gradients are summed)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Casts(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].shape == (5, 48):
                Casts.n += 1
            return func(*args, **(kwargs or {}))

    class Two(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.a, self.b = torch.nn.Linear(48, 40), torch.nn.Linear(48, 8, bias=False)
            self.to(dtype).requires_grad_(False)

        def forward(self, x):
            return self.a(x).sum() + self.b(x).sum()

    torch.manual_seed(0)
    x = torch.randn(5, 48)
    for dtype in (torch.bfloat16, torch.float32):
        model = Two(dtype)
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            want = model(x)
        for shared, casts in ((True, 1), (False, 2)):
            monkeypatch.setattr(layers, "SHARED_INPUT_CASTS", shared)
            with lean_layers(model), torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
                model(x.clone())  # float32 weights: their casts made here, kept on them
            with lean_layers(model), torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
                Casts.n = 0
                with Casts():
                    got = model(x)
                assert torch.equal(got, want) and Casts.n == casts
                x.mul_(1.0)  # changed in place (its version): cast again
                with Casts():
                    model(x)
                assert Casts.n == 2 * casts
        monkeypatch.setattr(layers, "SHARED_INPUT_CASTS", True)
        with lean_layers(model), torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
            assert torch.equal(model(x.clone()), want)  # no version counter: cast each time
        xg = x.clone().requires_grad_()
        with lean_layers(model), torch.autocast("cpu", torch.bfloat16):
            Casts.n = 0
            with Casts():
                model(xg)
            assert Casts.n == 2
        assert not layers._INPUT_CAST


def test_step_casts_one_cast_a_weight_for_all_micro_batches(monkeypatch):
    """Two micro-batches, each its own lean_layers block under bf16 autocast, accumulating
    gradients: inside ``step_casts`` the second block reuses the first block's cast of every
    trained weight (half the casts), the gradients bit for bit those of a cast a block, and
    nothing is kept after the block."""
    made = []
    real = layers._cast

    def spy(w, dtype):
        c = real(w, dtype)
        made.append(c)
        return c

    monkeypatch.setattr(layers, "_cast", spy)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, SHAPE["vocab_size"], (2, 11), generator=g) for _ in range(2)]

    def step(shared: bool):
        model = _llama()
        made.clear()
        with layers.step_casts(shared):
            for ids in batches:
                with lean_layers(model), torch.autocast("cpu", torch.bfloat16):
                    out = model(input_ids=ids).logits
                (out.float() ** 2).mean().backward()
        assert not layers._STEP_CASTS
        casts = len({id(c) for c in made})
        return casts, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    (casts0, g0), (casts1, g1) = step(False), step(True)
    per_block = SHAPE["num_hidden_layers"] * 7  # q, k, v, o, gate, up, down
    assert casts0 == 2 * per_block and casts1 == per_block
    assert g0.keys() == g1.keys() and all(torch.equal(g0[n], g1[n]) for n in g0)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
def test_adapters_off_computes_what_peft_s_disable_adapter_computes(amp, monkeypatch):
    """The reference forward of a LoRA policy (train mode, dropout on, no grad, lean_layers):
    with adapters_off's own switch the logits are PEFT's disable_adapter() logits bit for bit,
    not the adapted ones; after the block the adapters are on again and nothing of the swap
    is left; a model with anything but plain LoRA layers (modules_to_save) keeps PEFT's."""
    from peft import LoraConfig, get_peft_model

    def lora(**kw):
        torch.manual_seed(0)
        m = get_peft_model(
            LlamaForCausalLM(LlamaConfig(**SHAPE)),
            LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.2, **kw),
        )
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        return m.train()

    ids = torch.randint(0, SHAPE["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))

    def logits(model, switch):
        with torch.no_grad(), switch(model), lean_layers(model, grad=False):
            with torch.autocast("cpu", torch.bfloat16, enabled=amp):
                return model(input_ids=ids).logits

    calls = []
    real = type(lora()).disable_adapter

    def counted(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(type(lora()), "disable_adapter", counted)
    model = lora()
    want = logits(model, lambda m: m.disable_adapter())
    calls.clear()
    got = logits(model, layers.adapters_off)
    assert not calls and torch.equal(got, want)
    model.eval()
    with torch.no_grad():
        on = model(input_ids=ids).logits
    assert not any("forward" in m.__dict__ for m in model.modules())
    with torch.no_grad(), layers.adapters_off(model):
        off = model(input_ids=ids).logits
    assert not torch.equal(off, on)  # the adapters did change the logits
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, on)  # and are on again
    saving = lora(modules_to_save=["lm_head"])
    assert layers._plain_lora_layers(saving) is None
    want = logits(saving, lambda m: m.disable_adapter())
    calls.clear()
    assert torch.equal(logits(saving, layers.adapters_off), want) and calls == [1]
    monkeypatch.setattr(layers, "OWN_ADAPTER_SWITCH", False)
    calls.clear()
    logits(model, layers.adapters_off)
    assert calls == [1]


def test_weight_grads_transpose_the_narrower_operand_first(monkeypatch):
    """weight_grads gives each g^T x in the weight's dtype; where the transposer applies (on
    AMX; forced here) a gradient with fewer columns than the input (a down projection, k/v)
    is copied transposed first, and for the others the input is, once for all of them, and
    the product is the gradient's transpose: the same dot products, close to float64 as the
    plain product is. Off (TRANSPOSED_WEIGHT_GRAD False) nothing is copied: the products of
    the transposed views, widened to float32, bit for bit."""
    calls = []

    def transposed(a):
        calls.append(tuple(a.shape))
        return kernels.transposed(a) if kernels.available() else a.t().contiguous()

    monkeypatch.setattr(layers, "transposer", lambda: transposed)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 80, generator=g).bfloat16()
    gs = [torch.randn(300, n, generator=g).bfloat16() for n in (24, 80, 120)]
    ws = [torch.zeros(n, 80, requires_grad=True) for n in (24, 80, 120)]
    got = layers.weight_grads(gs, x, ws)
    assert calls == [(300, 24), (300, 80)]  # the narrow gradient, then x once for two
    for gw, gy, w in zip(got, gs, ws):
        assert gw.shape == w.shape and gw.dtype == torch.float32 and gw.is_contiguous()
        exact = gy.double().t() @ x.double()
        torch.testing.assert_close(gw.double(), exact, rtol=2e-2, atol=5e-2)
    half = [torch.zeros(24, 80, dtype=torch.bfloat16, requires_grad=True)]
    (gh,) = layers.weight_grads(gs[:1], x, half)  # a bf16 weight: a bf16 gradient
    assert gh.dtype == torch.bfloat16 and torch.equal(gh, got[0].bfloat16())
    monkeypatch.undo()
    monkeypatch.setattr(layers, "TRANSPOSED_WEIGHT_GRAD", False)
    assert layers.transposer() is None
    for gw, gy in zip(layers.weight_grads(gs, x, ws), gs):
        assert torch.equal(gw, (gy.t() @ x).float())


@pytest.mark.skipif(not kernels.available(), reason="no C kernels here")
def test_weight_grads_added_into_grad_inside_the_block():
    """Inside weight_grads_into_grad a weight with a float32 .grad of its shape and no hooks
    gets its gradient added into .grad here (bit for bit the cast and add autograd makes,
    the transposed products too), None handed back and .grad's version counter moved (the
    kept buffers' "reached"); outside the block, without .grad, or with a hook on the weight,
    the gradient comes back as ever and .grad is untouched."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 80, generator=g).bfloat16()
    gs = [torch.randn(300, n, generator=g).bfloat16() for n in (24, 80, 120)]
    ws = [torch.zeros(n, 80, requires_grad=True) for n in (24, 80, 120)]
    made = layers.weight_grads(gs, x, ws)  # outside the block: handed back
    for w in ws:
        w.grad = torch.randn(w.shape, generator=g)
    before = [w.grad.clone() for w in ws]
    versions = [w.grad._version for w in ws]
    with layers.weight_grads_into_grad():
        assert layers.weight_grads(gs, x, ws) == [None, None, None]
    for w, b, m, v in zip(ws, before, made, versions):
        assert torch.equal(w.grad, b + m) and w.grad._version > v
    ws[1].register_post_accumulate_grad_hook(lambda p: None)
    ws[2].grad = None
    kept = ws[0].grad.clone()
    with layers.weight_grads_into_grad():
        out = layers.weight_grads(gs, x, ws)
    assert out[0] is None and torch.equal(ws[0].grad, kept + made[0])
    assert torch.equal(out[1], made[1]) and torch.equal(out[2], made[2]) and ws[2].grad is None
    assert torch.equal(layers.weight_grads(gs[:1], x, ws[:1])[0], made[0])  # block closed


@pytest.mark.parametrize("frozen_mlp", [False, True], ids=["trained", "frozen-down"])
def test_swiglu_down_same_numbers_as_silu_mul_then_down(frozen_mlp, monkeypatch):
    """Under bf16 autocast with the C kernels, the fused SwiGLU + down projection gives the
    logits and every gradient of SiLUMul followed by the down projection bit for bit, keeps
    the same tensors, and is what the MLPs run (a frozen down weight: no weight gradient)."""
    if not kernels.silu_mul_applies(torch.zeros(2), torch.zeros(2)):
        pytest.skip("no C kernels here")
    model = _llama()
    if frozen_mlp:
        for m in gated_silu_mlps(model):
            m.down_proj.weight.requires_grad_(False)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(layers, "FUSED_SWIGLU_DOWN", False)
    out0, g0, kept0 = _run(model, ids, lean=True, amp=True)
    monkeypatch.setattr(layers, "FUSED_SWIGLU_DOWN", True)
    seen = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda m, a, out: seen.append(type(out.grad_fn).__name__) if m in mlps else None
    )
    mlps = set(gated_silu_mlps(model))
    try:
        out1, g1, kept1 = _run(model, ids, lean=True, amp=True)
    finally:
        hook.remove()
    assert seen == ["SwiGLUDownBackward"] * SHAPE["num_hidden_layers"]
    assert torch.equal(out0, out1) and kept0 == kept1
    assert g0.keys() == g1.keys() and len(g0) > 0
    assert (
        not any("down_proj" in n for n in g1) if frozen_mlp else any("down_proj" in n for n in g1)
    )
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    # no gradient recorded: the plain C forward (nothing to fuse)
    with torch.no_grad(), lean_layers(model), torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(model(input_ids=ids).logits, out1)
