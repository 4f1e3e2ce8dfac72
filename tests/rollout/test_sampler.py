"""grpokit's decode loop (grpokit/rollout/sampler.py) draws from the same distribution as
transformers' generate: greedy output identical token for token (left padding included),
the same filters as generate's warpers, an exact categorical draw, and log-probs of the
sampled tokens that the training forward reproduces."""

import copy
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from grpokit.rollout.sampler import (
    apply_repetition_penalty,
    draw,
    filter_min_p,
    filter_top_k_top_p,
    sample,
)


def _prompts(tok):
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True
        )
        for m in ("What is 2 + 3?", "Tell me a much longer story about a cat and a dog.", "Hi")
    ]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def test_greedy_equals_generate_with_left_padding(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = _prompts(tok)
    assert (mask == 0).any(), "the test needs left padding"
    eos = [tok.eos_token_id]
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=eos,
        )[:, ids.shape[1] :]
    mine = sample(
        model, ids, mask, max_new_tokens=12, eos_ids=eos, pad_id=tok.pad_token_id, greedy=True
    )
    assert torch.equal(mine, ref)
    # when every row has ended the loop stops: make each row's first greedy token an EOS
    firsts = sorted({int(t) for t in ref[:, 0]})
    short = sample(model, ids, mask, max_new_tokens=12, eos_ids=firsts, pad_id=-1, greedy=True)
    assert short.shape == (3, 1) and torch.equal(short[:, 0], ref[:, 0])
    # a row that ends early is padded after its EOS while the others go on
    stop = int(ref[0, 2])
    if stop not in ref[1:, :].flatten().tolist():
        part = sample(model, ids, mask, max_new_tokens=12, eos_ids=[stop], pad_id=-1, greedy=True)
        assert part.shape[1] == 12 and part[0, 2] == stop and (part[0, 3:] == -1).all()


def test_filters_equal_generate_warpers():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        scores = torch.randn(4, 97, generator=g) * 3
        ids = torch.randint(0, 97, (4, 10), generator=g)
        for top_k, top_p in ((0, 1.0), (5, 1.0), (0, 0.9), (7, 0.5), (0, 0.01)):
            want = scores.clone()
            if top_k:
                want = TopKLogitsWarper(top_k)(ids, want)
            if top_p < 1:
                want = TopPLogitsWarper(top_p)(ids, want)
            got = filter_top_k_top_p(scores.clone(), top_k, top_p)
            assert torch.equal(torch.isinf(got), torch.isinf(want)), (top_k, top_p)
            assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])
        want = RepetitionPenaltyLogitsProcessor(1.3)(ids, scores.clone())
        torch.testing.assert_close(apply_repetition_penalty(scores.clone(), ids, 1.3), want)


def test_min_p_filter_equals_its_definition_and_generate():
    """min_p keeps the tokens whose probability is at least min_p times the row's largest,
    after top-k and top-p in generate's order: checked against a plain loop over the
    probabilities and against transformers' warper chain."""
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        scores = torch.randn(4, 97, generator=g) * 3
        ids = torch.randint(0, 97, (4, 10), generator=g)
        for top_k, top_p, min_p in ((0, 1.0, 0.1), (5, 1.0, 0.3), (0, 0.9, 0.05), (7, 0.5, 1.0)):
            got = filter_min_p(filter_top_k_top_p(scores.clone(), top_k, top_p), min_p)
            want = scores.clone()
            if top_k:
                want = TopKLogitsWarper(top_k)(ids, want)
            if top_p < 1:
                want = TopPLogitsWarper(top_p)(ids, want)
            kept_before = ~torch.isinf(want)
            want = MinPLogitsWarper(min_p)(ids, want)
            assert torch.equal(torch.isinf(got), torch.isinf(want)), (top_k, top_p, min_p)
            for r in range(4):  # the definition, one token at a time
                probs = filter_top_k_top_p(scores.clone(), top_k, top_p)[r].softmax(-1).tolist()
                pmax = max(probs)
                for v in range(97):
                    keep = bool(kept_before[r, v]) and probs[v] >= min_p * pmax
                    assert keep == bool(torch.isfinite(got[r, v])), (r, v)
    x = torch.randn(2, 9)
    assert torch.equal(filter_min_p(x, None), x) and torch.equal(filter_min_p(x, 0.0), x)


