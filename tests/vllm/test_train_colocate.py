"""A few GRPO steps with use_vllm: true (colocate) through the CLI, as a user runs it."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here; run ./run test-vllm")


@pytest.mark.parametrize("use_peft", [False, True])
def test_grpo_steps_colocate(vllm_tiny_dir, tmp_path, use_peft):
    from grpokit.config import save_config
    from grpokit.testing import tiny_run_config

    cfg = tiny_run_config(
        vllm_tiny_dir,
        tmp_path / "run",
        use_vllm=True,
        max_steps=3,
        max_completion_length=8,
        learning_rate=1e-2,
        use_peft=use_peft,
        lora_r=4,
        lora_dropout=0.0,  # dropout in the trainer's forward would show up as mismatch
        write_report=False,
        vllm_importance_sampling_clip_max=3.0,
    )
    recipe = tmp_path / "recipe.yaml"
    save_config(cfg, recipe)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    r = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", str(recipe)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [x for x in rows if "loss" in x]
    assert len(rows) == 3
    for x in rows:
        assert x["sampling/sampling_logp_difference/mean"] < 1e-3, x  # fp32 vLLM vs fp32 trainer
        assert 0.99 < x["sampling/importance_sampling_ratio/mean"] < 1.01
        assert x["time/weight_sync"] > 0
    assert (tmp_path / "run" / "final").exists() or any((tmp_path / "run").iterdir())
