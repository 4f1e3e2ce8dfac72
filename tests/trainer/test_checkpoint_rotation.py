"""save_total_limit keeps the newest complete checkpoints, and resume never picks a
half-written one (a leftover temporary directory or a directory without its state file)."""

import json

from grpokit.checkpoint import latest_checkpoint, list_checkpoints
from grpokit.testing import tiny_run_config


def test_rotation_keeps_the_newest_and_ignores_partial_ones(tmp_path, tiny_model_dir):
    from grpokit.trainer import GRPOTrainer

    out = tmp_path / "run"
    # debris a crash can leave: a temporary directory and a checkpoint without its state
    (out / ".checkpoint-9.tmp").mkdir(parents=True)
    (out / "checkpoint-8").mkdir()
    (out / "checkpoint-8" / "model.safetensors").write_bytes(b"half")
    cfg = tiny_run_config(tiny_model_dir, out, max_steps=4, save_steps=1, save_total_limit=2)
    GRPOTrainer(cfg).train()
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-3", "checkpoint-4"]
    assert latest_checkpoint(out).name == "checkpoint-4"
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    # the incomplete directories were never counted as checkpoints (nor deleted as such)
    assert (out / "checkpoint-8").is_dir() and not (
        out / "checkpoint-8" / "trainer_state.json"
    ).exists()
    assert not (out / "checkpoint-1").exists() and not (out / "checkpoint-2").exists()
