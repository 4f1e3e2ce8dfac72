"""Evaluation during training (eval_steps) and report_to trackers logging the same rows as
metrics.jsonl (fake tracker modules stand in for the optional libraries)."""

import json
import sys
import types

from grpokit.testing import tiny_run_config


def test_eval_steps_logs_eval_rows(tmp_path, tiny_model_dir):
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path / "r",
        max_steps=3,
        eval_steps=1,
        max_eval_samples=2,
        per_device_eval_batch_size=2,
    )
    GRPOTrainer(cfg).train()
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [1, 2]  # the last step is evaluated as "after"
    assert (tmp_path / "r" / "eval_step-1.json").exists() and (
        tmp_path / "r" / "eval_after.json"
    ).exists()


def test_wandb_tracker_gets_the_metrics_rows(tmp_path, tiny_model_dir, monkeypatch):
    calls = {"init": [], "log": [], "finish": 0}

    class Run:
        def log(self, row, step):
            calls["log"].append((step, row))

        def finish(self):
            calls["finish"] += 1

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls["init"].append(kw) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "w", report_to="wandb")
    GRPOTrainer(cfg).train()
    rows = [json.loads(x) for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    assert len(calls["init"]) == 1 and calls["finish"] == 1
    assert [s for s, _ in calls["log"]] == [r["step"] for r in rows]
    for (_, logged), row in zip(calls["log"], rows):
        assert logged == {k: v for k, v in row.items() if k != "step" and v is not None}