def test_min_p_changes_what_the_decode_loop_samples(tiny_model_dir):
    """Every token drawn with min_p (grpokit's loop with the fused decode step and with the
    model's own forward; transformers' generate through the engine) has a probability, under
    the training forward at the sampling temperature, of at least min_p times the most
    probable token's; without min_p some drawn tokens fall below."""
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.hf import HFRolloutEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = _prompts(tok)
    min_p, T = 0.7, 1.5  # the tiny random model is nearly flat: ratios ~0.5-0.9

    def ratios(min_p, loop, fused=True):
        torch.manual_seed(0)
        eng = HFRolloutEngine(model, tok, loop=loop, fused_decode=fused)
        params = SamplingParams(max_new_tokens=16, temperature=T, min_p=min_p)
        ro = eng.generate(ids, mask, params, num_generations=4)
        comp = ro.completion_ids
        full = torch.cat([ro.prompt_ids, comp], 1)
        am = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(input_ids=full, attention_mask=am, position_ids=pos).logits
        probs = (logits[:, ids.shape[1] - 1 : -1].double() / T).softmax(-1)
        r = probs.gather(-1, comp[..., None])[..., 0] / probs.amax(-1)
        return r[ro.completion_mask.bool()]

    for loop, fused in (("grpokit", True), ("grpokit", False), ("hf", True)):
        got = ratios(min_p, loop, fused)
        assert got.numel() > 20 and got.min() >= min_p - 1e-4, (loop, fused)
        assert ratios(None, loop, fused).min() < min_p, (loop, fused)


def test_draw_is_an_exact_categorical_sample():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3], [0.0, 0.0, 0.0, 1.0]])
    g = torch.Generator().manual_seed(1)
    n = 40_000
    counts = torch.zeros(2, 4)
    for _ in range(n // 1000):
        idx = draw(probs.repeat(1000, 1), g).view(1000, 2)
        for r in range(2):
            counts[r] += torch.bincount(idx[:, r], minlength=4)
    freq = counts / n
    assert freq[0, 1] == 0 and freq[1, :3].sum() == 0  # zero-probability tokens never drawn
    # 4 sigma of a binomial proportion at n=40k is about 0.01
    torch.testing.assert_close(freq[0], probs[0], atol=0.01, rtol=0)


def test_sampled_tokens_are_what_the_training_forward_scores(tiny_model_dir):
    """Sampling at temperature 0.7 with a fixed seed, then re-scoring: the chosen tokens'
    probabilities under the training forward's distribution are consistent with the draw
    (each uniform falls inside the chosen token's CDF interval)."""
    from grpokit.algo import selective_log_softmax

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = _prompts(tok)
    torch.manual_seed(0)
    comp = sample(model, ids, mask, max_new_tokens=6, eos_ids=[], pad_id=0, temperature=0.7)
    assert comp.shape == (3, 6)
    # replay the uniforms and check every chosen token sits where its uniform falls
    full = torch.cat([ids, comp], 1)
    am = torch.cat([mask, torch.ones_like(comp)], 1)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=am, position_ids=pos).logits
    logits = logits[:, ids.shape[1] - 1 : -1].float() / 0.7
    probs = logits.softmax(-1)
    torch.manual_seed(0)
    for t in range(6):
        u = torch.rand(3, 1)
        cdf = probs[:, t].cumsum(-1)
        lo = torch.where(
            comp[:, t] > 0, cdf.gather(-1, (comp[:, t] - 1).clamp(min=0)[:, None])[:, 0], 0.0
        )
        hi = cdf.gather(-1, comp[:, t][:, None])[:, 0]
        x = u[:, 0] * cdf[:, -1]
        assert ((x >= lo - 1e-4) & (x <= hi + 1e-4)).all(), t
    logp = selective_log_softmax(logits, comp)
    assert torch.isfinite(logp).all()


