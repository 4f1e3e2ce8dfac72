"""The fused decode step (grpokit/speed/fastdecode.py) computes what transformers' forward
computes: next-token logits equal to the model's own forward over the same cache (fp32
tight, bf16 within bf16 rounding), for Llama with grouped-query attention, Qwen2 (q/k/v
biases) and Mistral; greedy tokens from the sampler equal with and without it; and models
it does not reproduce are left to the plain path."""

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    StaticCache,
)

from grpokit.rollout.kvcache import cache_kwarg
from grpokit.rollout.sampler import sample
from grpokit.speed.fastdecode import FastDecoder, why_unsupported

SHAPE = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _model(kind: str, dtype=torch.float32):
    torch.manual_seed(0)
    if kind == "llama":
        m = LlamaForCausalLM(LlamaConfig(**SHAPE, rope_scaling=None, tie_word_embeddings=True))
    elif kind == "llama3-rope":
        rope = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 10000.0,
        }
        m = LlamaForCausalLM(LlamaConfig(**SHAPE, rope_parameters=rope))
    elif kind == "qwen2":
        m = Qwen2ForCausalLM(Qwen2Config(**SHAPE, use_sliding_window=False))
    elif kind == "mistral":
        m = MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=None))
    else:
        raise ValueError(kind)
    with torch.no_grad():  # random init is near-uniform; make logits differ between tokens
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.to(dtype).eval()


