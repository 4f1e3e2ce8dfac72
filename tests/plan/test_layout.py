"""grpokit plan's layout lines for vLLM with several processes (grpokit.plan.layout)."""

from grpokit.plan.layout import check_layout
from grpokit.testing import tiny_run_config


def test_server_layout_names_the_server_the_push_and_the_timeouts(tmp_path, tiny_model_dir):
    cfg = tiny_run_config(
        tiny_model_dir, tmp_path, use_vllm=True, vllm_mode="server", vllm_server_port=8123
    )
    lines = check_layout(cfg, 3, weight_bytes=2.5e9)
    text = "\n".join(lines)
    assert "each of 3 training process(es) samples 2 prompts x 2 completions" in text
    assert "1 rollout server at 127.0.0.1:8123" in text and "--port 8123" in text
    assert "rank 0 pushes the weights after each step, 2.50 GB a push" in text
    assert "ddp_timeout=600 s" in text and "vllm_server_timeout=240 s" in text


def test_colocated_layout_warns_when_training_does_not_fit_beside_vllm(tmp_path, tiny_model_dir):
    cfg = tiny_run_config(tiny_model_dir, tmp_path, use_vllm=True, vllm_gpu_memory_utilization=0.5)
    fits = check_layout(cfg, 2, peak_bytes=30e9, device_memory=80e9)
    assert "colocated, 2 vLLM engine(s)" in fits[1]
    assert "training needs 30.0 GB of the 40.0 GB left" in fits[2]
    assert not any(x.startswith("warning") for x in fits)
    tight = check_layout(cfg, 2, peak_bytes=41e9, device_memory=80e9)
    assert tight[-1].startswith("warning: training will not fit beside vLLM")
