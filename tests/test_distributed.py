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


def test_two_ranks_match_one_process(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    one = tmp_path / "one"
    subprocess.run(
        [sys.executable, str(HERE / "_dist_worker.py"), tiny_model_dir, str(one), "8"],
        check=True,
        env=env,
        timeout=300,
    )
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