def _prefilled(model, B=3, P=7, extra=5, seed=0):
    """A left-padded batch prefilled into a StaticCache the way the sampler does it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (B, P), generator=g)
    mask = torch.ones(B, P + extra, dtype=torch.long)
    mask[1, :3] = 0  # left padding on two rows
    mask[2, :1] = 0
    mask[:, P:] = 0
    pos = (mask[:, :P].cumsum(-1) - 1).clamp(min=0)
    cache = StaticCache(config=model.config, max_cache_len=P + extra)
    with torch.no_grad():
        model(
            input_ids=ids,
            attention_mask=mask[:, :P],
            position_ids=pos,
            **cache_kwarg(cache),
            cache_position=torch.arange(P),
            use_cache=True,
        )
    return ids, mask, pos[:, -1] + 1, cache


def _layers(cache):
    return [ly.keys for ly in cache.layers], [ly.values for ly in cache.layers]


def _three_steps(model, dtype, check) -> FastDecoder:
    """Three decode steps of ``FastDecoder`` against the model's own forward over the same
    prefilled cache (the cache the fast path writes feeds its next step); ``check(got, ref,
    keys, ref_keys, S)`` after each. Returns the decoder."""
    ids, mask, nxt_pos, cache = _prefilled(model)
    _, _, _, cache_ref = _prefilled(model)
    P = ids.shape[1]
    fast = FastDecoder.build(model, P + 5)
    assert fast is not None
    fast.rotary_tables(P + 5, dtype)
    tok = torch.tensor([5, 17, 42])
    for t in range(3):
        mask[:, P + t] = 1
        with torch.no_grad():
            ref = (
                model(
                    input_ids=tok[:, None],
                    attention_mask=mask[:, : P + t + 1],
                    position_ids=(nxt_pos + t)[:, None],
                    **cache_kwarg(cache_ref),
                    cache_position=torch.tensor([P + t]),
                    use_cache=True,
                )
                .logits[:, -1]
                .float()
            )
        keys, values = _layers(cache)
        got = fast.step(tok, nxt_pos + t, keys, values, P + t, mask[:, : P + t + 1].bool())
        # bf16 logits where a bf16 model runs the C kernels (the sampler reads them as they are)
        assert got.dtype == (dtype if fast.kernels is not None else torch.float32)
        check(got.float(), ref, keys, _layers(cache_ref)[0], P + t + 1)
        tok = ref.argmax(-1)
    return fast


@pytest.mark.parametrize("kind", ["llama", "llama3-rope", "qwen2", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_logits_equal_the_model_forward(kind, dtype, monkeypatch):
    """Through the C kernels where a compiler built them (counted), else torch's ops."""
    import shutil

    from grpokit.speed.kernels import StepKernels

    used = []
    real = StepKernels.rope_attention

    def counted(self, *a):
        used.append(True)
        return real(self, *a)

    monkeypatch.setattr(StepKernels, "rope_attention", counted)
    model = _model(kind, dtype)
    if kind == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)

    def check(got, ref, keys, ref_keys, S):
        torch.testing.assert_close(got, ref, **tol)
        if dtype == torch.float32:
            for a, b in zip(keys, ref_keys):
                torch.testing.assert_close(a[:, :, :S], b[:, :, :S])

    fast = _three_steps(model, dtype, check)
    has_cc = bool(shutil.which("cc") or shutil.which("gcc"))
    assert (fast.kernels is not None) == has_cc
    assert len(used) == (3 * model.config.num_hidden_layers if has_cc else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_c_kernels_and_torch_s_ops_give_the_same_step(dtype, monkeypatch):
    """The step with its work between the products in C equals the torch-ops step: float32
    to rounding, bf16 to a few bf16 steps of the logits (sums in another order), and the
    same cache entries; the torch path's attention is SDPA here (the kernel off)."""
    import grpokit.speed.fastdecode as fd

    model = _model("llama", dtype)
    ids, mask, nxt_pos, cache = _prefilled(model)
    _, _, _, cache_t = _prefilled(model)
    B, P = ids.shape
    fast = FastDecoder.build(model, P + 5)
    if fast is None or fast.kernels is None:
        pytest.skip("no C compiler: the kernels are not built")
    fast.rotary_tables(P + 5, dtype)
    monkeypatch.setattr(fd, "decode_attention", lambda *a: None)
    tok = torch.tensor([5, 17, 42])
    for t in range(3):
        mask[:, P + t] = 1
        args = (nxt_pos + t, P + t, mask[:, : P + t + 1].bool())
        got = fast.step(tok, args[0], *_layers(cache), *args[1:])
        kern, fast.kernels = fast.kernels, None
        ref = fast.step(tok, args[0], *_layers(cache_t), *args[1:])
        fast.kernels = kern
        assert got.dtype == dtype and ref.dtype == torch.float32  # the kernels hand bf16 on
        got = got.float()
        if dtype == torch.float32:
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        else:
            torch.testing.assert_close(got, ref, atol=0.05, rtol=0.02)
        for a, b in zip(
            _layers(cache)[0] + _layers(cache)[1], _layers(cache_t)[0] + _layers(cache_t)[1]
        ):
            torch.testing.assert_close(
                a[:, :, : P + t + 1],
                b[:, :, : P + t + 1],
                **({} if dtype == torch.float32 else dict(atol=0.02, rtol=0.02)),
            )
        tok = ref.argmax(-1)


def test_step_kernels_refuse_what_they_do_not_read():
    """A tensor of another shape, dtype or layout is a ValueError, never a C read past it."""
    from grpokit.speed.kernels import step_kernels

    K = step_kernels(torch.float32, 4, 2, 8)
    if K is None:
        pytest.skip("no C compiler: the kernels are not built")
    assert (
        step_kernels(torch.float16, 4, 2, 8) is None
        and step_kernels(torch.float32, 4, 3, 8) is None
    )
    qkv = torch.randn(3, (4 + 4) * 8)
    kc, vc = torch.zeros(3, 2, 6, 8), torch.zeros(3, 2, 6, 8)
    cos, sin = torch.randn(6, 8), torch.randn(6, 8)
    pos, attend = torch.tensor([0, 1, 2]), torch.ones(3, 3, dtype=torch.bool)
    assert K.rope_attention(qkv, cos, sin, pos, kc, vc, 2, attend, 0.3).shape == (3, 32)
    for bad in (
        dict(qkv=qkv[:, :-8]),
        dict(kc=kc[:, :, ::2]),
        dict(attend=torch.ones(3, 7, dtype=torch.bool)),  # past the cache
        dict(pos=pos.int()),
        dict(qkv=qkv.double()),
    ):
        a = dict(qkv=qkv, cos=cos, sin=sin, pos=pos, kc=kc, vc=vc, attend=attend)
        a.update(bad)
        with pytest.raises(ValueError, match="decode kernel"):
            K.rope_attention(
                a["qkv"], a["cos"], a["sin"], a["pos"], a["kc"], a["vc"], 2, a["attend"], 0.3
            )
    x, h = torch.randn(3, 8), torch.empty(3, 8)
    with pytest.raises(ValueError, match="decode kernel"):
        K.add_rms(x, torch.randn(3, 7), torch.ones(8), 1e-5, h)
    with pytest.raises(ValueError, match="decode kernel"):
        K.silu_mul(torch.randn(3, 9))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_tokens_equal_with_and_without_it(kind):
    model = _model(kind)
    ids, mask, _, _ = _prefilled(model, P=6, extra=0)
    kw = dict(max_new_tokens=12, eos_ids=[3], pad_id=0, greedy=True, num_samples=2)
    plain = sample(model, ids, mask, fused_decode=False, **kw)
    fused = sample(model, ids, mask, fused_decode=True, **kw)
    assert plain.shape[1] > 4 and torch.equal(fused, plain)
    torch.manual_seed(3)
    a = sample(model, ids, mask, max_new_tokens=10, eos_ids=[], pad_id=0, fused_decode=False)
    torch.manual_seed(3)
    b = sample(model, ids, mask, max_new_tokens=10, eos_ids=[], pad_id=0, fused_decode=True)
    assert torch.equal(a, b)  # the same draws from the same distribution


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.9, min_p=0.02),  # the sampler's C kernel
        dict(temperature=0.9, top_p=0.9),  # torch's ops
        dict(temperature=1.2, repetition_penalty=1.3, min_new_tokens=4),
        dict(greedy=True),
    ],
    ids=["c-draw", "top-p", "penalty", "greedy"],
)
def test_bf16_step_logits_draw_what_their_float32_copy_draws(kw, monkeypatch):
    """A bf16 model's fused step hands the sampler its bf16 logits: every way of choosing a
    token (the C draw, top-p's torch ops, the repetition penalty and min_new_tokens in
    float32 as generate applies them, greedy) picks the tokens it picks from the logits
    widened to float32 first, from the same generator."""
    model = _model("llama", torch.bfloat16)
    ids, mask, _, _ = _prefilled(model, P=6, extra=0)
    real, dtypes = FastDecoder.step, []

    def run(widen: bool):
        def step(self, *a, **k):
            out = real(self, *a, **k)
            dtypes.append(out.dtype)
            return out.float() if widen else out

        monkeypatch.setattr(FastDecoder, "step", step)
        g = torch.Generator().manual_seed(11)
        return sample(model, ids, mask, max_new_tokens=12, eos_ids=[], pad_id=0, num_samples=3,
                      generator=g, **kw)  # fmt: skip

    got, want = run(False), run(True)
    assert got.shape == (9, 12) and torch.equal(got, want)
    assert dtypes and all(
        d == (torch.bfloat16 if _has_kernels() else torch.float32) for d in dtypes
    )


