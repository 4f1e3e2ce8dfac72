"""The gated MLP that keeps fewer activations: the same numbers as transformers' own forward
and backward, bit for bit, and one (tokens, intermediate) tensor a layer fewer kept."""

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

from grpokit.speed.layers import gated_silu_mlps, lean_mlps

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
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with lean_mlps(model, enabled=lean), torch.autocast("cpu", torch.bfloat16, enabled=amp):
            out = model(input_ids=ids).logits
    loss = (out.float() ** 2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, sum(saved)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_same_values_and_gradients_with_less_kept(amp, lora):
    model = _llama(lora)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    out0, g0, kept0 = _run(model, ids, lean=False, amp=amp)
    out1, g1, kept1 = _run(model, ids, lean=True, amp=amp)
    assert torch.equal(out0, out1)
    assert g0.keys() == g1.keys() and len(g0) > 0
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    # silu(gate) is not kept: one (3 x 11, 80) tensor a layer, in the activations' dtype
    per_layer = 3 * 11 * 80 * (2 if amp else 4)
    assert kept0 - kept1 == SHAPE["num_hidden_layers"] * per_layer
    # the model is itself again after the block
    assert all("forward" not in vars(m) for m in gated_silu_mlps(model))


def test_which_mlps_it_takes():
    assert len(gated_silu_mlps(_llama())) == 3
    assert len(gated_silu_mlps(_llama(lora=True))) == 3
    qwen = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    assert len(gated_silu_mlps(qwen)) == 3  # the same forward, another class
    gelu = LlamaForCausalLM(LlamaConfig(**SHAPE, hidden_act="gelu"))
    assert gated_silu_mlps(gelu) == []  # another activation
    gemma = GemmaForCausalLM(GemmaConfig(**SHAPE, head_dim=8))
    assert gated_silu_mlps(gemma) == []  # gelu (tanh)
    with lean_mlps(_llama(), enabled=False) as n:
        assert n == 0
