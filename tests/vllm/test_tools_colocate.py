"""Multi-turn rollouts with vLLM colocated (docs/tools.md): a turn stops at a stop string
where grpokit's decode loop stops, with vLLM's log-probs of its tokens equal to the
trainer's; a run with tools trains, the log-probs aligned through the tool turns."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here; run ./run test-vllm")


def test_multi_turn_colocate(vllm_tiny_dir, tmp_path):
    from transformers import AutoConfig

    # the tool description makes prompts longer than the tiny model's 512 positions
    cfg = AutoConfig.from_pretrained(vllm_tiny_dir)
    model = tmp_path / "model"
    import shutil

    shutil.copytree(vllm_tiny_dir, model)
    cfg.max_position_embeddings = 2048
    cfg.save_pretrained(model)
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(Path(__file__).parents[2]))
    worker = Path(__file__).parent / "_tools_worker.py"
    r = subprocess.run(
        [sys.executable, str(worker), str(model), str(tmp_path / "run")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert res["vllm_how"] == "stop"
    assert res["vllm_ids"] == res["free"][: res["first"]]  # where grpokit's loop would stop
    assert res["n_logps"] == len(res["vllm_ids"]) and res["logp_diff"] < 1e-3
    rows = res["metrics"]
    assert len(rows) == 2
    for x in rows:
        assert "tools/call_frequency" in x and x["loss"] == x["loss"]
        assert x["sampling/sampling_logp_difference/mean"] < 1e-3, x  # fp32 vLLM vs fp32 trainer
