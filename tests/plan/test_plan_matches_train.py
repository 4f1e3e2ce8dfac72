"""``grpokit plan`` refuses exactly what ``grpokit train`` refuses before its first step: for
each case, plan's verdict for a launch (``--accelerate_config`` / ``--num_processes``) is
compared with train's real verdict under that launch (its environment in this process when
train refuses before any collective; a real 2-process torchrun when it accepts)."""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpokit.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "recipes" / "accelerate"
BASE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 32, "test_size": 4},
    num_generations=2,
    per_device_train_batch_size=4,
    max_completion_length=4,
    max_prompt_length=64,
    learning_rate=1e-3,
    max_steps=1,
    save_steps=0,
    max_eval_samples=0,
    report_to="none",
    write_report=False,
    torch_num_threads=1,
    seed=0,
)


def _env_of(accelerate_config: str | None, nproc: int) -> dict[str, str]:
    """The environment ``accelerate launch --config_file X`` gives each process."""
    env = {"WORLD_SIZE": str(nproc), "RANK": "0", "LOCAL_RANK": "0"}
    if accelerate_config and "deepspeed" in accelerate_config:
        stage = "3" if "zero3" in accelerate_config else "2"
        env.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE=stage)
    return env


# (id, recipe overrides, accelerate config or None, processes)
CASES = [
    ("one-process", {}, None, 1),
    ("vllm-two-processes", {"use_vllm": True, "vllm_mode": "colocate"}, "cpu_2proc.yaml", 2),
    ("prompts-do-not-split", {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 3},
     None, 2),
    ("too-few-rows", {"task_params": {"digits": 1, "train_size": 3, "test_size": 4}}, None, 1),
    ("group-does-not-divide", {"per_device_train_batch_size": 3}, None, 1),
    ("lora-zero3", {"use_peft": True}, "deepspeed_zero3.yaml", 8),
    ("sync-ref-zero3", {"beta": 0.1, "sync_ref_model": True}, "deepspeed_zero3.yaml", 8),
    ("data-parallel-two-processes", {}, "cpu_2proc.yaml", 2),
]  # fmt: skip


def _plan_verdict(recipe: Path, accelerate_config, nproc: int) -> int:
    opts = ["--accelerate_config", str(CONFIGS / accelerate_config)] if accelerate_config else []
    if nproc > 1 and not accelerate_config:
        opts += ["--num_processes", str(nproc)]
    return main(["plan", str(recipe), *opts])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_verdict(recipe: Path, accelerate_config, nproc: int, out: Path, monkeypatch) -> int:
    """grpokit train's exit code under the launch: in this process for one process and for
    a GPU launch config (this machine has no GPU, so those must stop before any collective),
    a real torchrun of ``nproc`` CPU processes for data parallel."""
    args = ["train", str(recipe), "--output_dir", str(out)]
    if nproc == 1 or accelerate_config not in (None, "cpu_2proc.yaml"):
        with monkeypatch.context() as m:
            for k, v in (_env_of(accelerate_config, nproc) if nproc > 1 else {}).items():
                m.setenv(k, v)
            try:
                return main(args)
            except ValueError:
                return 2  # a refusal that is not a config error (e.g. too few training rows)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_port", str(_free_port()), "-m", "grpokit", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, timeout=600, capture_output=True).returncode


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan_refuses_what_train_refuses(case, tiny_model_dir, tmp_path, monkeypatch, capsys):
    name, overrides, accelerate_config, nproc = case
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**BASE, "model_name_or_path": tiny_model_dir, **overrides}))
    plan = _plan_verdict(recipe, accelerate_config, nproc)
    plan_out, plan_err = capsys.readouterr()
    train = _train_verdict(recipe, accelerate_config, nproc, tmp_path / "run", monkeypatch)
    train_err = capsys.readouterr().err
    if overrides.get("use_vllm") and importlib.util.find_spec("vllm") is None:
        # two processes with vLLM are a layout training accepts (tests/vllm/test_multiprocess.py
        # runs it in .venv-vllm); here vllm is missing: plan, which plans for where training
        # runs, accepts it with a note, and training refuses at start for the package alone
        assert plan == 0 and "vllm is not installed" in plan_out, (plan_out, plan_err)
        assert train != 0
        return
    assert (plan == 0) == (train == 0), f"{name}: plan {plan} ({plan_err.strip()}), train {train}"
    if plan:
        assert "Traceback" not in plan_err
        # the reason plan gives is one train gives too (train on this GPU-less machine may
        # add that it has no GPU)
        reason = plan_err.strip().splitlines()[-1].strip(" -")
        assert not train_err or reason.split(": ", 1)[-1] in train_err, (plan_err, train_err)