def test_the_repetition_penalty_on_bf16_logits_is_applied_in_float32():
    """3.0 / 1.3 is 2.3077 in float32, below the unseen token's 2.3125, but 2.3125 in bf16, a
    tie that greedy breaks towards the seen token: the penalty must widen bf16 logits first,
    as generate applies it to float32 logits."""
    from grpokit.rollout.sampler import _Choice, _choose, _Running

    logits = torch.tensor([[3.0, 2.3125, -1.0]], dtype=torch.bfloat16)
    choice = _Choice(torch.tensor([2]), 0, True, 1.0, 1.0, None, None, 1.3, 0, None)
    run = _Running.start(torch.ones(1, 4), torch.zeros(1, 1), seen=torch.tensor([[0]]))
    assert _choose(logits, run, choice, 0).tolist() == [1]
    assert _choose(logits.float(), run, choice, 0).tolist() == [1]


def _has_kernels() -> bool:
    from grpokit.speed.kernels import step_kernels

    return step_kernels(torch.bfloat16, 6, 2, 8) is not None


def test_models_it_does_not_reproduce_are_left_alone():
    model = _model("llama")
    assert why_unsupported(model, 100) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert FastDecoder.build(model, 100) is None
    mistral = MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=16))
    assert why_unsupported(mistral, 100) == "sliding window"
    assert why_unsupported(mistral, 16) is None
    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(
        _model("llama"), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)
    )
    assert why_unsupported(dora, 100) == "q_proj is not a plain or LoRA Linear"


