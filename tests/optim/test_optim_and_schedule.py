"""``optim`` (transformers' optimizer names) and ``lr_scheduler_kwargs``: what runs, what is
refused with a one-line error, and that the schedules follow transformers' formulas."""

import sys

import pytest
import torch

from grpokit.config import OPTIMS, ConfigError, build_config
from grpokit.optim import MasterWeights, build_optimizer, build_scheduler
from grpokit.testing import tiny_run_config


def _cfg(**kw):
    return build_config({"model_name_or_path": "x", **kw})


# ------------------------------------------------------------------ config errors
def test_unknown_optim_lists_the_accepted_ones():
    with pytest.raises(ConfigError) as e:
        _cfg(optim="adamw_magic")
    msg = str(e.value)
    assert "\n" not in msg and "adamw_magic" in msg
    assert all(name in msg for name in OPTIMS)


def test_torchao_names_point_to_bitsandbytes():
    with pytest.raises(ConfigError, match="use adamw_8bit"):
        _cfg(optim="adamw_torch_8bit")


def test_default_optim_is_transformers_default():
    from transformers import TrainingArguments

    assert _cfg().optim == TrainingArguments("/tmp/x").optim == "adamw_torch_fused"


@pytest.mark.parametrize(
    "kind,kw,accepted",
    [
        ("linear", {"min_lr_rate": 0.1}, "none"),
        ("cosine", {"min_lr_rate": 0.1}, "['num_cycles']"),
        ("cosine_with_min_lr", {"min_lr_ratio": 0.1}, "['num_cycles', 'min_lr', 'min_lr_rate']"),
        ("constant_with_warmup", {"num_cycles": 1}, "none"),
    ],
)
def test_unused_scheduler_kwargs_are_errors(kind, kw, accepted):
    with pytest.raises(ConfigError) as e:
        _cfg(lr_scheduler_type=kind, lr_scheduler_kwargs=kw)
    msg = str(e.value)
    assert "\n" not in msg and list(kw)[0] in msg and accepted in msg and kind in msg


def test_min_lr_and_min_lr_rate_together_are_an_error():
    with pytest.raises(ConfigError, match="one of min_lr and min_lr_rate"):
        _cfg(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": 1e-7, "min_lr_rate": 0.1})  # fmt: skip


# ------------------------------------------------------------------ schedules
def _factors(sched, n):
    out = []
    for _ in range(n):
        out.append(sched.get_last_lr()[0])
        sched.optimizer.step()
        sched.step()
    return out


@pytest.mark.parametrize(
    "kind,kw,hf",
    [
        ("cosine", {"num_cycles": 1.5}, {"num_cycles": 1.5}),
        ("cosine", {}, {}),
        ("cosine_with_min_lr", {"num_cycles": 0.25, "min_lr": 2e-4}, None),
        ("cosine_with_min_lr", {"min_lr_rate": 0.3}, None),
        ("cosine_with_min_lr", {}, {"min_lr_rate": 0.1}),  # grpokit's default rate
        ("linear", {}, {}),
    ],
)
def test_schedules_follow_transformers(kind, kw, hf):
    """Without warm-up (grpokit's warm-up ramp is its own), grpokit's learning rates equal
    transformers' get_scheduler with the same kwargs, step by step."""
    from transformers import get_scheduler

    lr, n = 1e-3, 20
    cfg = _cfg(learning_rate=lr, lr_scheduler_type=kind, lr_scheduler_kwargs=kw)
    ours = build_scheduler(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr), cfg, n)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    theirs = get_scheduler(kind, opt, 0, n, scheduler_specific_kwargs=kw if hf is None else hf)
    assert _factors(ours, n) == pytest.approx(_factors(theirs, n), rel=1e-12, abs=1e-15)