def test_bf16_sampling_copy_follows_the_policy(tiny_model_dir):
    """The engine's bf16 copy is refreshed after weights_updated() and only then."""
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.hf import HFRolloutEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = _prompts(tok)
    eng = HFRolloutEngine(model, tok, sampling_dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=4, greedy=True)
    eng.generate(ids, mask, params)
    copy_model = eng.sampling_copy
    assert next(copy_model.parameters()).dtype == torch.bfloat16

    def same():
        return all(
            torch.equal(c, p.detach().to(torch.bfloat16))
            for c, p in zip(copy_model.parameters(), model.parameters())
        )

    assert same()
    want = copy.deepcopy(model).to(torch.bfloat16).state_dict()
    got = copy_model.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert [n for n, _ in copy_model.named_parameters()] == [
        n for n, _ in model.named_parameters()
    ]  # tied weights stay tied
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    eng.generate(ids, mask, params)
    assert not same()  # not refreshed: nobody said the weights changed
    eng.weights_updated()
    eng.generate(ids, mask, params)
    assert same() and eng.sampling_copy is copy_model  # refreshed in place, no new copy


def test_bf16_sampling_copy_is_freed_between_rollout_phases(tiny_model_dir):
    """After a round's generation (``rollout_phase``) the copy holds no weights through the
    training passes; the next generate allocates and refreshes them: same samples, same object,
    tied weights still one tensor."""
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.hf import HFRolloutEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = _prompts(tok)
    eng = HFRolloutEngine(model, tok, sampling_dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=6, greedy=True)
    with eng.rollout_phase():
        first = eng.generate(ids, mask, params).completion_ids
        again = eng.generate(ids, mask, params).completion_ids  # inside: kept
    copy_model = eng.sampling_copy
    assert torch.equal(first, again)
    assert sum(p.numel() for p in copy_model.parameters()) == 0  # released
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # an update: the refresh must follow it
    eng.weights_updated()
    after = eng.generate(ids, mask, params).completion_ids
    assert eng.sampling_copy is copy_model
    assert all(
        torch.equal(c, p.detach().to(torch.bfloat16))
        for c, p in zip(copy_model.parameters(), model.parameters())
    )
    assert model.config.tie_word_embeddings  # the tiny model ties them: check they stay one
    assert copy_model.lm_head.weight is copy_model.get_input_embeddings().weight
    assert copy_model.lm_head.weight.data_ptr() == copy_model.model.embed_tokens.weight.data_ptr()
    fresh = HFRolloutEngine(model, tok, sampling_dtype=torch.bfloat16)
    assert torch.equal(after, fresh.generate(ids, mask, params).completion_ids)