def _lora(seed=1):
    """The llama test model under a LoRA adapter on every linear layer, with lora_B drawn
    non-zero (a fresh adapter's B is zero and would change nothing)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        _model("llama"),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear"),
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def test_lora_adapters_are_merged_into_its_weights():
    """A PEFT LoRA model decodes through the fused step with each adapter's ``s B A`` added
    to the weights it fuses: logits equal the PeftModel's own forward; greedy tokens equal
    the plain loop's; and the adapter matters (the base model's logits differ)."""
    model = _lora()
    assert why_unsupported(model, 100) is None
    ids, mask, nxt_pos, cache = _prefilled(model)
    _, _, _, cache_ref = _prefilled(model)
    B, P = ids.shape
    fast = FastDecoder.build(model, P + 5)
    fast.rotary_tables(P + 5, torch.float32)
    tok = torch.tensor([5, 17, 42])
    mask[:, P] = 1
    with torch.no_grad():
        kw = dict(attention_mask=mask[:, : P + 1], position_ids=nxt_pos[:, None],
                  cache_position=torch.tensor([P]), use_cache=True)  # fmt: skip
        ref = model(input_ids=tok[:, None], **cache_kwarg(cache_ref), **kw).logits[:, -1]
        with model.disable_adapter():
            _, _, _, cache_base = _prefilled(model)
            base = model(input_ids=tok[:, None], **cache_kwarg(cache_base), **kw).logits[:, -1]
    keys, values = _layers(cache)
    got = fast.step(tok, nxt_pos, keys, values, P, mask[:, : P + 1].bool())
    torch.testing.assert_close(got, ref.float(), atol=1e-5, rtol=1e-5)
    assert (got - base).abs().max() > 1e-2
    ids, mask, _, _ = _prefilled(model, P=6, extra=0)
    kw = dict(max_new_tokens=12, eos_ids=[3], pad_id=0, greedy=True, num_samples=2)
    plain = sample(model, ids, mask, fused_decode=False, **kw)
    assert torch.equal(sample(model, ids, mask, fused_decode=True, **kw), plain)


def test_kept_decoders_are_reused_until_the_weights_change():
    """Inside ``keep_decoders`` a decoder is built once per model while its parameters are
    unchanged; an in-place update (an optimizer step) builds a new one with the new weights;
    outside the block every build packs afresh, and nothing is held after it."""
    from grpokit.speed import fastdecode

    model = _model("llama")
    ids, mask, _, _ = _prefilled(model, P=6, extra=0)
    kw = dict(max_new_tokens=8, eos_ids=[], pad_id=0, greedy=True)
    assert FastDecoder.build(model, 16) is not FastDecoder.build(model, 16)
    with fastdecode.keep_decoders():
        first = FastDecoder.build(model, 16)
        assert FastDecoder.build(model, 16) is first
        with fastdecode.keep_decoders():  # nested: the outer block's decoders still hold
            assert FastDecoder.build(model, 16) is first
        other = _model("qwen2")
        assert FastDecoder.build(other, 16) is not first
        assert FastDecoder.build(model, 16) is first
        before = sample(model, ids, mask, **kw)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)  # as an optimizer step does: in place
        second = FastDecoder.build(model, 16)
        assert second is not first
        after = sample(model, ids, mask, **kw)
    assert fastdecode._kept is None
    assert not torch.equal(before, after)
    assert torch.equal(after, sample(model, ids, mask, **kw))  # = a decoder built afresh


@pytest.mark.parametrize("D", [16, 64])  # 64: four queries at a time in the values' sums
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_of_one_prompt_read_its_slots_once_with_the_same_result(dtype, D, monkeypatch):
    """rope_attention over row chunks (the completions of one prompt read the prompt's P
    cached slots once, from the chunk's first row) gives what each row alone gives, up to the
    order of the float sums; cache writes are the same bits. Prompts left-padded differently,
    a prompt split over two chunks (the cap), and a row alone."""
    from grpokit.speed import kernels as kmod
    from grpokit.speed.kernels import row_chunks, step_kernels

    H, KV, P, T = 6, 2, 9, 14
    K = step_kernels(dtype, H, KV, D)
    if K is None:
        pytest.skip("no C compiler: the kernels are not built")
    gen = torch.Generator().manual_seed(0)
    group = torch.tensor([0, 0, 0, 0, 0, 1, 1, 2])
    n, slot = group.numel(), P + 3
    prompt_k = torch.randn(3, KV, P, D, generator=gen)
    prompt_v = torch.randn(3, KV, P, D, generator=gen)
    kc = torch.randn(n, KV, T, D, generator=gen).to(dtype)  # own slots differ by row
    vc = torch.randn(n, KV, T, D, generator=gen).to(dtype)
    kc[:, :, :P], vc[:, :, :P] = prompt_k[group].to(dtype), prompt_v[group].to(dtype)
    attend = torch.ones(n, slot + 1, dtype=torch.bool)
    pad = torch.tensor([2, 0, 4])[group]  # left padding of each prompt
    for i in range(n):
        attend[i, : pad[i]] = False
    attend[3, P + 1] = False  # a row's own masked slot
    qkv = torch.randn(n, (H + 2 * KV) * D, generator=gen).to(dtype)
    cos, sin = (
        torch.randn(T, D, generator=gen).to(dtype),
        torch.randn(T, D, generator=gen).to(dtype),
    )
    pos = (torch.arange(n) % 3 + slot - 2).long()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(kmod, "MAX_Q", 4 * (H // KV))  # at most 4 rows a chunk: 0-3 | 4 | ...
    chunks = row_chunks(group, n, P, H // KV, KV)
    assert chunks.starts.tolist() == [0, 4, 5, 7, 8] and chunks.prefix == P
    caches = [(kc.clone(), vc.clone()) for _ in range(2)]
    outs = [
        K.rope_attention(qkv, cos, sin, pos, k, v, slot, attend, 0.25, c)
        for (k, v), c in zip(caches, (chunks, None))
    ]
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.02, rtol=0.02)
    torch.testing.assert_close(outs[0].float(), outs[1].float(), **tol)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])


def test_row_chunks_refuse_rows_they_cannot_share():
    from grpokit.speed.kernels import row_chunks

    assert row_chunks(None, 3, 5, 3, 3).starts.tolist() == [0, 1, 2, 3]
    assert row_chunks(torch.tensor([0, 0, 1]), 3, 0, 3, 3).starts.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not contiguous"):
        row_chunks(torch.tensor([0, 1, 0]), 3, 5, 3, 3)
    with pytest.raises(ValueError, match="group ids"):
        row_chunks(torch.tensor([0, 0]), 3, 5, 3, 3)
    K_ = __import__("grpokit.speed.kernels", fromlist=["step_kernels"]).step_kernels(
        torch.float32, 4, 2, 8
    )
    if K_ is None:
        pytest.skip("no C compiler: the kernels are not built")
    qkv, kc = torch.randn(2, 64), torch.zeros(2, 2, 6, 8)
    cos, sin, pos = torch.randn(6, 8), torch.randn(6, 8), torch.tensor([3, 3])
    attend = torch.ones(2, 4, dtype=torch.bool)
    for bad in (row_chunks(None, 3, 0, 2, 2), row_chunks(torch.tensor([0, 0]), 2, 5, 2, 2)):
        with pytest.raises(ValueError, match="decode kernel"):  # other n; prefix past slot
            K_.rope_attention(qkv, cos, sin, pos, kc, kc.clone(), 3, attend, 0.3, bad)


def test_step_with_tile_sized_products_equals_the_model_forward():
    """Shapes the packed products take (K % 32, N % 16): on a CPU with AMX or AVX512-BF16
    every product of the step runs there (amx_linear.c), elsewhere oneDNN's; logits equal
    the bf16 forward's."""
    from grpokit.speed.kernels import packed_linear_packer

    torch.manual_seed(0)
    shape = dict(
        SHAPE, vocab_size=112, hidden_size=64, intermediate_size=128, num_attention_heads=4
    )
    model = LlamaForCausalLM(LlamaConfig(**shape, rope_scaling=None, tie_word_embeddings=True))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = model.to(torch.bfloat16).eval()
    fast = _three_steps(
        model,
        torch.bfloat16,
        lambda got, ref, *_: torch.testing.assert_close(got, ref, atol=0.1, rtol=0.05),
    )
    own = packed_linear_packer() is not None
    products = [f for ly in fast.layers for f in (ly.qkv, ly.o, ly.gu, ly.down)] + [fast.head]
    assert all(hasattr(f, "keep") == own for f in products)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_all_layers_in_one_call_equal_the_per_layer_calls(kind, monkeypatch):
    """Where every product is a packed one (AMX or AVX512-BF16), a step's layers run in one
    C call (decode_layers.c): the same kernels in the same order as the per-layer loop, so
    logits and the cache entries written are bit-identical to it, rows sharing a prompt's
    slots included (Qwen2: q/k/v biases). Without either there is no one-call path
    (``all_layers`` is None)."""
    import grpokit.speed.fastdecode as fd
    from grpokit.speed.kernels import packed_linear_packer

    shape = dict(
        SHAPE, vocab_size=112, hidden_size=64, intermediate_size=128, num_attention_heads=4
    )
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape, rope_scaling=None))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=False))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = model.to(torch.bfloat16).eval()
    runs = []
    for one_call in (True, False):
        monkeypatch.setattr(fd, "USE_STEP_LAYERS", one_call)
        _, mask, nxt_pos, cache = _prefilled(model)
        P = mask.shape[1] - 5
        fast = FastDecoder.build(model, P + 5)
        fast.rotary_tables(P + 5, torch.bfloat16)
        if packed_linear_packer() is None:
            assert fast.all_layers is None
            pytest.skip("no AMX or AVX512-BF16 here: the one-call path does not apply")
        assert fast.all_layers is not None
        chunks = fast.row_chunks(torch.tensor([0, 0, 1]), 3, P)
        tok, logits = torch.tensor([5, 17, 42]), []
        for t in range(3):
            mask[:, P + t] = 1
            keys, values = _layers(cache)
            attend = mask[:, : P + t + 1].bool()
            logits.append(fast.step(tok, nxt_pos + t, keys, values, P + t, attend, chunks))
            tok = logits[-1].argmax(-1)
        runs.append((torch.stack(logits), [k.clone() for k in keys], [v.clone() for v in values]))
    (l1, k1, v1), (l2, k2, v2) = runs
    assert torch.isfinite(l1).all() and l1.std() > 0
    assert torch.equal(l1, l2)
    assert all(torch.equal(a, b) for a, b in zip(k1 + v1, k2 + v2, strict=True))
