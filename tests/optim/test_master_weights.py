"""fp32 master weights for bf16 trainable weights (grpokit/optim.py): the optimizer steps fp32
copies, accumulates and clips fp32 gradients, rounds the copies back into the model, and a
checkpoint resumes from the same fp32 values. Tiny model only (bf16 matmuls are slow on a CPU
without native bf16)."""

import json

import pytest
import torch

from grpokit.config import build_config
from grpokit.optim import MasterWeights, build_optimizer, params_to_clip
from grpokit.testing import tiny_run_config

# a reward that differs between completions of the random tiny model, so the gradient is not 0
VARIED = dict(
    reward_funcs=[{"length_target": {"target_length": 12}}],
    num_generations=4,
    per_device_train_batch_size=8,
    max_completion_length=8,
)


def _updated_fraction(before, after) -> float:
    changed = sum((a.float() != b).sum().item() for a, b in zip(after, before))
    return changed / sum(b.numel() for b in before)


def _two_steps(model_dir, out, **kw):
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(model_dir, out, learning_rate=1e-6, max_steps=2, **VARIED, **kw)
    tr = GRPOTrainer(cfg)
    before = [p.detach().float().clone() for p in tr.model.parameters()]
    tr.train()
    return tr, before


def test_bf16_weights_update_every_element_like_float32(tmp_path, tiny_model_dir):
    f32, before32 = _two_steps(tiny_model_dir, tmp_path / "f32")
    assert not isinstance(f32.optimizer, MasterWeights)
    frac32 = _updated_fraction(before32, list(f32.model.parameters()))
    assert frac32 == 1.0

    bf, before16 = _two_steps(tiny_model_dir, tmp_path / "bf16", torch_dtype="bfloat16", bf16=True)
    opt = bf.optimizer
    assert isinstance(opt, MasterWeights)
    assert all(p.dtype == torch.bfloat16 for p in bf.model.parameters())
    assert all(m.dtype == torch.float32 for m in opt.master_params)
    assert _updated_fraction(before16, opt.master_params) == frac32
    # the model holds the masters rounded to nearest: at lr 1e-6 most bf16 values stay put
    for p, m in zip(bf.model.parameters(), opt.master_params):
        assert torch.equal(p, m.detach().to(torch.bfloat16))
    assert _updated_fraction(before16, list(bf.model.parameters())) < 0.2
    # the AdamW moments are fp32
    assert {s["exp_avg"].dtype for s in opt.state.values()} == {torch.float32}


def _rounded_model(src: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())  # bf16-representable starting weights
    return m.to(dtype)


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(model(ids).logits.float(), -1)
    return -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()


def test_one_step_master_weights_equal_float32_step(tiny_model_dir):
    """Same bf16-representable weights and the same (bf16-computed) gradients of two
    micro-batches: the bf16 model's fp32 masters after clipping and one AdamW step equal an
    fp32 model's weights after the same, and the logged norm is the same number."""
    cfg = build_config(dict(model_name_or_path=tiny_model_dir, learning_rate=1e-3))
    torch.manual_seed(0)
    batches = [torch.randint(0, 300, (2, 12)) for _ in range(2)]

    m16 = _rounded_model(tiny_model_dir, torch.bfloat16)
    opt16 = build_optimizer(list(m16.parameters()), cfg)
    assert isinstance(opt16, MasterWeights)
    for ids in batches:
        _loss(m16, ids).backward()  # hooks move each gradient into the fp32 masters
    assert all(p.grad is None for p in m16.parameters())
    clip16 = params_to_clip(opt16, list(m16.parameters()))
    norm16 = torch.nn.utils.clip_grad_norm_(clip16, 0.1)
    opt16.step()

    # independent: the same per-micro-batch bf16 gradients, summed in fp32 by hand
    ref = _rounded_model(tiny_model_dir, torch.bfloat16)
    grads = [torch.zeros(p.shape) for p in ref.parameters()]
    for ids in batches:
        for g, gi in zip(grads, torch.autograd.grad(_loss(ref, ids), list(ref.parameters()))):
            g += gi.float()
    m32 = _rounded_model(tiny_model_dir, torch.float32)
    for p, g in zip(m32.parameters(), grads):
        p.grad = g
    opt32 = build_optimizer(list(m32.parameters()), cfg)
    norm32 = torch.nn.utils.clip_grad_norm_(list(m32.parameters()), 0.1)
    opt32.step()

    assert norm16.dtype == torch.float32
    torch.testing.assert_close(norm16, norm32, rtol=1e-6, atol=0)
    assert norm32 > 0.1  # clipping was active
    for m, p32, p16 in zip(opt16.master_params, m32.parameters(), m16.parameters()):
        torch.testing.assert_close(m.detach(), p32.detach(), rtol=1.3e-6, atol=1e-9)
        assert torch.equal(p16, p32.detach().to(torch.bfloat16))