def test_min_new_tokens_masks_eos(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = _prompts(tok)
    greedy = sample(model, ids, mask, max_new_tokens=6, eos_ids=[], pad_id=-1, greedy=True)
    eos = sorted({int(t) for t in greedy[:, 0]})  # each row's first choice is an EOS
    out = sample(
        model, ids, mask, max_new_tokens=6, eos_ids=eos, pad_id=-1, greedy=True, min_new_tokens=3
    )
    assert out.shape[1] >= 3 and not torch.isin(out[:, :3], torch.tensor(eos)).any()


def test_shared_prompt_prefill_and_dropping_ended_rows(tiny_model_dir):
    """num_samples runs each prompt once and copies its cache; rows that end leave the
    batch. Greedy output is the same as generate on the repeated prompts, in the fp32
    static-cache path and in the autocast (dynamic cache) path."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = _prompts(tok)
    torch.manual_seed(1)
    with torch.no_grad():  # the tiny model's greedy choice is one token; make rows differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    rep_ids, rep_mask = ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0)
    with torch.no_grad():
        ref = model.generate(
            input_ids=rep_ids,
            attention_mask=rep_mask,
            max_new_tokens=10,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=[tok.eos_token_id],
        )[:, ids.shape[1] :]
    # an "EOS" that ends some rows early and not others, so the batch shrinks mid-way
    cands = sorted({int(x) for x in ref.flatten()} - {tok.eos_token_id, tok.pad_token_id})
    counts = {c: sum(c in ref[r].tolist() for r in range(6)) for c in cands}
    stops = [min((c for c in cands if 0 < counts[c] < 6), key=lambda c: -counts[c])]
    ended = [r for r in range(6) if stops[0] in ref[r].tolist()]
    for amp in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = sample(
                model, ids, mask, max_new_tokens=10, eos_ids=[tok.eos_token_id],
                pad_id=tok.pad_token_id, greedy=True, num_samples=2,
            )  # fmt: skip
            short = sample(
                model, ids, mask, max_new_tokens=10, eos_ids=stops, pad_id=-1, greedy=True,
                num_samples=2,
            )  # fmt: skip
        if not amp:
            assert torch.equal(out, ref)
        assert out.shape == (6, ref.shape[1]) and torch.equal(out[0::2], out[1::2])
        assert 0 < len(ended) < 6
        for r in range(6):
            row = short[r].tolist()
            if r in ended:  # ended at its first stop token, padded after
                k = row.index(stops[0])
                assert all(x == -1 for x in row[k + 1 :]) and (
                    amp or row[: k + 1] == ref[r, : k + 1].tolist()
                )
            else:
                assert -1 not in row and (amp or row == ref[r, : len(row)].tolist())
    # draws: each of the G rows of a prompt samples on its own
    torch.manual_seed(0)
    drawn = sample(model, ids, mask, max_new_tokens=8, eos_ids=[], pad_id=-1, num_samples=4)
    assert drawn.shape == (12, 8) and not torch.equal(drawn[0], drawn[1])


def test_bf16_sampling_copy_merges_lora(tiny_model_dir):
    """With LoRA the copy holds base + scaling * B @ A in bf16 (the policy's weights are
    left alone), follows the adapter after weights_updated(), and samples like the policy."""
    from peft import LoraConfig, get_peft_model

    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.hf import HFRolloutEngine

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # a non-zero adapter
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    base_w = q.base_layer.weight.detach().clone()
    ids, mask = _prompts(tok)
    eng = HFRolloutEngine(model, tok, sampling_dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=5, greedy=True)
    out = eng.generate(ids, mask, params)
    cq = eng.sampling_copy.model.layers[0].self_attn.q_proj.weight
    want = (base_w + q.get_delta_weight("default")).to(torch.bfloat16)
    assert cq.dtype == torch.bfloat16 and torch.equal(cq, want)
    assert torch.equal(q.base_layer.weight, base_w)  # the policy was not merged into
    for name, buf in eng.sampling_copy.named_buffers():
        assert torch.isfinite(buf).all(), name
    # the copy is peft's own merge of the adapter, cast to bf16: the same logits exactly
    merged = copy.deepcopy(model).merge_and_unload().to(torch.bfloat16).eval()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        a = merged(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        b = eng.sampling_copy(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert torch.equal(a, b) and out.completion_ids.shape[0] == 3
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(-1)
    eng.weights_updated()
    eng.generate(ids, mask, params)
    want = (base_w + q.get_delta_weight("default")).to(torch.bfloat16)
    assert torch.equal(eng.sampling_copy.model.layers[0].self_attn.q_proj.weight, want)


def test_merged_weights_refuse_an_adapter_that_is_not_w_plus_ba(tiny_model_dir):
    """DoRA rescales each output column by a learned magnitude: merging it as W + s B A (what
    the sampling copy and the vLLM weight sync send) would sample from another model."""
    from peft import LoraConfig, get_peft_model

    from grpokit.rollout.hf import merged_lora_state_dict

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"]))
    sd = merged_lora_state_dict(plain.get_base_model())
    assert not any("lora_" in k or "base_layer" in k for k in sd)
    dora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, target_modules=["q_proj"], use_dora=True),
    )
    with pytest.raises(ValueError, match="DoRA"):
        merged_lora_state_dict(dora.get_base_model())


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_the_c_draw_and_the_torch_draw_choose_the_same_tokens(tiny_model_dir, monkeypatch, top_p):
    """The decode loop with the sampler's C kernel (temperature and min-p, no top-k/top-p)
    and with torch's ops draw the same tokens from the same generator; with top-p set the
    kernel is not used and the torch ops take the same uniforms."""
    import grpokit.rollout.sampler as sampler_mod

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids, mask = _prompts(AutoTokenizer.from_pretrained(tiny_model_dir))
    calls = []

    def run(kernel):
        def counted(*a):
            out = kernel(*a)
            calls.append(out is not None)
            return out

        monkeypatch.setattr(sampler_mod, "sample_tokens", counted)
        g = torch.Generator().manual_seed(5)
        return sample(model, ids, mask, max_new_tokens=12, eos_ids=[], pad_id=0,
                      temperature=0.9, top_p=top_p, min_p=0.02, num_samples=4, generator=g)  # fmt: skip

    with_c = run(sampler_mod.sample_tokens)
    assert torch.equal(with_c, run(lambda *a: None))
    # 12 steps; both runs asked, the kernel drew every step of the first (a C compiler here)
    assert calls == ([True] * 12 + [False] * 12 if top_p == 1.0 else [])
