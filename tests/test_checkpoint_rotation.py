"""save_total_limit keeps the newest complete checkpoints, and resume never picks a
half-written one (a leftover temporary directory or a directory without its state file)."""

import json

from grpokit.checkpoint import latest_checkpoint, list_checkpoints
from grpokit.config import build_config


def test_rotation_keeps_the_newest_and_ignores_partial_ones(tmp_path, tiny_model_dir):
    from grpokit.trainer import GRPOTrainer

    out = tmp_path / "run"
    # debris a crash can leave: a temporary directory and a checkpoint without its state
    (out / ".checkpoint-9.tmp").mkdir(parents=True)
    (out / "checkpoint-8").mkdir()
    (out / "checkpoint-8" / "model.safetensors").write_bytes(b"half")
    cfg = build_config(
        dict(
            task="arithmetic",
            task_params={"digits": 1, "train_size": 32, "test_size": 4},
            num_generations=2,
            per_device_train_batch_size=4,
            max_completion_length=4,
            learning_rate=1e-3,
            max_steps=4,
            save_steps=1,
            save_total_limit=2,
            max_eval_samples=0,
            seed=0,
            model_name_or_path=tiny_model_dir,
            output_dir=str(out),
        )
    )
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
