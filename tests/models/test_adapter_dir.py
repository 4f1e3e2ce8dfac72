"""A LoRA run's checkpoint-N holds only the adapter (adapter_config.json, no config.json):
eval and generate load it as its base model with the adapter merged in."""

import json

import pytest
import torch

from grpokit.models import ModelSourceError, load_model_and_tokenizer, resolve_model


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # lora_B starts at 0: give it weights so the adapter changes logits
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    out = tmp_path_factory.mktemp("ck") / "checkpoint-3"
    peft.save_pretrained(out)
    ids = torch.tensor([[1, 5, 9, 14, 3]])
    with torch.no_grad():
        want = peft(input_ids=ids).logits
    return out, ids, want


def test_adapter_checkpoint_loads_merged_on_its_base(adapter_dir, tiny_model_dir):
    out, ids, want = adapter_dir
    assert not (out / "config.json").exists()
    res = resolve_model(str(out))
    assert res.adapter == str(out) and res.path == tiny_model_dir
    assert "LoRA adapter" in res.source
    model, _, _ = load_model_and_tokenizer(str(out))
    assert not hasattr(model, "peft_config")  # merged into a plain model
    with torch.no_grad():
        got = model(input_ids=ids).logits
    base, _, _ = load_model_and_tokenizer(tiny_model_dir)
    with torch.no_grad():
        plain = base(input_ids=ids).logits
    assert (want - plain).abs().max() > 1e-2  # the adapter matters ...
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # ... and is what was loaded


def test_adapter_without_base_is_one_line(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    with pytest.raises(ModelSourceError, match="without a readable base_model_name_or_path"):
        resolve_model(str(tmp_path))


def test_adapter_checkpoint_refused_as_a_new_lora_start(adapter_dir):
    with pytest.raises(ModelSourceError, match="--resume CHECKPOINT_DIR"):
        load_model_and_tokenizer(str(adapter_dir[0]), use_peft=True)
