"""A run stopped by a signal and resumed gives the same metrics and weights as one that
was never interrupted (CPU, same seed)."""

import json
from pathlib import Path

import torch

from grpokit.config import build_config

BASE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 64, "test_size": 8},
    num_generations=4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    max_completion_length=8,
    learning_rate=1e-3,
    lr_scheduler_type="cosine",
    warmup_ratio=0.25,
    beta=0.04,
    num_iterations=2,
    max_steps=6,
    save_steps=2,
    max_eval_samples=0,
    seed=3,
)


def _rows(out):
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_stop_and_resume_is_identical(tmp_path, tiny_model_dir):
    from grpokit.trainer import GRPOTrainer

    full = build_config(
        {**BASE, "model_name_or_path": tiny_model_dir, "output_dir": str(tmp_path / "a")}
    )
    ta = GRPOTrainer(full)
    ta.train()

    cfg = build_config(
        {**BASE, "model_name_or_path": tiny_model_dir, "output_dir": str(tmp_path / "b")}
    )
    tb = GRPOTrainer(cfg)
    real_step = tb.optimizer_step

    def step_then_signal(batch):
        out = real_step(batch)
        if tb.step == 2:
            tb.request_stop()  # what the SIGINT/SIGTERM handler does
        return out

    tb.optimizer_step = step_then_signal
    res = tb.train()
    assert res["stopped"] and res["step"] == 2
    assert (tmp_path / "b" / "checkpoint-2" / "trainer_state.json").exists()

    tc = GRPOTrainer(cfg, resume=True)
    assert tc.step == 2
    tc.train()

    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    keys = ("loss", "reward", "kl", "grad_norm", "learning_rate", "completions/mean_length")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(a, b):
        for k in keys:
            assert ra[k] == rb[k], (ra["step"], k, ra[k], rb[k])
    for (n, pa), (_, pc) in zip(ta.model.named_parameters(), tc.model.named_parameters()):
        assert torch.equal(pa, pc), n
