"""The watchdog on collectives: two gloo training processes, one of them killed or frozen
mid-run; the survivor ends within ddp_timeout with one line naming the failed side and how
to resume, and the last complete checkpoint stays loadable.

The processes are started directly with the environment torchrun gives them (RANK,
WORLD_SIZE, MASTER_ADDR, ...): torchrun itself would end the survivor as soon as one
worker dies, which would hide what grpokit does on its own (as on a multi-node launch)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpokit.testing import finish_processes, wait_for

ROOT = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(recipe: Path, extra_env: dict[int, dict], n: int = 2) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for r in range(n):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "RANK": str(r),
            "LOCAL_RANK": str(r),
            "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            **extra_env.get(r, {}),
        }
        cmd = [sys.executable, "-m", "grpokit", "train", str(recipe)]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return procs


def write_recipe(tmp_path, model_dir, **over) -> tuple[Path, Path]:
    out = tmp_path / "run"
    values = dict(
        task="arithmetic",
        task_params={"digits": 1, "train_size": 64, "test_size": 4},
        model_name_or_path=model_dir,
        output_dir=str(out),
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=4,
        max_steps=40,
        save_steps=1,
        save_total_limit=2,
        max_eval_samples=0,
        write_report=False,
        ddp_timeout=20,
    )
    values.update(over)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(values))
    return recipe, out


def assert_checkpoint_loads(out: Path) -> Path:
    from safetensors.torch import load_file

    from grpokit.checkpoint import latest_checkpoint, load_trainer_files

    ckpt = latest_checkpoint(out)
    assert ckpt is not None
    files = load_trainer_files(ckpt)  # complete and readable
    assert files["state"]["global_step"] == int(ckpt.name.split("-")[1])
    assert load_file(str(ckpt / "model.safetensors"))
    return ckpt


def test_killed_process_stops_the_survivor_with_one_line(tmp_path, tiny_model_dir):
    recipe, out = write_recipe(tmp_path, tiny_model_dir)
    # rank 1 SIGKILLs itself right after sampling step 3; rank 0 then waits in the rewards'
    # all_gather for a peer whose connection has closed
    procs = start_ranks(recipe, {1: {"GRPOKIT_FAULT": "generation@3"}})
    try:
        wait_for(lambda: procs[1].poll() is not None, 240, "rank 1 to die")
        t_dead = time.time()
        wait_for(lambda: procs[0].poll() is not None, 20 + 30, "rank 0 to stop")
        took = time.time() - t_dead
    finally:
        (rc0, err0), (rc1, _) = finish_processes(procs)
    print(f"time to error after a training process died: {took:.2f} s")
    print(err0.strip().splitlines()[-1])
    assert rc1 == -signal.SIGKILL
    assert rc0 == 3, err0[-3000:]
    last = err0.strip().splitlines()[-1]
    assert last.startswith("training process failed: training process rank 0 of 2:"), last
    assert "another training process died" in last
    assert "resume with the same launch command plus --resume" in last
    assert "Traceback" not in err0
    ckpt = assert_checkpoint_loads(out)
    assert ckpt.name == "checkpoint-2" and str(ckpt) in last


def test_frozen_process_stops_the_survivor_after_ddp_timeout(tmp_path, tiny_model_dir):
    recipe, out = write_recipe(tmp_path, tiny_model_dir, ddp_timeout=8)
    procs = start_ranks(recipe, {})
    try:
        wait_for(lambda: (out / "checkpoint-2").is_dir(), 240, "checkpoint-2")
        os.kill(procs[1].pid, signal.SIGSTOP)  # rank 1 hangs (alive, never answers)
        t_stop = time.time()
        wait_for(lambda: procs[0].poll() is not None, 8 + 30, "rank 0 to stop")
        took = time.time() - t_stop
    finally:
        if procs[1].poll() is None:
            os.kill(procs[1].pid, signal.SIGKILL)
        (rc0, err0), _ = finish_processes(procs)
    print(f"time to error after a training process froze (ddp_timeout=8): {took:.2f} s")
    assert rc0 == 3, err0[-3000:]
    last = err0.strip().splitlines()[-1]
    assert last.startswith("training process failed: training process rank 0 of 2:"), last
    assert "stopped answering for ddp_timeout=8 s" in last
    assert took >= 8 * 0.5  # it waited for the timeout (the step may have been part done)
    assert_checkpoint_loads(out)


def test_groups_split_over_processes_is_a_config_error(tmp_path, tiny_model_dir, monkeypatch):
    """2 processes x 3 completions = 6 = 3 groups of 2, but a group cannot span processes."""
    from grpokit.config import ConfigError
    from grpokit.testing import tiny_run_config

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="each process samples whole groups"):
        tiny_run_config(tiny_model_dir, tmp_path, per_device_train_batch_size=3)
    tiny_run_config(tiny_model_dir, tmp_path, per_device_train_batch_size=4)  # 2 groups each
