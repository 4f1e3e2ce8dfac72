"""`accelerate launch`: two CPU processes match one process, and the shipped accelerate
configs (recipes/accelerate/*.yaml) parse with accelerate's own loader and pass, or are
refused by, grpokit's startup checks for the environment accelerate would give them. No GPU
here: the DeepSpeed and FSDP configs are checked, not run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpokit.config import ConfigError
from grpokit.launch import Launch, check_launch, launch_from_env
from grpokit.testing import tiny_run_config

HERE = Path(__file__).parent
CONFIGS = HERE.parents[1] / "recipes" / "accelerate"
GPU = torch.device("cuda", 0)


def _rows(out):
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def _assert_same_run(one, two):
    from safetensors.torch import load_file

    a, b = _rows(one), _rows(two)
    assert [r["step"] for r in b] == [1, 2, 3]  # rank 0 alone writes the log
    for ra, rb in zip(a, b):
        for k in ("reward", "reward_std", "completions/mean_length", "kl", "entropy"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), k
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-4, abs=1e-6)
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-4)
    wa = load_file(str(one / "final" / "model.safetensors"))
    wb = load_file(str(two / "final" / "model.safetensors"))
    assert set(wa) == set(wb)
    # Adam divides by sqrt(v): an element whose gradient is near zero moves by up to lr
    # (1e-3) on a sign that the order of a sum decides. Seen on an AMX Xeon: 1 element of
    # 1024 off by 1.26e-5 after FSDP2's reduce-scatter. atol 5e-5 is still 1/20 of one step.
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=5e-5, rtol=1e-4, msg=k)


def _run(cmd, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]


def test_accelerate_launch_two_cpu_processes_match_one_process(
    tmp_path, tiny_model_dir, one_process_run
):
    two = tmp_path / "two"
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    cmd += ["--config_file", str(CONFIGS / "cpu_2proc.yaml"), "--main_process_port", "29547"]
    _run([*cmd, str(HERE / "_dist_worker.py"), tiny_model_dir, str(two), "4"])
    _assert_same_run(one_process_run, two)


def test_fsdp2_sharded_path_two_cpu_ranks_match_one_process(
    tmp_path, tiny_model_dir, one_process_run
):
    """grpokit's sharded path with real FSDP2 on 2 gloo ranks (see _fsdp_cpu_worker.py for
    the accelerate calls made directly there) = one process: metrics, saved full weights,
    and the sampling copy refreshed from gathered parameters."""
    two = tmp_path / "fsdp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", "29548", str(HERE / "_fsdp_cpu_worker.py")]
    _run([*cmd, tiny_model_dir, str(two), "4"])
    _assert_same_run(one_process_run, two)


def _accelerate_env(config: Path) -> dict[str, str]:
    """The environment `accelerate launch --config_file config` gives each process, computed
    by accelerate's own launcher code (without starting anything)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(
        ["--config_file", str(config), "-m", "grpokit", "train", "r.yaml"]
    )
    args, _, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ""
        return prepare_deepspeed_cmd_env(args)[1]
    return prepare_multi_gpu_env(args)


EXPECTED = {
    "cpu_2proc.yaml": ("MULTI_GPU", Launch("data_parallel")),
    "multi_gpu.yaml": ("MULTI_GPU", Launch("data_parallel")),
    "deepspeed_zero2.yaml": ("DEEPSPEED", Launch("deepspeed", zero_stage=2)),
    "deepspeed_zero3.yaml": ("DEEPSPEED", Launch("deepspeed", zero_stage=3)),
    "fsdp.yaml": ("FSDP", Launch("fsdp", fsdp_version=2)),
}


