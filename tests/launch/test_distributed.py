"""Two gloo ranks on CPU match one process with the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


def _rows(out):
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_match_one_process(tmp_path, tiny_model_dir, one_process_run):
    from safetensors.torch import load_file

    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "OMP_NUM_THREADS": "1"}
    one = one_process_run
    two = tmp_path / "two"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29517",
            str(HERE / "_dist_worker.py"),
            tiny_model_dir,
            str(two),
            "4",
        ],
        check=True,
        env=env,
        timeout=300,
    )
    a, b = _rows(one), _rows(two)
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        for k in ("reward", "reward_std", "completions/mean_length", "kl"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), k
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-4, abs=1e-6)
    wa = load_file(str(one / "final" / "model.safetensors"))
    wb = load_file(str(two / "final" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-4, msg=k)


def test_torchrun_cli_two_ranks_checkpoint_and_resume(tmp_path, tiny_model_dir):
    """`torchrun -m grpokit train recipe.yaml` with the real sampler: rank 0 alone writes the
    log, checkpoints and final model; the run resumes from its checkpoint with the same world
    size and continues the step count."""
    import yaml

    recipe = tmp_path / "r.yaml"
    out = tmp_path / "run"
    recipe.write_text(
        yaml.safe_dump(
            dict(
                task="arithmetic",
                task_params={"digits": 1, "train_size": 32, "test_size": 4},
                model_name_or_path=tiny_model_dir,
                output_dir=str(out),
                num_generations=2,
                per_device_train_batch_size=2,
                max_completion_length=4,
                max_steps=2,
                save_steps=1,
                max_eval_samples=0,
                beta=0.04,
                write_report=False,
            )
        )
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def torchrun(*extra, port):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        cmd += ["--master_port", str(port), "-m", "grpokit", "train", str(recipe), *extra]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return p

    torchrun(port=29531)
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]  # one writer: no duplicated lines
    assert all(r["completions/mean_length"] > 0 for r in rows)
    assert (out / "checkpoint-2").is_dir() and (out / "final" / "model.safetensors").is_file()
    torchrun("--resume", "--max_steps", "3", port=29532)
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]
