"""SIGKILL a training process at several points, resume, and compare with an uninterrupted
run: the metrics log and the final weights are identical."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

RECIPE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 64, "test_size": 4},
    num_generations=4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    max_completion_length=6,
    learning_rate=1e-3,
    beta=0.04,
    max_steps=4,
    save_steps=1,
    max_eval_samples=0,
    seed=11,
)


def _train(recipe, out, *extra, fault=None):
    env = {k: v for k, v in os.environ.items() if k != "GRPOKIT_FAULT"}
    if fault:
        env["GRPOKIT_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "grpokit", "train", str(recipe), "--output_dir", str(out), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _metrics(out):
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir):
    d = tmp_path_factory.mktemp("crash")
    recipe = d / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "model_name_or_path": tiny_model_dir}))
    r = _train(recipe, d / "ref")
    assert r.returncode == 0, r.stderr[-2000:]
    return recipe, d / "ref"


@pytest.mark.parametrize("fault", ["generation@3", "backward@2", "checkpoint@2", "checkpoint@3"])
def test_kill_and_resume_is_identical(tmp_path, reference, fault):
    from safetensors.torch import load_file

    recipe, ref = reference
    out = tmp_path / "run"
    r = _train(recipe, out, fault=fault)
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])  # SIGKILLed
    assert not (out / "final").exists()
    r = _train(recipe, out, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    keys = ("loss", "reward", "kl", "grad_norm", "learning_rate", "completions/mean_length")
    a, b = _metrics(ref), _metrics(out)
    assert [x["step"] for x in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert {k: ra[k] for k in keys} == {k: rb[k] for k in keys}
    wa, wb = (
        load_file(str(ref / "final" / "model.safetensors")),
        load_file(str(out / "final" / "model.safetensors")),
    )
    assert all((wa[k] == wb[k]).all() for k in wa)


def test_ctrl_c_saves_a_checkpoint_and_resume_continues(tmp_path, tiny_model_dir):
    import signal
    import time

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {**RECIPE, "model_name_or_path": tiny_model_dir, "max_steps": 400, "save_steps": 0}
        )
    )
    out = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, "-m", "grpokit", "train", str(recipe), "--output_dir", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not (
        (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()
    ):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    text, _ = p.communicate(timeout=120)
    assert p.returncode == 130, text[-2000:]
    assert "--resume" in text
    ckpts = sorted(out.glob("checkpoint-*"))
    assert len(ckpts) == 1 and (ckpts[0] / "trainer_state.json").exists()
    stopped_at = int(ckpts[0].name.split("-")[1])
    r = _train(recipe, out, "--resume", "--max_steps", str(stopped_at + 1))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [x["step"] for x in _metrics(out)] == list(range(1, stopped_at + 2))
