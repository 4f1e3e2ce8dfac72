"""vLLM in the training process: weights pushed after an update reach the engine (full
and LoRA), and its greedy output then equals the trainer model's token for token."""

import time

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here; run ./run test-vllm")
import torch

from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.rollout.vllm_engine import VLLMColocateEngine, VLLMError, make_llm

GREEDY = SamplingParams(max_new_tokens=16, greedy=True)


@pytest.fixture(scope="module")
def llm(vllm_tiny_dir):
    # one engine for the module: a second vLLM engine in one process is not supported
    return make_llm(vllm_tiny_dir, dtype="float32", max_model_len=256, enforce_eager=True)


def _load(path, use_peft=False):
    from grpokit.models import load_model_and_tokenizer

    model, tok, _ = load_model_and_tokenizer(path, use_peft=use_peft, lora_r=4, lora_alpha=8)
    return model.eval(), tok


def _prompts(tok):
    texts = ["3 + 4 =", "hello world, the", "a b c d e"]
    enc = tok(texts, return_tensors="pt", padding=True)  # left padding (grpokit's tokenizer)
    return enc.input_ids, enc.attention_mask


def _greedy_equal(hf, vl):
    assert torch.equal(vl.completion_mask, hf.completion_mask)
    assert torch.equal(vl.completion_ids, hf.completion_ids), (vl.texts, hf.texts)


def test_weight_sync_then_greedy_equals_trainer(llm, vllm_tiny_dir):
    model, tok = _load(vllm_tiny_dir)
    ids, mask = _prompts(tok)
    eng = VLLMColocateEngine(model, tok, vllm_tiny_dir, llm=llm)
    hf = HFRolloutEngine(model, tok)
    before = hf.generate(ids, mask, GREEDY)
    _greedy_equal(before, eng.generate(ids, mask, GREEDY))
    assert len(set(before.completion_ids[0].tolist())) > 2  # not a single repeated token

    with torch.no_grad():  # an "optimizer step" that changes the greedy output
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    eng.weights_updated()
    after = hf.generate(ids, mask, GREEDY)
    assert not torch.equal(after.completion_ids, before.completion_ids)
    t0 = time.time()
    got = eng.generate(ids, mask, GREEDY)
    print(f"sync {eng.sync_seconds:.3f} s, sync + generate {time.time() - t0:.2f} s")
    _greedy_equal(after, got)
    # the engine's sampled-token log-probs match the trainer's (fp32, same weights)
    assert got.sampling_logps is not None and got.sampling_logps.shape == got.completion_ids.shape
    logits = model(torch.cat([got.prompt_ids, got.completion_ids], 1)).logits
    P = got.prompt_ids.shape[1]
    # left-padded prompts need position ids as in generation: compare the unpadded row 0
    # only where row 0 has no padding
    row = int((got.prompt_mask.sum(-1) == P).nonzero()[0])
    lp = torch.log_softmax(logits[row, P - 1 : -1], -1)
    ours = lp.gather(-1, got.completion_ids[row, :, None])[:, 0]
    m = got.completion_mask[row].bool()
    assert torch.allclose(ours[m], got.sampling_logps[row][m], atol=1e-3)


def test_lora_update_reaches_vllm(llm, vllm_tiny_dir):
    model, tok = _load(vllm_tiny_dir, use_peft=True)
    ids, mask = _prompts(tok)
    eng = VLLMColocateEngine(model, tok, vllm_tiny_dir, llm=llm)
    hf = HFRolloutEngine(model, tok)
    with torch.no_grad():
        with model.disable_adapter():
            base = hf.generate(ids, mask, GREEDY)
        g = torch.Generator().manual_seed(2)
        for n, p in model.named_parameters():
            if "lora_B" in n:  # B starts at zero: make the adapter do something
                p.normal_(0.0, 0.3, generator=g)
    eng.weights_updated()
    tuned = hf.generate(ids, mask, GREEDY)
    assert not torch.equal(tuned.completion_ids, base.completion_ids)
    _greedy_equal(tuned, eng.generate(ids, mask, GREEDY))


def test_sampling_settings_reach_vllm(llm, vllm_tiny_dir):
    """Sampled (not greedy) rows: G per prompt, distinct, EOS handling as the HF engine."""
    model, tok = _load(vllm_tiny_dir)
    ids, mask = _prompts(tok)
    eng = VLLMColocateEngine(model, tok, vllm_tiny_dir, llm=llm)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=20, top_p=0.9)
    torch.manual_seed(0)
    ro = eng.generate(ids, mask, params, num_generations=4)
    assert ro.completion_ids.shape[0] == 12 and ro.completion_ids.shape[1] <= 12
    assert len({tuple(r.tolist()) for r in ro.completion_ids[:4]}) > 1  # the G rows differ
    torch.manual_seed(0)
    again = eng.generate(ids, mask, params, num_generations=4)
    assert torch.equal(again.completion_ids, ro.completion_ids)  # seeded from torch's RNG
    # greedy with a min length: no EOS before it
    ro = eng.generate(ids, mask, SamplingParams(max_new_tokens=8, greedy=True, min_new_tokens=8))
    assert (ro.lengths == 8).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="sleep mode works on a GPU")
def test_sleep_mode_without_gpu_is_a_clear_error(vllm_tiny_dir):
    # vLLM itself refuses it on CPU, deep in a pydantic validation error
    with pytest.raises(VLLMError, match="vllm_enable_sleep_mode: false"):
        make_llm(vllm_tiny_dir, dtype="float32", max_model_len=256, enable_sleep_mode=True)


def test_min_p_and_filters_reach_vllm_sampling_params():
    """The recipe's filters become vLLM's own SamplingParams fields (min_p: TRL's key; None
    is vLLM's 0.0, off)."""
    from grpokit.rollout.vllm_engine import vllm_sampling_params

    p = SamplingParams(max_new_tokens=4, top_k=7, top_p=0.8, min_p=0.3, repetition_penalty=1.2)
    v = vllm_sampling_params(p, [0], seed=1)
    assert (v.min_p, v.top_k, v.top_p, v.repetition_penalty) == (0.3, 7, 0.8, 1.2)
    assert vllm_sampling_params(SamplingParams(max_new_tokens=4), [0], seed=1).min_p == 0.0
