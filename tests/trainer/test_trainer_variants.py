"""Trainer paths on the tiny model: loss variants, LoRA reference, μ > 1, invariances."""

import json
import math
from pathlib import Path

import pytest
import torch

from grpokit.config import build_config

BASE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 64, "test_size": 8},
    num_generations=4,
    per_device_train_batch_size=8,
    gradient_accumulation_steps=1,
    max_completion_length=8,
    learning_rate=1e-3,
    max_steps=2,
    save_steps=0,
    max_eval_samples=0,
    seed=1,
)


def _run(tmp_path, model_dir, name, **kw):
    from grpokit.trainer import GRPOTrainer

    cfg = build_config(
        {**BASE, "model_name_or_path": model_dir, "output_dir": str(tmp_path / name), **kw}
    )
    tr = GRPOTrainer(cfg)
    tr.train()
    rows = [
        json.loads(x) for x in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    return tr, rows


@pytest.mark.parametrize(
    "kw",
    [
        {"loss_type": "grpo"},
        {"loss_type": "bnpo"},
        {"loss_type": "dr_grpo", "scale_rewards": "none"},
        {"loss_type": "dapo", "epsilon_high": 0.28},
        {"importance_sampling_level": "sequence", "loss_type": "grpo"},
        {"num_iterations": 2, "max_steps": 4},
        {
            "beta": 0.1,
            "sync_ref_model": True,
            "ref_model_sync_steps": 1,
            "ref_model_mixup_alpha": 0.5,
        },
        {"gradient_checkpointing": True},
        {"mask_truncated_completions": True},
        {"scale_rewards": "batch", "lr_scheduler_type": "cosine_with_min_lr", "warmup_ratio": 0.5},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_variants_run_and_log_finite(tmp_path, tiny_model_dir, kw):
    tr, rows = _run(tmp_path, tiny_model_dir, "v", **kw)
    assert len(rows) == tr.cfg.max_steps
    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])


def test_lora_reference_is_base_and_kl_grows(tmp_path, tiny_model_dir):
    tr, rows = _run(
        tmp_path,
        tiny_model_dir,
        "lora",
        use_peft=True,
        lora_r=4,
        lora_alpha=8,
        beta=0.1,
        learning_rate=5e-2,
        max_steps=3,
    )
    assert tr.ref_model is None  # no second copy: the adapter-disabled base is the reference
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # LoRA B starts at zero
    assert rows[-1]["kl"] > 0.0
    trainable = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_num_iterations_uses_old_logps(tmp_path, tiny_model_dir):
    _, rows = _run(
        tmp_path, tiny_model_dir, "mu", num_iterations=2, max_steps=2, learning_rate=5e-2
    )
    # the second update of a batch is off-policy: its ratio is no longer 1, so clipping can act
    assert rows[0]["reward"] == rows[1]["reward"]  # same generation batch, logged twice
    assert rows[0]["clip_ratio/region_mean"] == 0.0


def test_micro_batch_times_accumulation_invariance(tmp_path, tiny_model_dir):
    """8 x 1 and 2 x 4 (micro-batch x accumulation) give the same losses and weights."""
    ta, ra = _run(
        tmp_path,
        tiny_model_dir,
        "a",
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        beta=0.04,
    )
    tb, rb = _run(
        tmp_path,
        tiny_model_dir,
        "b",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        beta=0.04,
    )
    for x, y in zip(ra, rb):
        assert x["reward"] == y["reward"]
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6)
    for (n, pa), (_, pb) in zip(ta.model.named_parameters(), tb.model.named_parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-5, rtol=1e-4, msg=n)


def test_nonfinite_steps_are_skipped_dumped_and_stop_the_run(tmp_path, tiny_model_dir):
    from grpokit.trainer import GRPOTrainer

    cfg = build_config(
        {
            **BASE,
            "model_name_or_path": tiny_model_dir,
            "output_dir": str(tmp_path / "nan"),
            "max_steps": 5,
            "max_nonfinite_skips": 2,
        }
    )
    tr = GRPOTrainer(cfg)
    real = tr.logprobs

    def poisoned(model, ro, rows, with_entropy=False):
        logp, ent = real(model, ro, rows, with_entropy)
        return logp * float("nan"), ent

    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.opt.gradients.logprobs = poisoned
    with pytest.raises(FloatingPointError, match="2 consecutive steps.*nonfinite-step-2.pt"):
        tr.train()
    assert (tmp_path / "nan" / "nonfinite-step-1.pt").exists()
    dump = torch.load(tmp_path / "nan" / "nonfinite-step-2.pt", weights_only=False)
    assert len(dump["texts"]) == 8
    for n, p in tr.model.named_parameters():  # no update was applied
        assert torch.equal(p, before[n]), n
    rows = [json.loads(x) for x in (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loss"] is None and rows[0]["skipped_steps"] == 1


def test_old_logps_are_the_first_steps_own(tmp_path, tiny_model_dir):
    """With num_iterations > 1 the round's first optimizer step records its log-probs as the
    old log-probs: they equal a separate no-grad pass over the policy before the update."""
    from grpokit.testing import tiny_run_config
    from grpokit.trainer import GRPOTrainer

    tr = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "r", num_iterations=2))
    batch, _, _ = tr.collect_round()
    assert batch.old_logp is None
    with torch.no_grad():
        expected = tr.logprobs.no_grad(tr.model, batch.rollout, tr.opt.plan(batch.rollout))
    tr.optimizer_step(batch)
    mask = batch.rollout.completion_mask.bool()
    assert batch.old_logp is not None and mask.any()
    torch.testing.assert_close(batch.old_logp[mask], expected[mask], atol=1e-5, rtol=0)
    kept = batch.old_logp.clone()
    m = tr.optimizer_step(batch)  # the second step uses them; they are not overwritten
    assert torch.equal(batch.old_logp, kept) and m["loss"] == m["loss"]
