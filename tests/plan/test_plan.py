"""grpokit plan: batch arithmetic on hand-computed configs, parameter counts against built
models, LoRA counts against peft, memory terms against their formulas, and the CLI."""

import dataclasses
import json

import pytest

from grpokit.cli import main
from grpokit.config import build_config
from grpokit.plan import (
    ModelShape,
    batch_plan,
    estimate_memory,
    lora_param_count,
    make_plan,
    param_counts,
    parse_size,
    read_model_config,
)


def cfg(**kw):
    base = dict(max_eval_samples=0, model_name_or_path="x")
    return build_config({**base, **kw})


def test_batch_arithmetic_tutorial_shape():
    c = cfg(
        num_generations=12,
        per_device_train_batch_size=12,
        gradient_accumulation_steps=7,
        max_completion_length=400,
        max_steps=500,
    )
    b = batch_plan(c, num_processes=1, train_rows=7473)
    assert (b.completions_per_step, b.prompts_per_step) == (84, 7)
    assert (b.micro_batch, b.generation_batch, b.prompts_per_process) == (12, 84, 7)
    assert b.optimizer_steps == 500
    assert b.steps_per_epoch == 7473 // 7 == 1067
    assert b.max_tokens_generated == 500 * 84 * 400


def test_batch_arithmetic_processes_epochs_iterations():
    c = cfg(
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_iterations=2,
        num_train_epochs=2,
        max_completion_length=10,
        max_train_samples=90,
    )
    b = batch_plan(c, num_processes=2, train_rows=1000)
    assert (b.completions_per_step, b.prompts_per_step) == (16, 4)  # 4 x 2 x 2 processes
    assert (b.generation_batch, b.prompts_per_process) == (8, 2)
    assert b.train_rows == 90  # max_train_samples caps the dataset
    assert b.steps_per_epoch == (90 // 4) * 2 == 44  # rounds x num_iterations
    assert b.optimizer_steps == 2 * 22 * 2
    assert b.max_tokens_generated == 44 * 16 * 10  # rounds x completions x C
    unknown = batch_plan(c, num_processes=1, train_rows=None)
    assert unknown.optimizer_steps is None and unknown.max_tokens_generated is None


def test_param_count_equals_built_tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    shape = read_model_config(tiny_model_dir)
    assert param_counts(shape)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind", ["llama_untied_bias", "qwen2"])
def test_param_count_variants(kind):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=101,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    if kind == "qwen2":
        hf = Qwen2Config(**common)
    else:
        hf = LlamaConfig(**common, attention_bias=True, mlp_bias=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf)
    shape = ModelShape.from_config(hf.to_dict())
    assert param_counts(shape)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("targets", [None, ["q_proj", "v_proj"], "all-linear"])
def test_lora_count_matches_peft(tiny_model_dir, targets):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(
        model,
        LoraConfig(
            r=4, lora_alpha=8, target_modules=targets or "all-linear", task_type="CAUSAL_LM"
        ),
    )
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert lora_param_count(read_model_config(tiny_model_dir), 4, targets) == trainable


SHAPE = ModelShape(
    vocab_size=1000,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    tie_word_embeddings=True,
)


def test_memory_terms_by_hand():
    P_ = param_counts(SHAPE)["total"]
    c = cfg(
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
        max_prompt_length=10,
        max_completion_length=6,
        beta=0.04,
    )
    m = estimate_memory(c, SHAPE)
    assert m["weights"] == m["reference"] == 4 * P_  # fp32 weights; beta > 0: a second copy
    assert m["gradients"] == 4 * P_ and m["optimizer"] == 8 * P_
    assert m["autocast_weights"] == 0
    # KV: 2 x layers x kv heads x head_dim x (P + C) x generation batch (4 x 2) x 4 bytes
    assert m["kv_cache"] == 2 * 2 * 2 * 16 * 16 * 8 * 4
    # logits in fp32: lm_head output + scaled copy, B x C x V x 4 each, + entropy temporaries
    assert m["logits"] == 2 * 4 * 6 * 1000 * 4 + 3 * 6 * 1000 * 4
    per_tok = 4 * (64 + 3 * 64 + 3 * 32 + 64 + 4 * 128) + 16 * 64
    assert m["activations"] == 2 * per_tok * 4 * 16
    ck = estimate_memory(cfg(**{**c.to_dict(), "gradient_checkpointing": True}), SHAPE)
    assert ck["activations"] == 2 * 4 * 16 * 64 * 4 + per_tok * 4 * 16 < m["activations"]

    bf = estimate_memory(cfg(**{**c.to_dict(), "bf16": True}), SHAPE)
    assert bf["weights"] == 4 * P_ and bf["autocast_weights"] == 2 * P_
    assert bf["kv_cache"] == m["kv_cache"] // 2

    lora = estimate_memory(cfg(**{**c.to_dict(), "use_peft": True, "lora_r": 8}), SHAPE)
    n_lora = lora_param_count(SHAPE, 8)
    assert lora["reference"] == 0 and lora["trainable_params"] == n_lora
    assert lora["gradients"] == 4 * n_lora and lora["optimizer"] == 8 * n_lora


def test_optimizer_memory_by_dtype_and_optim():
    """bf16 weights: fp32 AdamW moments (8 bytes), fp32 master copies (4) and fp32 master
    gradients (4) per trainable parameter; 8-bit AdamW: 2 bytes + 2 fp32 absmax per 256."""
    P_ = param_counts(SHAPE)["total"]
    c = cfg(per_device_train_batch_size=4, num_generations=4)
    f32 = estimate_memory(c, SHAPE)
    assert f32["master_weights"] == 0 and f32["optimizer"] == 8 * P_
    bf = estimate_memory(cfg(**{**c.to_dict(), "torch_dtype": "bfloat16"}), SHAPE)
    assert bf["weights"] == 2 * P_ and bf["master_weights"] == 4 * P_
    assert bf["optimizer"] == 8 * P_ and bf["gradients"] == 4 * P_
    q = estimate_memory(cfg(**{**c.to_dict(), "optim": "adamw_8bit"}), SHAPE)
    assert q["optimizer"] == int(P_ * (2 + 8 / 256))
    assert q["peak"] == f32["peak"] - f32["optimizer"] + q["optimizer"]
    qb = estimate_memory(
        cfg(**{**c.to_dict(), "optim": "adamw_8bit", "torch_dtype": "bfloat16"}), SHAPE
    )
    assert qb["master_weights"] == 4 * P_


def test_zero_stages_shard():
    c = cfg(per_device_train_batch_size=4, num_generations=4, beta=0.1)
    base = estimate_memory(c, SHAPE, num_processes=4, zero_stage=0)
    z2 = estimate_memory(c, SHAPE, num_processes=4, zero_stage=2)
    z3 = estimate_memory(c, SHAPE, num_processes=4, zero_stage=3)
    assert z2["optimizer"] == base["optimizer"] // 4 and z2["gradients"] == base["gradients"] // 4
    assert z2["weights"] == base["weights"]
    assert z3["weights"] == base["weights"] // 4 and z3["reference"] == base["reference"] // 4
    assert base["peak"] > z2["peak"] > z3["peak"]


def test_parse_size():
    assert parse_size("80GB") == 80e9
    assert parse_size("24GiB") == 24 * 2**30
    assert parse_size("512MB") == 512e6
    with pytest.raises(ValueError):
        parse_size("lots")


def test_plan_warns_over_device_memory(tiny_model_dir):
    c = cfg(model_name_or_path=tiny_model_dir, task="arithmetic")
    p = make_plan(c, device_memory="1MB")
    assert any("exceeds device memory" in w for w in p.warnings)
    assert not make_plan(c, device_memory="1TB").warnings


def test_cli_plan_table_json_and_dry_run(tiny_model_dir, capsys):
    args = ["--model_name_or_path", tiny_model_dir, "--task", "arithmetic"]
    assert main(["plan", *args, "--device_memory", "80GB", "--num_processes", "2"]) == 0
    out = capsys.readouterr().out
    assert "completions per optimizer step         64" in out and "ESTIMATED PEAK" in out
    assert main(["plan", *args, "--json", "--zero_stage", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["zero_stage"] == 3 and d["plan"]["memory"]["peak"] > 0
    assert d["config"]["task"] == "arithmetic"
    assert main(["train", *args, "--dry-run"]) == 0
    assert "ESTIMATED PEAK" in capsys.readouterr().out


def test_cli_plan_unreadable_model(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert (
        main(["plan", "--model_name_or_path", "nobody/no-such-model", "--task", "arithmetic"]) == 2
    )
    err = capsys.readouterr().err
    assert "cannot read the config of 'nobody/no-such-model'" in err


def test_lean_layers_keep_fewer_tensors_in_the_estimate():
    """The training forward's lean layers (grpokit.speed.layers) keep gate and up, not
    silu(gate) nor the product: 2 intermediate-sized tensors a token a layer instead of 4;
    Llama's RMSNorm keeps its float32 input, not the normalised one; checkpointing aside
    (its recompute runs transformers' own layers)."""
    d = {
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": 1000,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
    }
    lean = ModelShape.from_config(d)
    assert lean.gated_silu
    assert not ModelShape.from_config({**d, "hidden_act": "gelu"}).gated_silu
    assert not ModelShape.from_config({**d, "model_type": "gemma"}).gated_silu
    assert lean.llama_norm and not ModelShape.from_config({**d, "model_type": "olmo2"}).llama_norm
    c = cfg(
        per_device_train_batch_size=4,
        num_generations=4,
        max_prompt_length=10,
        max_completion_length=6,
    )
    plain = dataclasses.replace(lean, gated_silu=False, llama_norm=False)
    m, p = estimate_memory(c, lean), estimate_memory(c, plain)
    # L x B x T x (2 x s x I + 2 norms x 4 x h)
    assert p["activations"] - m["activations"] == 2 * 4 * 16 * (2 * 4 * 128 + 2 * 4 * 64)
    g = cfg(**{**c.to_dict(), "gradient_checkpointing": True})
    assert estimate_memory(g, lean)["activations"] == estimate_memory(g, plain)["activations"]