def test_every_shipped_config_is_checked():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_accelerate_config(name, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    dtype, want = EXPECTED[name]
    c = load_config_from_file(str(CONFIGS / name))
    assert c.distributed_type.value == dtype
    assert c.mixed_precision == "no" and not c.use_cpu and c.num_machines == 1
    if dtype == "DEEPSPEED":
        assert c.deepspeed_config["zero_stage"] == want.zero_stage
        assert c.deepspeed_config["offload_optimizer_device"] == "none"
        if want.zero_stage == 3:  # whole weights gathered when saving
            assert c.deepspeed_config["zero3_save_16bit_model"] is True
    if dtype == "FSDP":
        assert c.fsdp_config["fsdp_version"] == 2
        assert c.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        assert c.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    launch = launch_from_env(_accelerate_env(CONFIGS / name))
    assert launch == want
    cfg = tiny_run_config("unused", tmp_path)
    if not launch.sharded:
        check_launch(cfg, launch, torch.device("cpu"))
        check_launch(cfg, launch, GPU)
        return
    # sharded engines: accepted on a GPU (DeepSpeed: once it is installed), refused on CPU
    check_launch(cfg, launch, GPU, deepspeed_installed=True)
    with pytest.raises(ConfigError, match="runs on GPUs only.*cpu_2proc.yaml"):
        check_launch(cfg, launch, torch.device("cpu"), deepspeed_installed=True)


def test_deepspeed_not_installed_names_the_fix(tmp_path):
    launch = launch_from_env(_accelerate_env(CONFIGS / "deepspeed_zero2.yaml"))
    with pytest.raises(ConfigError, match="pip install deepspeed"):
        check_launch(tiny_run_config("unused", tmp_path), launch, GPU, deepspeed_installed=False)


@pytest.mark.parametrize(
    "launch, overrides, message",
    [
        (Launch("fsdp", fsdp_version=2), {"use_peft": True}, "use_peft with FSDP2"),
        (Launch("deepspeed", zero_stage=3), {"use_peft": True}, "use_peft with DeepSpeed ZeRO-3"),
        (Launch("fsdp", fsdp_version=2), {"sync_ref_model": True}, "sync_ref_model with FSDP2"),
        (Launch("fsdp", fsdp_version=1), {}, "set fsdp_version: 2"),
        (Launch("deepspeed", zero_stage=1), {}, "set zero_stage: 2 or 3"),
        (Launch("data_parallel", mixed_precision="bf16"), {}, "mixed_precision: 'no'.*bf16: true"),
    ],
)
def test_unsupported_combinations_are_refused_with_the_fix(tmp_path, launch, overrides, message):
    cfg = tiny_run_config("unused", tmp_path, **overrides)
    with pytest.raises(ConfigError, match=message):
        check_launch(cfg, launch, GPU, deepspeed_installed=True)


def test_lora_with_zero2_is_accepted(tmp_path):
    cfg = tiny_run_config("unused", tmp_path, use_peft=True)
    check_launch(cfg, Launch("deepspeed", zero_stage=2), GPU, deepspeed_installed=True)


def test_trainer_refuses_a_sharded_launch_on_cpu_before_loading(tmp_path, tiny_model_dir):
    from grpokit.trainer import GRPOTrainer

    env = _accelerate_env(CONFIGS / "fsdp.yaml")
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", device="cpu")
    mp = pytest.MonkeyPatch()
    try:
        for k, v in env.items():
            if k.startswith(("ACCELERATE_", "FSDP_")):
                mp.setenv(k, v)
        with pytest.raises(ConfigError, match="FSDP2 runs on GPUs only"):
            GRPOTrainer(cfg)
    finally:
        mp.undo()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_file_and_launcher_env_agree(name):
    """grpokit plan reads the yaml; training reads the launcher's environment: same launch."""
    from grpokit.launch import launch_from_accelerate_config

    launch, nproc = launch_from_accelerate_config(str(CONFIGS / name))
    assert launch == launch_from_env(_accelerate_env(CONFIGS / name)) == EXPECTED[name][1]
    assert nproc == (2 if name == "cpu_2proc.yaml" else 8)


def test_plan_with_accelerate_config(capsys, tmp_path):
    from grpokit.cli import main

    recipe = str(HERE.parents[1] / "recipes" / "default.yaml")
    assert main(["plan", recipe, "--accelerate_config", str(CONFIGS / "fsdp.yaml"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["zero_stage"] == 3 and d["plan"]["batch"]["num_processes"] == 8
    # sharded weights: sampling needs a whole copy of the weights on every GPU
    assert d["plan"]["memory"]["sampling_copy"] >= d["plan"]["memory"]["weights"] * 8 // 2
    lora = str(HERE.parents[1] / "recipes" / "smoltldr_lora.yaml")
    assert main(["plan", lora, "--accelerate_config", str(CONFIGS / "deepspeed_zero3.yaml")]) == 2
    assert "use_peft with DeepSpeed ZeRO-3" in capsys.readouterr().err
    assert main(["plan", lora, "--accelerate_config", str(CONFIGS / "deepspeed_zero2.yaml")]) == 0


def test_accumulation_set_in_the_accelerate_config_must_match_the_recipe(tmp_path):
    cfg = tiny_run_config("unused", tmp_path)  # gradient_accumulation_steps 1
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}
    launch = launch_from_env({**env, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"})
    with pytest.raises(ConfigError, match="gradient_accumulation_steps: 4 but the recipe has 1"):
        check_launch(cfg, launch, GPU, deepspeed_installed=True)
    check_launch(cfg, launch_from_env(env), GPU, deepspeed_installed=True)
    # the yaml route (grpokit plan) sees the same key
    from grpokit.launch import launch_from_accelerate_config

    text = (CONFIGS / "deepspeed_zero2.yaml").read_text()
    yml = tmp_path / "ga.yaml"
    yml.write_text(
        text.replace("  zero_stage: 2", "  zero_stage: 2\n  gradient_accumulation_steps: 4")
    )
    assert launch_from_accelerate_config(str(yml))[0] == launch
