"""The launch layout with vLLM, checked as training will check it: the recipe validated again
for the number of processes the launch starts (the same validators, under that
WORLD_SIZE), then who generates where, what each device holds, and the timeouts."""

from __future__ import annotations

import dataclasses
import os

from grpokit.config import GRPOConfig


def check_layout(
    cfg: GRPOConfig,
    num_processes: int,
    peak_bytes: float | None = None,
    device_memory: float | None = None,
    weight_bytes: float | None = None,
) -> list[str]:
    """Lines describing the layout; a ConfigError when training would refuse it.

    ``peak_bytes``: the plan's training peak per device; ``device_memory``: the device's
    bytes (--device_memory); ``weight_bytes``: the policy's weights in their dtype (a
    server push, and vLLM's own copy when colocated)."""
    old = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(num_processes)
    try:
        dataclasses.replace(cfg)  # the config's validators, for this many processes
    finally:
        if old is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = old
    gb = 1e9
    if not cfg.use_vllm:
        return [f"layout: {num_processes} training process(es), each samples its own prompts"]
    per = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    lines = [
        f"each of {num_processes} training process(es) samples {per // cfg.num_generations} "
        f"prompts x {cfg.num_generations} completions a step; collectives time out after "
        f"ddp_timeout={cfg.ddp_timeout:g} s"
    ]
    if cfg.vllm_mode == "server":
        push = f", {weight_bytes / gb:.2f} GB a push" if weight_bytes else ""
        lines.append(
            f"layout: 1 rollout server at {cfg.vllm_server_host}:{cfg.vllm_server_port} (its own "
            f"device; start it first: grpokit rollout-server --model {cfg.model_name_or_path} "
            f"--port {cfg.vllm_server_port}) for {num_processes} training process(es); rank 0 "
            f"pushes the weights after each step{push}; requests and pushes time out after "
            f"vllm_server_timeout={cfg.vllm_server_timeout:g} s"
        )
        return lines
    lines.append(
        f"layout: colocated, {num_processes} vLLM engine(s), one in each training process "
        "(tensor-parallel 1), reloaded after each step"
    )
    if device_memory and peak_bytes is not None:
        room = (1 - cfg.vllm_gpu_memory_utilization) * device_memory
        lines.append(
            f"memory per device: vLLM takes vllm_gpu_memory_utilization="
            f"{cfg.vllm_gpu_memory_utilization:g} of {device_memory / gb:.1f} GB, training "
            f"needs {peak_bytes / gb:.1f} GB of the {room / gb:.1f} GB left"
        )
        if peak_bytes > room:
            lines.append(
                "warning: training will not fit beside vLLM: lower "
                "vllm_gpu_memory_utilization, or use vllm_mode: server"
            )
    return lines