def test_bf16_lora_adapters(tmp_path, tiny_model_dir):
    """peft keeps LoRA adapters fp32 over a bf16 base (autocast_adapter_dtype): no copies
    needed; bf16 adapters (autocast_adapter_dtype=False) get fp32 masters."""
    from peft import LoraConfig, get_peft_model

    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(
        tiny_model_dir, tmp_path / "lora", torch_dtype="bfloat16", bf16=True, use_peft=True,
        lora_r=4, **VARIED,
    )  # fmt: skip
    tr = GRPOTrainer(cfg)
    trainable = [p for p in tr.model.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32}
    before = [p.detach().clone() for p in trainable]
    tr.train()
    assert not isinstance(tr.optimizer, MasterWeights)
    lora_b = [(b, p) for (n, p), b in zip(
        [(n, p) for n, p in tr.model.named_parameters() if p.requires_grad], before
    ) if "lora_B" in n]  # fmt: skip
    assert all(not torch.equal(b, p) for b, p in lora_b)

    base = _rounded_model(tiny_model_dir, torch.bfloat16)
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(base, lcfg, autocast_adapter_dtype=False)
    params = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in params} == {torch.bfloat16}
    opt = build_optimizer(params, tiny_run_config(tiny_model_dir, tmp_path / "x"))
    assert isinstance(opt, MasterWeights)
    _loss(model, torch.randint(0, 300, (2, 10))).backward()
    opt.step()
    for p, m in zip(params, opt.master_params):
        assert m.dtype == torch.float32 and torch.equal(p, m.detach().to(torch.bfloat16))


BASE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 64, "test_size": 8},
    **VARIED,
    gradient_accumulation_steps=2,
    learning_rate=1e-4,
    lr_scheduler_type="cosine",
    warmup_ratio=0.25,
    beta=0.04,
    max_steps=4,
    save_steps=2,
    max_eval_samples=0,
    seed=3,
    torch_dtype="bfloat16",
    bf16=True,
)


def test_bf16_stop_and_resume_is_identical(tmp_path, tiny_model_dir):
    """As tests/trainer/test_resume_exact.py, with bf16 weights: the checkpoint's master
    weights make the resumed run's masters, weights and metrics bit-identical."""
    from grpokit.trainer import GRPOTrainer

    def cfg(name):
        return build_config({**BASE, "model_name_or_path": tiny_model_dir, "output_dir": str(tmp_path / name)})  # fmt: skip

    ta = GRPOTrainer(cfg("a"))
    ta.train()
    tb = GRPOTrainer(cfg("b"))
    real_step = tb.optimizer_step

    def step_then_signal(batch):
        out = real_step(batch)
        if tb.step == 2:
            tb.request_stop()
        return out

    tb.optimizer_step = step_then_signal
    assert tb.train()["stopped"]
    saved = torch.load(tmp_path / "b" / "checkpoint-2" / "optimizer.pt", weights_only=False)
    assert {t.dtype for t in saved["master_weights"].values()} == {torch.float32}
    tc = GRPOTrainer(cfg("b"), resume=True)
    assert tc.step == 2
    for m, s in zip(tc.optimizer.master_params, tb.optimizer.master_params):
        assert torch.equal(m, s)  # restored from the checkpoint, not from the bf16 weights
    tc.train()

    def rows(name):
        return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    for ra, rb in zip(rows("a"), rows("b"), strict=True):
        for k in ("loss", "reward", "kl", "grad_norm", "learning_rate"):
            assert ra[k] == rb[k], (ra["step"], k, ra[k], rb[k])
    for ma, mc in zip(ta.optimizer.master_params, tc.optimizer.master_params):
        assert torch.equal(ma, mc)
    for pa, pc in zip(ta.model.parameters(), tc.model.parameters()):
        assert torch.equal(pa, pc)
    # the masters moved by more than the bf16 weights show
    assert any(
        not torch.equal(m, p.float())
        for m, p in zip(tc.optimizer.master_params, tc.model.parameters())
    )


def test_sharded_training_refuses_bf16_weights(tmp_path, tiny_model_dir):
    from grpokit import setup
    from grpokit.config import ConfigError
    from grpokit.launch import Launch, ShardedTraining

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "s", torch_dtype="bfloat16")
    from accelerate.state import AcceleratorState

    strategy = ShardedTraining(cfg, Launch("fsdp", fsdp_version=2))
    try:
        models = setup.build_models(cfg, torch.device("cpu"), strategy)
        with pytest.raises(ConfigError, match="fp32 master weights only without sharding"):
            setup.build_optimization(cfg, models, None, strategy, torch.device("cpu"), 2)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_old_checkpoint_without_masters_loads(tiny_model_dir):
    """An optimizer.pt written before master weights (a plain state dict over the bf16
    weights) still loads: the masters start from the model's weights."""
    cfg = build_config(dict(model_name_or_path=tiny_model_dir))
    m = _rounded_model(tiny_model_dir, torch.bfloat16)
    params = list(m.parameters())
    plain = torch.optim.AdamW(params, lr=1e-3)
    _loss(m, torch.randint(0, 300, (2, 8))).backward()
    plain.step()
    opt = build_optimizer(params, cfg)
    opt.load_state_dict(plain.state_dict())
    for p, master in zip(params, opt.master_params):
        assert torch.equal(master, p.float())
    assert {s["exp_avg"].dtype for s in opt.state.values()} == {torch.float32}