# ------------------------------------------------------------------ optimizers
def test_adamw_torch_and_fused_take_the_same_step(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    results = {}
    for optim in ("adamw_torch", "adamw_torch_fused"):
        m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        opt = build_optimizer(list(m.parameters()), _cfg(optim=optim, learning_rate=1e-3))
        assert bool(opt.defaults["fused"]) == (optim == "adamw_torch_fused")
        torch.manual_seed(0)
        m(torch.randint(0, 300, (2, 8))).logits.float().logsumexp(-1).sum().backward()
        opt.step()
        results[optim] = [p.detach().clone() for p in m.parameters()]
    for a, b in zip(results["adamw_torch"], results["adamw_torch_fused"]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_8bit_needs_bitsandbytes_named_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import raises ImportError
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ConfigError) as e:
        build_optimizer([p], _cfg(optim="adamw_8bit"))
    assert "\n" not in str(e.value) and "pip install" in str(e.value)


@pytest.mark.parametrize("optim", ["adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit"])
def test_8bit_adamw_state_is_8bit_and_steps_like_adamw(optim):
    pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    w0 = torch.randn(128, 64) * 0.02
    g = torch.randn(128, 64)
    cfg = _cfg(optim=optim, learning_rate=1e-3)
    p8, p32 = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    opt8 = build_optimizer([p8], cfg)
    opt32 = build_optimizer([p32], _cfg(learning_rate=1e-3))
    for step in range(3):
        p8.grad, p32.grad = g * (step + 1), g * (step + 1)
        opt8.step()
        opt32.step()
    st = opt8.state[p8]
    assert st["state1"].dtype == st["state2"].dtype == torch.uint8
    assert st["state1"].shape == p8.shape
    # quantised moments: the update follows AdamW's (3 steps of ~lr each) closely for almost
    # every element; blockwise quantisation of small second moments misses a few by ~lr
    diff = (p8.detach() - p32.detach()).abs()
    assert (diff < 0.05 * 1e-3).float().mean() > 0.95
    assert diff.mean() < 0.05 * 1e-3 and diff.max() < 3 * 1e-3
    assert not torch.equal(p8.detach(), w0)


def test_8bit_training_runs_with_bf16_master_weights(tmp_path, tiny_model_dir):
    pytest.importorskip("bitsandbytes")
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(
        tiny_model_dir, tmp_path / "r", optim="adamw_8bit", torch_dtype="bfloat16", bf16=True,
        reward_funcs=[{"length_target": {"target_length": 12}}], num_generations=4,
        per_device_train_batch_size=8, max_completion_length=8, save_steps=2,
    )  # fmt: skip
    tr = GRPOTrainer(cfg)
    before = [p.detach().float().clone() for p in tr.model.parameters()]
    tr.train()
    opt = tr.optimizer
    assert isinstance(opt, MasterWeights)
    assert type(opt.optimizer).__name__ == "AdamW8bit"
    # the embedding (>= 4096 elements) has 8-bit states; bitsandbytes keeps small ones fp32
    emb = opt.master_params[0]
    assert emb.numel() >= 4096 and opt.state[emb]["state1"].dtype == torch.uint8
    assert all(not torch.equal(b, m.detach()) for b, m in zip(before, opt.master_params))
    # the checkpoint resumes into an 8-bit optimizer
    tr2 = GRPOTrainer(cfg, resume=True)
    assert torch.equal(tr2.optimizer.state[tr2.optimizer.master_params[0]]["state1"], opt.state[emb]["state1"])  # fmt: skip


def test_resume_refuses_a_different_optimizer_kind(tmp_path):
    from pathlib import Path

    from grpokit.checkpoint import check_resume_config

    saved = _cfg(optim="adamw_8bit").to_dict()
    check_resume_config(saved, _cfg(optim="paged_adamw_8bit"), Path("ckpt"))
    with pytest.raises(ValueError, match="optim: 'adamw_8bit' -> 'adamw_torch_fused'"):
        check_resume_config(saved, _cfg(), Path("ckpt"))
    before_optim = {k: v for k, v in _cfg().to_dict().items() if k != "optim"}
    check_resume_config(before_optim, _cfg(optim="adamw_torch"), Path("ckpt"))
