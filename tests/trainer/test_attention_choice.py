"""attn_implementation in a training run: eager attention (transformers' own, outside
grpokit's CPU attention route) and sdpa with the route (attention_backward, float32 routed
too) train to the same logged numbers."""

import json
from pathlib import Path

import pytest

from grpokit.testing import tiny_run_config


def _run(tiny_model_dir, out, **kw):
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(tiny_model_dir, out, max_steps=2, temperature=1.0, **kw)
    trainer = GRPOTrainer(cfg)
    kernel = trainer.model.config._attn_implementation
    trainer.train()
    rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return kernel, rows


def test_eager_and_routed_sdpa_train_alike(tmp_path, tiny_model_dir, monkeypatch):
    from grpokit.speed import attention

    monkeypatch.setattr(attention, "FLOAT32_TOO", True)  # the route runs in float32 too
    k1, sdpa = _run(tiny_model_dir, tmp_path / "sdpa", attn_implementation="sdpa")
    k2, eager = _run(tiny_model_dir, tmp_path / "eager", attn_implementation="eager")
    assert (k1, k2) == ("sdpa", "eager")
    for a, b in zip(sdpa, eager):
        for key in ("loss", "grad_norm", "reward", "completions/mean_length"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
