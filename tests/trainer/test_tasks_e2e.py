"""Every built-in task runs a few GRPO steps end to end on the tiny model."""

import json

import pytest

from grpokit.config import build_config


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _task_overrides(name, tmp_path):
    if name == "gsm8k":
        return {}
    if name == "arithmetic":
        return {"task_params": {"digits": 1, "test_size": 8, "train_size": 32}}
    if name == "countdown":
        return {"task_params": {"train_size": 16, "test_size": 4}}
    if name == "math":
        rows = [{"problem": f"What is {i} + {i}?", "solution": f"${2 * i}$"} for i in range(12)]
        return {
            "dataset_name": _write(tmp_path / "math.jsonl", rows),
            "task_params": {"test_size": 4},
        }
    if name == "tldr":
        rows = [{"prompt": f"POST: story number {i} about a cat. TL;DR:"} for i in range(12)]
        return {
            "dataset_name": _write(tmp_path / "tldr.jsonl", rows),
            "task_params": {"test_size": 4},
        }
    if name == "custom":
        rows = [{"q": f"Say {i}.", "answer": str(i)} for i in range(12)]
        return {
            "dataset_name": _write(tmp_path / "c.jsonl", rows),
            "task_params": {"prompt_column": "q", "answer_column": "answer", "test_size": 4},
        }
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["gsm8k", "arithmetic", "countdown", "math", "tldr", "custom"])
def test_task_trains_two_steps(tmp_path, tiny_model_dir, name):
    from grpokit.trainer import GRPOTrainer

    values = dict(
        task=name,
        model_name_or_path=tiny_model_dir,
        output_dir=str(tmp_path / "run"),
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=6,
        max_prompt_length=96,
        learning_rate=1e-3,
        max_steps=2,
        save_steps=0,
        max_eval_samples=2,
        per_device_eval_batch_size=2,
        seed=0,
        **_task_overrides(name, tmp_path),
    )
    tr = GRPOTrainer(build_config(values))
    res = tr.train()
    assert res["step"] == 2 and "after" in res
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    reward_keys = [k for k in rows[0] if k.startswith("rewards/") and k.endswith("/mean")]
    assert reward_keys, rows[0]
