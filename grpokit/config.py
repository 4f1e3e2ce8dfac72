"""One validated, frozen run configuration, from a YAML recipe plus CLI overrides.

Keys keep the names of TRL's ``GRPOConfig`` and open-r1 recipes. An unknown key is an
error naming the closest valid key; a TRL/transformers key that grpokit deliberately
ignores is a warning. Batch arithmetic that cannot work is refused here, before any
model loads.

The config sits below the rest of grpokit: at import it reads only the variant names of
``grpokit.algo.variants`` (no torch). ``build_config`` consults the task registry, lazily,
to name and check the task (``_resolve_task``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
import urllib.parse
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from grpokit.algo.variants import (
    ADVANTAGE_ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    MULTI_OBJECTIVE_AGGREGATIONS,
    SAMPLING_IS_MODES,
    SCALE_REWARDS,
)


class ConfigError(ValueError):
    """A recipe or override that cannot work; the message names the problem and the fix."""


SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_min_lr",
    "constant",
    "constant_with_warmup",
)
# lr_scheduler_kwargs each schedule uses (transformers' get_scheduler signatures)
SCHEDULER_KWARGS = {
    "linear": (),
    "cosine": ("num_cycles",),
    "cosine_with_min_lr": ("num_cycles", "min_lr", "min_lr_rate"),
    "constant": (),
    "constant_with_warmup": (),
}
# optim: transformers' names grpokit runs (grpokit/optim.py); the 8-bit ones need bitsandbytes
OPTIMS_8BIT = ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit")
OPTIMS = ("adamw_torch_fused", "adamw_torch", *OPTIMS_8BIT)
# transformers' names grpokit refuses, with the nearest accepted one
OPTIM_ALTERNATIVES = {
    "adamw_torch_8bit": "adamw_8bit (bitsandbytes; torchao's is not supported)",
    "adamw_torch_4bit": "adamw_8bit (bitsandbytes; torchao's 4-bit is not supported)",
    "paged_adamw_32bit": "adamw_torch_fused",
    "adamw_hf": "adamw_torch_fused",
}
DTYPES = ("float32", "bfloat16", "float16", "auto")
ATTENTION_KERNELS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
SAVE_STRATEGIES = ("steps", "epoch", "no")
HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")
REPORT_TO = ("none", "tensorboard", "wandb", "trackio", "mlflow")

# Keys from TRL / transformers TrainingArguments that grpokit accepts and ignores.
IGNORED_KEYS = {
    "fp16": "false is the default; true is refused (see _trl_switches)",
    "tf32": "not used on CPU",
    "eval_strategy": "steps: eval_steps decides; no: no periodic evaluation (_trl_switches)",
    "logging_strategy": "set logging_steps",
    "logging_first_step": "step 1 is always logged",
    "log_level": "not used",
    "remove_unused_columns": "grpokit passes every dataset column to the rewards",
    "dataloader_num_workers": "data is in memory",
    "dataloader_drop_last": "not used",
    "ddp_find_unused_parameters": "not used",
    "use_liger_kernel": "not available on CPU",
    "log_completions_steps": "completions are logged every logging_steps",
    "num_completions_to_print": "see log_completions",
    "wandb_log_unique_prompts": "not used",
    "eval_on_start": "evaluation before training is on when max_eval_samples > 0",
    "vllm_device": "colocate runs vLLM on the training device; a server chooses its own",
    "gradient_checkpointing_kwargs": "gradient checkpointing is always non-reentrant",
    "dataset_configs": "use dataset_config (one name); the task's default config otherwise",
    # TRL 1.16 GRPOConfig keys that change nothing grpokit computes
    "router_aux_loss_coef": "no MoE router load-balancing loss is added",
    "ds3_gather_for_generation": "sampling uses an unsharded copy of the weights",
    "pad_to_multiple_of": "padding does not change the loss; grpokit packs its own forwards",
    "cache_implementation": "grpokit's decode loop preallocates its own KV cache",
    "use_transformers_paged": "grpokit's decode loop (generation_loop) decides",
    "use_transformers_continuous_batching": "grpokit's decode loop (generation_loop) decides",
    "transformers_continuous_batching_config": "grpokit's decode loop (generation_loop) decides",
    "vllm_model_impl": "vLLM picks its own model implementation",
    "vllm_group_port": "grpokit's rollout server syncs weights over its own port",
    "log_multimodal": "text tasks only",
    "log_unique_prompts": "completions.jsonl holds every logged prompt",
    "log_completions_hub_repo": "completions stay in output_dir (push_to_hub uploads it)",
    # transformers TrainingArguments keys that change nothing grpokit computes
    "disable_tqdm": "grpokit prints one line a step, no tqdm bar",
    "project": "trackers take run_name; the project is the tracker's own setting",
    "full_determinism": "runs are deterministic on CPU with a seed; GPUs keep torch's kernels",
    "dataloader_pin_memory": "data is in memory",
    "dataloader_persistent_workers": "data is in memory",
    "dataloader_prefetch_factor": "data is in memory",
    "dataloader_in_order": "data is in memory",
    "dataloader_multiprocessing_context": "data is in memory",
    "ddp_backend": "gloo on CPU, nccl on GPUs",
    "ddp_bucket_cap_mb": "grpokit sums gradients in its own 64 MB buckets",
    "ddp_broadcast_buffers": "not used",
    "ddp_static_graph": "not used",
    "average_tokens_across_devices": "the losses are normalised by global counts already",
    "skip_memory_metrics": "not used",
    "include_num_input_tokens_seen": "tokens_prompt and tokens_generated are logged every step",
    "torch_empty_cache_steps": "not used",
    "save_on_each_node": "rank 0 saves",
    "log_on_each_node": "rank 0 logs",
    "log_level_replica": "not used",
    "logging_nan_inf_filter": "non-finite steps are skipped and counted (skipped_steps)",
    "do_train": "grpokit train trains",
    "do_predict": "not used",
    "prediction_loss_only": "not used",
    "eval_accumulation_steps": "not used",
    "eval_delay": "not used",
    "eval_do_concat_batches": "not used",
    "eval_use_gather_object": "not used",
    "batch_eval_metrics": "not used",
    "include_for_metrics": "not used",
    "label_names": "not used",
    "length_column_name": "not used",
    "metric_for_best_model": "not used",
    "greater_is_better": "not used",
    "hub_always_push": "uploads follow hub_strategy",
    "hub_revision": "uploads go to the repository's main branch",
    "ignore_data_skip": "a resumed run continues the saved prompt order",
    "restore_callback_states_from_checkpoint": "not used",
    "train_sampling_strategy": "prompts follow shuffle_dataset",
    "bf16_full_eval": "evaluation follows bf16",
    "fp16_full_eval": "evaluation follows bf16",
    "debug": "not used",
    "local_rank": "read from the launcher's LOCAL_RANK",
    "accelerator_config": "sharding comes from the accelerate launch config",
    "parallelism_config": "sharding comes from the accelerate launch config",
    "trackio_space_id": "not used",
    "trackio_bucket_id": "not used",
    "trackio_static_space_id": "not used",
    "use_cache": "not used",
    "activation_checkpointing_kwargs": "gradient_checkpointing checkpoints every layer",
    "torch_compile_backend": "grpokit does not compile the model",
    "torch_compile_mode": "grpokit does not compile the model",
    "liger_kernel_config": "not available on CPU",
    "enable_jit_checkpoint": "not used",
}

_SHARDED = (
    "sharding comes from the accelerate config: accelerate launch --config_file "
    "recipes/accelerate/deepspeed_zero3.yaml (or deepspeed_zero2.yaml, fsdp.yaml) -m grpokit "
    "train RECIPE"
)
# TRL / transformers keys grpokit cannot honour: accepted at their default (an empty or false
# value), refused otherwise with what to do instead.
DEFAULT_ONLY_KEYS = {
    "deepspeed": _SHARDED,
    "fsdp": _SHARDED,
    "fsdp_config": _SHARDED,
    "resume_from_checkpoint": "resume with: grpokit train RECIPE --resume [CHECKPOINT_DIR]",
    "load_best_model_at_end": "grpokit keeps the last model; every checkpoint-N has its eval",
    "save_only_model": "checkpoints hold the optimizer and RNG state for exact resume; bound "
    "their disk use with save_total_limit",
    "torch_compile": "grpokit does not compile the model (its CPU decode step and log-prob "
    "forward are fused by hand)",
    "auto_find_batch_size": "set per_device_train_batch_size; grpokit plan RECIPE estimates "
    "the memory of a recipe before it runs",
    "neftune_noise_alpha": "NEFTune embedding noise is not supported",
    "label_smoothing_factor": "label smoothing does not apply to GRPO's loss",
    "optim_args": "use the optimizer keys (adam_beta1, adam_beta2, adam_epsilon, weight_decay)",
    "optim_target_modules": "GaLore-style optimizers are not supported",
    "vllm_structured_outputs_regex": "regex-guided decoding is not supported",
}
# TRL's names for settings grpokit names otherwise (no warning)
TRL_ALIASES = {
    "vllm_max_model_length": "vllm_max_model_len",
    "activation_checkpointing": "gradient_checkpointing",  # transformers 5's name
}
# generation_kwargs / model_init_kwargs entries grpokit maps onto its own keys
GENERATION_KWARGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
MODEL_INIT_KWARGS = {
    "torch_dtype": "torch_dtype",
    "dtype": "torch_dtype",
    "attn_implementation": "attn_implementation",
    "trust_remote_code": "trust_remote_code",
    "revision": "model_revision",
}


@dataclass(frozen=True)
class GRPOConfig:
    """Everything a run needs. Field names follow TRL's GRPOConfig where TRL has one."""

    # model
    model_name_or_path: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model_revision: str | None = None  # hub branch, tag or commit (None/main: latest)
    # attention kernel (transformers): eager, sdpa, flash_attention_2/3 (CUDA + flash_attn;
    # otherwise sdpa, said once), flex_attention; None: transformers' choice (sdpa)
    attn_implementation: str | None = None
    torch_dtype: str = "float32"
    # mixed precision: fp32 master weights, bf16 autocast for forward passes; auto (grpokit's
    # value, resolved at load): bf16 where the device computes it natively, else float32
    bf16: bool = False
    chat_template: str | None = None
    # extra variables of every chat-template rendering of the policy's prompts (TRL's), e.g.
    # {enable_thinking: false} for Qwen3
    chat_template_kwargs: dict = field(default_factory=dict)
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: str | list | None = None  # None = all linear layers
    merge_lora: bool = True
    # where this process trains: auto (cuda:LOCAL_RANK when torch sees a GPU, else cpu),
    # cpu, cuda (= cuda:LOCAL_RANK) or cuda:N. Reward functions run on the CPU; reward
    # models (sequence classifiers in reward_funcs) on this device.
    device: str = "auto"

    # task and data
    task: str = "gsm8k"
    task_params: dict = field(default_factory=dict)
    dataset_name: str | None = None
    dataset_config: str | None = None
    dataset_train_split: str = "train"
    dataset_test_split: str = "test"
    # The dataset column holding the prompt text, when it is not the task's own (math:
    # problem, gsm8k: question, tldr and custom: prompt); None keeps the task's.
    dataset_prompt_column: str | None = None
    system_prompt: str | None = None
    max_train_samples: int | None = None
    prompt_truncation: str = "truncate"  # or "error"

    # rewards
    reward_funcs: list | None = None  # None: the task's defaults
    reward_weights: list | None = None
    reward_errors: str = "raise"  # or "skip"
    # tokenizers of reward-model entries of reward_funcs (TRL's key): a list aligned with
    # reward_funcs (null for non-models) or one directory / hub id for every reward model
    reward_processing_classes: str | list | None = None
    max_nonfinite_skips: int = 3  # consecutive non-finite steps before the run stops

    # generation
    num_generations: int = 8
    max_prompt_length: int | None = 512
    max_completion_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None  # keep tokens with p >= min_p * max p (TRL, transformers)
    repetition_penalty: float = 1.0
    generation_loop: str = "grpokit"  # grpokit's decode loop, or "hf" (transformers' generate)
    fused_logprobs: bool = True  # output layer + log-softmax by token chunks (see trainer)
    fused_decode: bool = (
        True  # grpokit loop, Llama/Mistral/Qwen2: fused decode step (fastdecode.py)
    )
    # grpokit loop: a common prompt prefix of >= 16 tokens (system prompt, demonstrations,
    # tool schema) is prefilled once for the whole batch (speed/prefix.py)
    share_prompt_prefix: bool = True
    share_prompt_forward: bool = (
        True  # each distinct prompt runs once per micro-batch (see trainer)
    )
    # token positions one training or reference forward may compute (several rows' prompts
    # and completions): longer completions give more, smaller micro-batches (batch.py); 0: off
    max_micro_batch_tokens: int = 4096
    # a training or reference forward may hold rows of several micro-batches while together
    # they take no more positions than one micro-batch padded to the step's longest prompt
    # and completion, as TRL pads its micro-batch (nor max_micro_batch_tokens): fewer,
    # larger forwards, the same loss (batch.py)
    merge_micro_batches: bool = True
    attention_backward: bool = (
        True  # CPU training forward: SDPA forward, grpokit's batched backward (attention.py)
    )
    bf16_sampling_copy: bool = True  # with bf16 (full fine-tuning): sample from a bf16 copy
    # CPU training: tensors of 256 KiB and more from grpokit's pool (speed/pool.py), not the
    # glibc heap, whose small allocations split the space activations need (-0.9 GB peak RSS)
    cpu_memory_pool: bool = True

    # multi-turn rollouts with tools and environments (docs/tools.md; TRL's keys but the last)
    tools: list | None = None  # calculator, python, module:function, path/file.py:function
    max_tool_calling_iterations: int | None = None  # tool calls per completion; null: no limit
    environment_factory: str | None = None  # module:Factory or path/file.py:Factory
    tool_timeout: float = 10.0  # seconds one in-process tool call may run

    # vLLM rollouts (README, "vLLM rollouts"); needs the vllm package (./run test-vllm)
    use_vllm: bool = False
    vllm_mode: str = "colocate"  # colocate: vLLM in this process; server: grpokit rollout-server
    vllm_server_host: str = "127.0.0.1"
    vllm_server_port: int = 8000
    vllm_server_timeout: float = 240.0  # seconds: wait for the server, each request and push
    vllm_gpu_memory_utilization: float = 0.9  # GPU only; on CPU: VLLM_CPU_KVCACHE_SPACE (GB)
    vllm_enable_sleep_mode: bool = False  # GPU: offload weights/KV cache between rollouts
    vllm_enforce_eager: bool = True  # false: vLLM compiles (faster decoding, ~1 min start-up)
    vllm_max_model_len: int | None = None  # None: max_prompt_length + max_completion_length
    vllm_tensor_parallel_size: int = 1  # TRL's; grpokit's vLLM engines are tensor-parallel 1
    vllm_importance_sampling_correction: bool = True  # truncated IS for vLLM/trainer mismatch
    vllm_importance_sampling_mode: str = "token_truncate"  # or token_mask, sequence_*
    # TRL's bounds on the ratio (truncate: clamp to them; mask: zero outside); null: none.
    # vllm_importance_sampling_cap is TRL's deprecated name of clip_max.
    vllm_importance_sampling_clip_max: float | None = 2.0
    vllm_importance_sampling_clip_min: float | None = None

    # GRPO objective
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    loss_type: str = "dapo"
    scale_rewards: str | bool = "group"
    importance_sampling_level: str = "token"
    num_iterations: int = 1
    mask_truncated_completions: bool = False
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512

    # newer losses, stabilisers, estimators and dynamic sampling (docs/algorithms.md);
    # TRL's names and defaults, checked by _check_frontier
    delta: float | None = None  # INTELLECT-2 two-sided clipping: the ratio's upper cap
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    top_entropy_quantile: float = 1.0  # rho: only the top-rho tokens by entropy learn
    off_policy_mask_threshold: float | None = None  # DeepSeek-V3.2 off-policy sequence mask
    use_bias_correction_kl: bool = True  # TRL's default since 1.10 (huggingface/trl#6503)
    multi_objective_aggregation: str = "sum_then_normalize"  # or normalize_then_sum (GDPO)
    # or rloo (leave-one-out baseline, verl's rloo), reinforce_plus_plus_baseline (verl's:
    # group mean, then whitened over the batch's tokens; scale_rewards unset -> batch)
    advantage_estimator: str = "grpo"
    entropy_coef: float = 0.0  # loss -= entropy_coef * mean token entropy
    use_adaptive_entropy: bool = False  # Skywork-OR1's controller of entropy_coef
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2
    cast_lm_head_to_fp32: bool = False  # the output layer's weights and product in float32
    dynamic_sampling: bool = False  # DAPO: drop equal-reward groups, sample until full
    max_num_gen_batches: int = 0  # dynamic sampling's generation calls per step (0: no limit)
    # prompts a dynamic-sampling generation call draws over all processes (verl's
    # data.gen_batch_size); 0: as many as the informative rate of the last steps says will
    # fill the step (grpokit.dynamic.CallSizes)
    gen_batch_size: int = 0
    # TRL's generation batch: grpokit generates once per optimizer step (TRL's default), so
    # these may only name that: steps_per_generation = gradient_accumulation_steps,
    # generation_batch_size = the step's completions over all processes
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None
    shuffle_dataset: bool = True  # false: training prompts in the dataset's order (TRL)
    disable_dropout: bool = False  # every dropout of the policy (LoRA's too) set to 0 (TRL)

    # optimisation
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict = field(default_factory=dict)
    # AdamW kind: adamw_torch_fused, adamw_torch, adamw_8bit (= adamw_bnb_8bit; bitsandbytes),
    # paged_adamw_8bit. bf16/fp16 trainable weights always get fp32 master weights.
    optim: str = "adamw_torch_fused"
    warmup_ratio: float = 0.0
    # transformers' warmup: >= 1 a number of steps, in (0, 1) a fraction of them (as
    # warmup_ratio); when both are set warmup_steps wins, as transformers
    warmup_steps: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    max_steps: int = -1
    num_train_epochs: float = 1.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    seed: int = 42
    # the task's data: generated problems, held-out slices, `#N` samples (transformers'
    # name; null: the same as seed). Fix it to compare training seeds on one held-out set.
    data_seed: int | None = None
    torch_num_threads: int | None = None
    # seconds any collective between training processes may wait (transformers' key; its
    # default is 1800): a process that died or hangs stops the others within this time
    ddp_timeout: float = 600.0

    # evaluation
    # null (default): evaluate when the dataset has a held-out split (dataset_test_split or
    # task_params test_size), else train with evaluation skipped and say so; true: the
    # held-out split must exist; false: no held-out split is loaded and no evaluation runs
    do_eval: bool | None = None
    eval_steps: int = 0
    max_eval_samples: int = 200
    per_device_eval_batch_size: int = 32
    eval_max_completion_length: int | None = None
    # null: one greedy completion per held-out prompt (grpokit); k: k completions sampled at
    # the training temperature (TRL's num_generations_eval): accuracy of the first, pass@1
    # over all k, pass@k
    num_generations_eval: int | None = None

    # output and logging
    output_dir: str = "outputs/run"
    # an output_dir that holds a run: false refuses to start (use --resume), true moves the
    # old run aside to OUTPUT_DIR.previous-<time> (nothing is deleted) and starts afresh
    overwrite_output_dir: bool = False
    logging_steps: int = 1
    save_strategy: str = "steps"  # steps (every save_steps), epoch (each pass over the data), no
    save_steps: int = 50
    save_total_limit: int | None = None
    report_to: str | list = "none"
    # upload to the Hugging Face Hub (grpokit/hub.py); checked before training starts
    push_to_hub: bool = False
    hub_model_id: str | None = None  # None: the output_dir's name, in the token's namespace
    hub_strategy: str = "every_save"  # end, every_save, checkpoint, all_checkpoints
    hub_private_repo: bool | None = None  # None: the hub's default for the namespace
    hub_token: str | None = None  # None: HF_TOKEN or the stored login; never written to disk
    run_name: str | None = None  # the trackers' run name; None: the output_dir's name
    log_completions: bool = False
    # report.html (grpokit report) written at the end of the run and every report_steps
    # steps while it runs (0: only at the end); needs matplotlib (the report extra)
    write_report: bool = True
    report_steps: int = 10
    # training-health alerts (grpokit/health.py, docs/health.md): warn (one line when an
    # alert fires or clears), stop (also end the run after a checkpoint, exit code 4), off;
    # health_params: thresholds to override (grpokit.health.HEALTH_DEFAULTS)
    health_checks: str | bool = "warn"  # YAML reads a bare off as false: the same
    health_params: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ derived
    @property
    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def completions_per_step(self) -> int:
        """Completions in one generation batch = one optimizer step, all ranks."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size

    @property
    def prompts_per_step(self) -> int:
        return self.completions_per_step // self.num_generations

    @property
    def scale_rewards_mode(self) -> str:
        if self.scale_rewards is True:
            return "group"
        if self.scale_rewards is False:
            return "none"
        return self.scale_rewards

    def to_dict(self) -> dict[str, Any]:
        """Every key, for config.yaml, checkpoints and trackers: the hub token left out."""
        d = dataclasses.asdict(self)
        d["hub_token"] = None
        return d

    def __post_init__(self) -> None:
        _validate(self)


# ---------------------------------------------------------------------- validation
# One validator per theme, each run on every config (``__post_init__``). A config with
# several faults reports the first fault of the first theme that has one.
def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _validate(c: GRPOConfig) -> None:
    for check in _VALIDATORS:
        check(c)


def _check_model(c: GRPOConfig) -> None:
    _check(c.torch_dtype in DTYPES, f"torch_dtype={c.torch_dtype!r}: use one of {DTYPES}")
    _check(
        isinstance(c.device, str) and bool(re.match(r"^(auto|cpu|cuda|cuda:\d+)$", c.device)),
        f"device={c.device!r}: use auto, cpu, cuda or cuda:N",
    )
    _check(c.lora_r >= 1 and c.lora_alpha > 0, "lora_r must be >= 1 and lora_alpha > 0")
    _check(
        c.attn_implementation is None or c.attn_implementation in ATTENTION_KERNELS,
        f"attn_implementation={c.attn_implementation!r}: use one of {ATTENTION_KERNELS} or null",
    )


def _check_objective(c: GRPOConfig) -> None:
    _check(c.loss_type in LOSS_TYPES, f"loss_type={c.loss_type!r}: use one of {LOSS_TYPES}")
    _check(
        c.scale_rewards_mode in SCALE_REWARDS,
        f"scale_rewards={c.scale_rewards!r}: use group, batch, none (or true/false)",
    )
    _check(
        c.importance_sampling_level in IMPORTANCE_SAMPLING_LEVELS,
        f"importance_sampling_level={c.importance_sampling_level!r}: use token or sequence (GSPO)",
    )
    _check(c.epsilon > 0, f"epsilon={c.epsilon} must be > 0 (the PPO clip range, e.g. 0.2)")
    _check(
        c.epsilon_high is None or c.epsilon_high > 0,
        f"epsilon_high={c.epsilon_high} must be > 0 (DAPO uses 0.28)",
    )
    _check(c.beta >= 0, f"beta={c.beta} must be >= 0 (0 disables the KL term)")
    _check(c.num_iterations >= 1, f"num_iterations={c.num_iterations} must be >= 1")


def _check_frontier(c: GRPOConfig) -> None:
    """The keys of the newer losses, stabilisers, estimators and dynamic sampling."""
    _check(
        c.delta is None or c.delta > 1,
        f"delta={c.delta} must be > 1 (the cap of the unclipped ratio; INTELLECT-2 uses 4) or null",
    )
    _check(
        c.sapo_temperature_pos > 0 and c.sapo_temperature_neg > 0,
        "sapo_temperature_pos and sapo_temperature_neg must be > 0 (TRL: 1.0 and 1.05)",
    )
    _check(
        min(c.vespo_k_pos, c.vespo_k_neg) >= 0 and min(c.vespo_lambda_pos, c.vespo_lambda_neg) > 0,
        f"vespo_k_pos ({c.vespo_k_pos}) and vespo_k_neg ({c.vespo_k_neg}) must be >= 0, "
        f"vespo_lambda_pos ({c.vespo_lambda_pos}) and vespo_lambda_neg ({c.vespo_lambda_neg}) "
        "> 0 (TRL: 2, 3, 3, 2)",
    )
    _check(
        0 <= c.top_entropy_quantile <= 1,
        f"top_entropy_quantile={c.top_entropy_quantile} must be in [0, 1] (1 keeps every "
        "token; the paper uses 0.2)",
    )
    _check(
        c.off_policy_mask_threshold is None or c.off_policy_mask_threshold >= 0,
        f"off_policy_mask_threshold={c.off_policy_mask_threshold} must be >= 0 (e.g. 0.5) or null",
    )
    _check(
        c.entropy_coef_min <= c.entropy_coef_max and c.entropy_coef_delta >= 0,
        "entropy_coef_min must be <= entropy_coef_max and entropy_coef_delta >= 0",
    )
    _check(c.max_num_gen_batches >= 0, "max_num_gen_batches must be >= 0 (0: no limit)")
    _check(
        c.gen_batch_size >= 0 and (c.dynamic_sampling or not c.gen_batch_size),
        f"gen_batch_size={c.gen_batch_size} (prompts a dynamic-sampling generation call "
        "draws) must be >= 0 and needs dynamic_sampling: true; set 0 (auto) or turn "
        "dynamic_sampling on",
    )
    if c.gen_batch_size and c.num_generations >= 1:  # (num_generations is checked below)
        n = c.prompts_per_step
        _check(
            c.gen_batch_size >= n,
            f"gen_batch_size={c.gen_batch_size} prompts a generation call is fewer than the "
            f"{n} prompts of a step; use at least {n} (verl: gen_batch_size >= "
            "train_batch_size) or 0 (sized automatically)",
        )
    _check_generation_batch(c)
    _check(
        c.num_generations_eval is None or c.num_generations_eval >= 1,
        f"num_generations_eval={c.num_generations_eval} must be >= 1 (null: one greedy completion)",
    )
    _check(
        not (c.loss_type == "vespo" and c.use_vllm and c.vllm_importance_sampling_correction
             and c.vllm_importance_sampling_mode.startswith("sequence")),
        "loss_type vespo folds the rollout correction into its sequence weight and needs "
        "vllm_importance_sampling_mode token_truncate or token_mask",
    )  # fmt: skip
    _check(
        not (c.cast_lm_head_to_fp32 and c.use_peft and _lora_targets_head(c)),
        "cast_lm_head_to_fp32 with a LoRA adapter on lm_head: remove lm_head from "
        "lora_target_modules or set cast_lm_head_to_fp32: false",
    )
    _warn_frontier(c)


def _check_estimator(c: GRPOConfig) -> None:
    """advantage_estimator and multi_objective_aggregation, and their combinations."""
    _check(
        c.multi_objective_aggregation in MULTI_OBJECTIVE_AGGREGATIONS,
        f"multi_objective_aggregation={c.multi_objective_aggregation!r}: use one of "
        f"{MULTI_OBJECTIVE_AGGREGATIONS}",
    )
    _check(
        c.advantage_estimator in ADVANTAGE_ESTIMATORS,
        f"advantage_estimator={c.advantage_estimator!r}: use one of {ADVANTAGE_ESTIMATORS}",
    )
    _check(
        not (
            c.advantage_estimator != "grpo"
            and c.multi_objective_aggregation != "sum_then_normalize"
        ),
        f"advantage_estimator {c.advantage_estimator} needs multi_objective_aggregation: "
        "sum_then_normalize (normalize_then_sum uses the group mean)",
    )
    _check(
        c.advantage_estimator != "reinforce_plus_plus_baseline" or c.scale_rewards_mode == "batch",
        "advantage_estimator reinforce_plus_plus_baseline whitens over the batch's tokens "
        f"itself (verl): set scale_rewards: batch (not {c.scale_rewards!r})",
    )


def _lora_targets_head(c: GRPOConfig) -> bool:
    t = c.lora_target_modules
    return "lm_head" in ([t] if isinstance(t, str) else list(t or []))


def _warn_frontier(c: GRPOConfig) -> None:
    """TRL's warnings for settings that run but are probably not what the paper meant."""
    notes = []
    if c.loss_type == "luspo" and c.importance_sampling_level != "sequence":
        notes.append(
            "loss_type luspo: set importance_sampling_level: sequence to mirror the paper's setup"
        )
    if c.loss_type == "vespo" and c.importance_sampling_level != "token":
        notes.append(
            "loss_type vespo computes its own sequence weights: importance_sampling_level "
            "should be token (the default)"
        )
    if c.loss_type == "cispo" and (c.epsilon_high is None or c.epsilon_high < 1):
        cap = c.epsilon if c.epsilon_high is None else c.epsilon_high
        notes.append(
            f"loss_type cispo caps the ratio itself at epsilon_high (absolute, now {cap}): "
            "every ratio is clipped far below 1; ScaleRL uses epsilon_high: 5.0"
        )
    if c.loss_type == "cispo" and c.importance_sampling_level == "sequence":
        notes.append(
            "importance_sampling_level sequence with loss_type cispo sums per-token terms, so "
            "each sequence weighs by its length; GSPO's setup is loss_type grpo"
        )
    for note in notes:
        warnings.warn(note, stacklevel=4)


def _check_reference(c: GRPOConfig) -> None:
    _check(0 <= c.ref_model_mixup_alpha <= 1, "ref_model_mixup_alpha must be in [0, 1]")
    _check(c.ref_model_sync_steps >= 1, "ref_model_sync_steps must be >= 1")
    _check(
        not (c.sync_ref_model and c.use_peft),
        "sync_ref_model with use_peft: the reference is the base model with the adapter "
        "disabled, which cannot be mixed; turn one of them off",
    )


def _check_generation(c: GRPOConfig) -> None:
    _check(c.prompt_truncation in ("truncate", "error"), "prompt_truncation: use truncate or error")
    _check(
        c.generation_loop in ("grpokit", "hf"),
        f"generation_loop={c.generation_loop!r}: use grpokit or hf (transformers' generate)",
    )
    _check(c.temperature > 0, f"temperature={c.temperature} must be > 0 (sampling needs it)")
    _check(0 < c.top_p <= 1, f"top_p={c.top_p} must be in (0, 1]")
    _check(c.top_k is None or c.top_k >= 0, f"top_k={c.top_k} must be >= 0 (0 or null: off)")
    _check(
        c.min_p is None or 0 <= c.min_p <= 1,
        f"min_p={c.min_p} must be in [0, 1] (0 or null: off; 0.05-0.1 is usual)",
    )
    _check(
        c.repetition_penalty > 0,
        f"repetition_penalty={c.repetition_penalty} must be > 0 (1.0: off)",
    )
    _check(c.max_completion_length >= 1, "max_completion_length must be >= 1")
    _check(
        c.max_prompt_length is None or c.max_prompt_length >= 1,
        "max_prompt_length must be >= 1 or null",
    )
    _check_tools(c)


def _check_tools(c: GRPOConfig) -> None:
    agent = bool(c.tools) or c.environment_factory is not None
    _check(
        c.tools is None or (isinstance(c.tools, list) and all(isinstance(t, str) for t in c.tools)),
        "tools: a list of calculator, python, module:function or path/file.py:function",
    )
    _check(
        c.max_tool_calling_iterations is None or c.max_tool_calling_iterations >= 0,
        "max_tool_calling_iterations must be >= 0 or null (no limit)",
    )
    _check(c.tool_timeout > 0, f"tool_timeout={c.tool_timeout} must be > 0 (seconds)")
    _check(
        not (agent and c.use_vllm and c.vllm_mode != "colocate"),
        "tools / environment_factory run with grpokit's decode loop or vllm_mode: colocate; "
        "the rollout server does not run multi-turn rollouts yet",
    )
    _check(
        not (agent and c.generation_loop != "grpokit"),
        "tools / environment_factory need generation_loop: grpokit (stop strings, turn by turn)",
    )


def _check_vllm(c: GRPOConfig) -> None:
    _check(
        c.vllm_mode in ("colocate", "server"),
        f"vllm_mode={c.vllm_mode!r}: use colocate (vLLM in the training process) or server "
        "(grpokit rollout-server)",
    )
    _check(1 <= c.vllm_server_port <= 65535, f"vllm_server_port={c.vllm_server_port}: use 1-65535")
    _check(c.vllm_server_timeout > 0, "vllm_server_timeout must be > 0 (seconds)")
    _check(
        0 < c.vllm_gpu_memory_utilization <= 1,
        f"vllm_gpu_memory_utilization={c.vllm_gpu_memory_utilization} must be in (0, 1]",
    )
    _check(
        c.vllm_max_model_len is None or c.vllm_max_model_len >= 2,
        "vllm_max_model_len must be >= 2 or null",
    )
    mode = c.vllm_importance_sampling_mode
    _check(
        mode in SAMPLING_IS_MODES,
        f"vllm_importance_sampling_mode={mode!r}: use one of {SAMPLING_IS_MODES}",
    )
    hi, lo = c.vllm_importance_sampling_clip_max, c.vllm_importance_sampling_clip_min
    _check(
        hi is not None or lo is not None,
        "vllm_importance_sampling_clip_max and vllm_importance_sampling_clip_min are both "
        "null: set clip_max (e.g. 2.0; TRL uses 3.0)",
    )
    _check(
        (hi is None or hi >= 1) and (lo is None or 0 <= lo <= 1),
        f"vllm_importance_sampling_clip_min={lo}, vllm_importance_sampling_clip_max={hi}: "
        "the ratio 1 (engine and trainer agree) must lie inside; use clip_max >= 1 (TRL: "
        "3.0) and clip_min in [0, 1]",
    )
    _check(c.ddp_timeout > 0, f"ddp_timeout={c.ddp_timeout} must be > 0 (seconds)")


def _check_generation_batch(c: GRPOConfig) -> None:
    """TRL's ``steps_per_generation`` / ``generation_batch_size`` name how many optimizer
    steps one generation batch feeds; grpokit generates once per step, so only that value
    (TRL's default) is accepted."""
    spg, gbs, ga = c.steps_per_generation, c.generation_batch_size, c.gradient_accumulation_steps
    reuse = "(num_iterations reuses a batch for several updates)"
    _check(
        spg is None or spg == ga,
        f"steps_per_generation={spg}: grpokit generates once per optimizer step, so it must "
        f"equal gradient_accumulation_steps ({ga}); remove it {reuse}",
    )
    _check(
        gbs is None or gbs == c.completions_per_step,
        f"generation_batch_size={gbs}: grpokit generates one optimizer step's completions at a "
        f"time (per_device_train_batch_size x gradient_accumulation_steps x processes = "
        f"{c.completions_per_step}); remove it {reuse}",
    )
    _check(
        c.vllm_tensor_parallel_size == 1,
        f"vllm_tensor_parallel_size={c.vllm_tensor_parallel_size}: grpokit's vLLM engines run "
        "tensor-parallel 1; use one engine per process (vllm_mode: colocate) or a rollout "
        "server (vllm_mode: server)",
    )


def _check_rewards(c: GRPOConfig) -> None:
    _check(c.reward_errors in ("raise", "skip"), "reward_errors: use raise or skip")
    _check(c.max_nonfinite_skips >= 1, "max_nonfinite_skips must be >= 1")
    rpc = c.reward_processing_classes
    if isinstance(rpc, list):
        _check(
            all(x is None or isinstance(x, str) for x in rpc),
            f"reward_processing_classes={rpc}: each entry is a tokenizer directory, a hub id "
            "or null",
        )
        if c.reward_funcs is not None:
            _check(
                len(rpc) == len(c.reward_funcs),
                f"reward_processing_classes has {len(rpc)} entries but reward_funcs has "
                f"{len(c.reward_funcs)}; give one per function (null for non-models)",
            )
    if c.reward_weights is None:
        return
    _check(
        all(isinstance(w, (int, float)) and math.isfinite(w) for w in c.reward_weights),
        f"reward_weights={c.reward_weights} must be finite numbers",
    )
    if c.reward_funcs is not None:
        _check(
            len(c.reward_weights) == len(c.reward_funcs),
            f"reward_weights has {len(c.reward_weights)} entries but reward_funcs has "
            f"{len(c.reward_funcs)}; give one weight per function",
        )


def _check_optimization(c: GRPOConfig) -> None:
    _check(
        c.lr_scheduler_type in SCHEDULERS,
        f"lr_scheduler_type={c.lr_scheduler_type!r}: use one of {SCHEDULERS}",
    )
    _check(c.learning_rate > 0, f"learning_rate={c.learning_rate} must be > 0")
    _check_optim(c.optim)
    _check_scheduler_kwargs(c)
    _check(0 <= c.warmup_ratio < 1, f"warmup_ratio={c.warmup_ratio} must be in [0, 1)")
    _check(
        c.warmup_steps >= 0 and (c.warmup_steps < 1 or c.warmup_steps == int(c.warmup_steps)),
        f"warmup_steps={c.warmup_steps}: use a whole number of steps, or a fraction in [0, 1) "
        "of the run's steps",
    )
    _check(c.max_grad_norm >= 0, "max_grad_norm must be >= 0 (0 disables clipping)")
    _check(
        c.max_steps > 0 or c.num_train_epochs > 0,
        "set max_steps > 0 or num_train_epochs > 0 so that the run has some length",
    )


def _check_optim(optim: str) -> None:
    if optim in OPTIM_ALTERNATIVES:
        raise ConfigError(
            f"optim={optim!r} is not supported by grpokit; use {OPTIM_ALTERNATIVES[optim]}"
        )
    _check(optim in OPTIMS, f"optim={optim!r}: use one of {', '.join(OPTIMS)}")


def _check_scheduler_kwargs(c: GRPOConfig) -> None:
    kw = c.lr_scheduler_kwargs
    _check(isinstance(kw, dict), f"lr_scheduler_kwargs={kw!r} must be a mapping")
    accepted = SCHEDULER_KWARGS[c.lr_scheduler_type]
    unused = [k for k in kw if k not in accepted]
    _check(
        not unused,
        f"lr_scheduler_kwargs {unused} are not used by lr_scheduler_type "
        f"{c.lr_scheduler_type}; it accepts {list(accepted) or 'none'}",
    )
    for k, v in kw.items():
        _check(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
            f"lr_scheduler_kwargs {k}={v!r} must be a number",
        )
    _check(
        not ("min_lr" in kw and "min_lr_rate" in kw),
        "lr_scheduler_kwargs: set one of min_lr and min_lr_rate, not both",
    )
    _check(kw.get("num_cycles", 0.5) > 0, "lr_scheduler_kwargs num_cycles must be > 0")
    _check(
        0 <= kw.get("min_lr_rate", 0.0) <= 1, "lr_scheduler_kwargs min_lr_rate must be in [0, 1]"
    )
    _check(
        0 <= kw.get("min_lr", 0.0) <= c.learning_rate,
        f"lr_scheduler_kwargs min_lr must be in [0, learning_rate={c.learning_rate}]",
    )


def _check_batch(c: GRPOConfig) -> None:
    """Batch sizes and the group arithmetic: one step's completions split into groups."""
    _check(
        c.per_device_train_batch_size >= 1 and c.gradient_accumulation_steps >= 1,
        "per_device_train_batch_size and gradient_accumulation_steps must be >= 1",
    )
    _check(c.per_device_eval_batch_size >= 1, "per_device_eval_batch_size must be >= 1")
    _check(
        c.max_micro_batch_tokens >= 0,
        f"max_micro_batch_tokens={c.max_micro_batch_tokens}: use a number of tokens >= 1, or 0 "
        "for no bound",
    )
    G = c.num_generations
    _check(G >= 1, f"num_generations={G} must be >= 1")
    _check(
        G >= 2 or c.scale_rewards_mode == "none"
        or c.advantage_estimator == "reinforce_plus_plus_baseline",
        f"num_generations={G}: a group of one has no spread, so its advantage is always 0; "
        "use num_generations >= 2 (or advantage_estimator: reinforce_plus_plus_baseline)",
    )  # fmt: skip
    _check(
        G >= 2 or not c.dynamic_sampling,
        "dynamic_sampling keeps groups whose rewards differ, never a group of one: "
        "use num_generations >= 2 or dynamic_sampling: false",
    )
    check_processes(c, c.world_size)


def check_processes(c: GRPOConfig, world_size: int) -> None:
    """The checks that depend on how many processes train: run on every config with this
    process's ``WORLD_SIZE``, and by ``setup.preflight`` with the process count of a launch
    being planned (``grpokit plan --accelerate_config / --num_processes``)."""
    G, W = c.num_generations, world_size
    n = c.per_device_train_batch_size * c.gradient_accumulation_steps * W
    _check(
        n % G == 0,
        f"completions per optimizer step = per_device_train_batch_size "
        f"({c.per_device_train_batch_size}) x gradient_accumulation_steps "
        f"({c.gradient_accumulation_steps}) x processes ({W}) = {n}, which is not "
        f"divisible by num_generations ({G}); choose values so that it is, e.g. "
        f"per_device_train_batch_size={G} or num_generations dividing {n}",
    )
    _check(
        c.gen_batch_size % W == 0,
        f"gen_batch_size ({c.gen_batch_size}) prompts per generation call are shared by "
        f"{W} processes; make it a multiple of {W} (or 0: auto)",
    )
    per_process = c.per_device_train_batch_size * c.gradient_accumulation_steps
    _check(
        per_process % G == 0,
        f"each process samples whole groups of its own prompts, but per_device_train_batch_size "
        f"({c.per_device_train_batch_size}) x gradient_accumulation_steps "
        f"({c.gradient_accumulation_steps}) = {per_process} completions per process is not a "
        f"multiple of num_generations ({G}) with {W} processes; make it one, e.g. "
        f"per_device_train_batch_size={G}",
    )


def _check_logging(c: GRPOConfig) -> None:
    """Logging, checkpoints, reports and evaluation."""
    reports = [c.report_to] if isinstance(c.report_to, str) else list(c.report_to)
    for r in reports:
        _check(r in REPORT_TO, f"report_to={r!r}: use one of {REPORT_TO}")
    _check(c.logging_steps >= 1, "logging_steps must be >= 1")
    _check_health(c)
    _check(
        c.hub_strategy in HUB_STRATEGIES,
        f"hub_strategy={c.hub_strategy!r}: use one of {HUB_STRATEGIES}",
    )
    _check(
        c.run_name is None or (c.run_name.strip() != "" and "/" not in c.run_name),
        f"run_name={c.run_name!r}: give a non-empty name without '/' (or null: the "
        "output_dir's name)",
    )
    _check(c.save_steps >= 0, "save_steps must be >= 0 (0: only the final save)")
    _check(
        c.save_strategy in SAVE_STRATEGIES,
        f"save_strategy={c.save_strategy!r}: use steps (every save_steps), epoch or no"
        + (
            " (best needs metric_for_best_model, which grpokit does not track)"
            if c.save_strategy == "best"
            else ""
        ),
    )
    _check(
        c.save_total_limit is None or c.save_total_limit >= 1,
        "save_total_limit must be >= 1 or null",
    )
    _check(
        c.report_steps >= 0, "report_steps must be >= 0 (0: the report is written at the end only)"
    )
    _check(c.eval_steps >= 0, "eval_steps must be >= 0 (0: no periodic evaluation)")
    _check(c.max_eval_samples >= 0, "max_eval_samples must be >= 0")


_VALIDATORS = (
    _check_model,
    _check_objective,
    _check_frontier,
    _check_estimator,
    _check_reference,
    _check_generation,
    _check_vllm,
    _check_rewards,
    _check_optimization,
    _check_batch,
    _check_logging,
)


def _check_health(c: GRPOConfig) -> None:
    from grpokit.health import HEALTH_MODES, check_params, health_mode  # stdlib only

    _check(
        health_mode(c.health_checks) in HEALTH_MODES,
        f"health_checks={c.health_checks!r}: use warn (say it), stop (say it and end the run "
        "after a checkpoint) or off",
    )
    problem = check_params(c.health_params)
    _check(problem is None, str(problem))


# ---------------------------------------------------------------------- building
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(GRPOConfig)


_TYPE_WORDS = {
    list: "a list",
    dict: "a mapping",
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    type(None): "null",
}


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check/convert ``value`` to the annotated type ``tp``; raise ConfigError if it cannot be."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(key, value, typing.get_args(tp))
    if tp in _SCALARS:
        return _SCALARS[tp](key, value)
    for container in (list, dict):
        if tp is container or origin is container:
            if isinstance(value, (list, tuple) if container is list else dict):
                return container(value)
            raise ConfigError(f"{key}={value!r}: expected {_TYPE_WORDS[container]}")
    return value


def _coerce_union(key: str, value: Any, args: tuple) -> Any:
    """The first member of ``args`` (in annotation order) that takes ``value``."""
    if value is None and type(None) in args:
        return None
    for a in args:
        if a is type(None):
            continue
        try:
            return _coerce(key, value, a)
        except ConfigError:
            pass
    names = " or ".join(_TYPE_WORDS.get(a, getattr(a, "__name__", str(a))) for a in args)
    raise ConfigError(f"{key}={value!r}: expected {names}")


_BOOL_WORDS = ("true", "false", "1", "0", "yes", "no")
_FALSE_WORDS = ("false", "0", "no", "none", "null", "")


def _to_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _BOOL_WORDS:
        return value.lower() in ("true", "1", "yes")
    raise ConfigError(f"{key}={value!r}: expected true or false")


def _to_int(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise ConfigError(f"{key}={value!r}: expected an integer")


def _to_float(key: str, value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ConfigError(f"{key}={value!r}: expected a number")


def _to_str(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ConfigError(f"{key}={value!r}: expected a string")


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _did_you_mean(word: str, choices: list[str], cutoff: float) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def _unknown_key_error(key: str, valid: list[str]) -> ConfigError:
    hint = _did_you_mean(key, valid, cutoff=0.5)
    return ConfigError(f"unknown config key {key!r}{hint} (see README, 'Config keys')")


def _typed_values(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with each key checked against the config's fields and each value converted
    to its field's type; a key grpokit ignores is dropped with a warning."""
    hints = _field_types()
    clean: dict[str, Any] = {}
    switches = _trl_switches(values)
    for key, value in values.items():
        if key in switches:
            continue
        if key in IGNORED_KEYS:
            warnings.warn(
                f"{source}: key {key!r} is ignored by grpokit ({IGNORED_KEYS[key]})",
                stacklevel=3,
            )
            continue
        if key not in hints:
            raise _unknown_key_error(key, list(hints))
        clean[key] = _coerce(key, value, hints[key])
    for key, value in switches[None].items():
        clean[key] = _coerce(key, value, hints[key])
    return clean


# TRL's deprecated names -> the names grpokit (and TRL now) use
RENAMED_KEYS = {"vllm_importance_sampling_cap": "vllm_importance_sampling_clip_max"}


def _renamed(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with TRL's other names replaced by grpokit's (a warning for a deprecated
    one); both names at once is an error. A key of ``DEFAULT_ONLY_KEYS`` at its default is
    dropped, at any other value refused."""
    out = dict(values)
    if "chat_template_kwargs" in out and out["chat_template_kwargs"] is None:
        del out["chat_template_kwargs"]  # TRL's default
    for old, new in {**RENAMED_KEYS, **TRL_ALIASES}.items():
        if old not in out:
            continue
        if out[old] is None:  # TRL's "not set"
            del out[old]
            continue
        if new in out:
            raise ConfigError(f"{old} and {new} are the same setting: keep only {new}")
        if old in RENAMED_KEYS:
            warnings.warn(f"{source}: {old} is TRL's deprecated name of {new}", stacklevel=3)
        out[new] = out.pop(old)
    for key, fix in DEFAULT_ONLY_KEYS.items():
        if key in out:
            value = out.pop(key)
            if value and str(value).strip().lower() not in _FALSE_WORDS:
                raise ConfigError(f"{key}={value!r} is not supported by grpokit: {fix}")
    return out


def _trl_switches(values: dict[str, Any]) -> dict:
    """TRL switches grpokit has no field for but whose value changes what a run does: each one
    present is a key of the result (and so not warned about as ignored); the result's ``None``
    entry holds the fields they set. ``fp16: true`` (fp16 autocast with a loss scaler) is
    refused rather than silently trained in float32; ``eval_strategy: no`` turns periodic
    evaluation off as in TRL (the before/after evaluation stays: max_eval_samples)."""
    out: dict = {None: {}}
    _mapped_trl_keys(values, out)
    bf16 = values.get("bf16")
    if isinstance(bf16, str) and bf16.strip().lower() == "auto":
        out["bf16"] = True
        out[None]["bf16"] = _bf16_where_native(str(values.get("device", "auto")))
    elif bf16 is not None and not isinstance(bf16, bool) and str(bf16).lower() not in _BOOL_WORDS:
        raise ConfigError(f"bf16={bf16!r}: expected true, false or auto")
    if "fp16" in values:
        out["fp16"] = True
        if _to_bool("fp16", values["fp16"]):
            raise ConfigError(
                "fp16: true (fp16 autocast with a loss scaler) is not supported; use bf16: true, "
                "or torch_dtype: float16 (fp16 weights stepped through fp32 master weights)"
            )
    if "eval_strategy" in values:
        out["eval_strategy"] = True
        strategy = str(values["eval_strategy"]).lower()
        if strategy in ("no", "false"):  # YAML 1.1 reads an unquoted no as false
            out[None]["eval_steps"] = 0
        elif strategy != "steps":
            raise ConfigError(
                f"eval_strategy: {values['eval_strategy']!r} is not supported; use 'steps' "
                "with eval_steps, or 'no' (no periodic evaluation)"
            )
    return out


def _mapped_trl_keys(values: dict[str, Any], out: dict) -> None:
    """TRL keys that set grpokit keys: ``use_cpu`` (device cpu), ``vllm_server_base_url``
    (host and port), ``generation_kwargs`` (sampling keys), ``model_init_kwargs`` (model
    loading keys). Each present is marked in ``out``; the fields they set go to ``out[None]``."""
    fields = out[None]

    def put(src: str, key: str, value: Any) -> None:
        given = values.get(key, fields.get(key, value))
        if given != value:
            raise ConfigError(f"{key} is set twice, differently (by {src} too): keep one")
        fields[key] = value

    if "use_cpu" in values:
        out["use_cpu"] = True
        if _to_bool("use_cpu", values["use_cpu"]):
            put("use_cpu", "device", "cpu")
    if values.get("vllm_server_base_url"):
        out["vllm_server_base_url"] = True
        url = urllib.parse.urlsplit(str(values["vllm_server_base_url"]))
        if not url.hostname or not url.port:
            raise ConfigError(
                f"vllm_server_base_url={values['vllm_server_base_url']!r}: expected "
                "http://HOST:PORT (or set vllm_server_host and vllm_server_port)"
            )
        put("vllm_server_base_url", "vllm_server_host", url.hostname)
        put("vllm_server_base_url", "vllm_server_port", url.port)
    elif "vllm_server_base_url" in values:
        out["vllm_server_base_url"] = True
    for key, known in (
        ("generation_kwargs", GENERATION_KWARGS),
        ("model_init_kwargs", MODEL_INIT_KWARGS),
    ):
        if key not in values:
            continue
        out[key] = True
        given = values[key] or {}
        if not isinstance(given, dict):
            raise ConfigError(f"{key}={given!r}: expected a mapping")
        for k, v in given.items():
            if k not in known:
                raise ConfigError(
                    f"{key}: {k!r} is not supported by grpokit; it takes {', '.join(known)}"
                )
            put(key, known[k] if isinstance(known, dict) else k, v)


def _bf16_where_native(device: str) -> bool:
    """``bf16: auto`` (grpokit's value): bf16 autocast where the device computes bf16
    natively, float32 elsewhere. A CUDA GPU: ``torch.cuda.is_bf16_supported()``. A CPU:
    AVX512-BF16 or AMX-BF16; without them torch emulates bf16 products, measured ~500x slower
    than float32 on an AVX2 AMD EPYC (the laptop case). Said in one line."""
    import logging

    import torch

    from grpokit.speed.cpu import cpu_flags, has_native_bf16

    gpu = device.strip().lower() != "cpu" and torch.cuda.is_available()
    if gpu:
        native, where = bool(torch.cuda.is_bf16_supported()), "this GPU"
    else:
        native, where = bool(has_native_bf16(cpu_flags())), "this CPU"
    logging.getLogger("grpokit").info(
        "bf16: auto -> %s (%s %s native bf16)",
        "bf16 autocast" if native else "float32",
        where,
        "computes" if native else "has no",
    )
    return native


def _resolve_task(clean: dict[str, Any], source: str) -> None:
    """Name the task in ``clean``: the task of a dataset grpokit knows when a TRL / open-r1
    recipe names only ``dataset_name``; then check the name against the task registry.

    The only place the config reads ``grpokit.tasks``, and only here (not at import): which
    datasets a task reads, and which tasks exist, are the tasks' own knowledge (a task added
    with ``register_task`` counts too), so a copied list would drift from it."""
    from grpokit.tasks import registered_tasks, task_for_dataset

    if "task" not in clean and clean.get("dataset_name"):
        task = task_for_dataset(clean["dataset_name"])
        if task is not None:
            clean["task"] = task
        else:
            warnings.warn(
                f"{source}: no task named and dataset_name {clean['dataset_name']!r} is not a "
                f"dataset grpokit knows, so the default task {GRPOConfig.task!r} reads it; set "
                "task (math, gsm8k, countdown, tldr, custom, ...) if that is not its layout",
                stacklevel=3,
            )
    task, known = clean.get("task", GRPOConfig.task), registered_tasks()
    if task not in known:
        hint = _did_you_mean(task, known, cutoff=0.4)
        raise ConfigError(
            f"unknown task {task!r}{hint or '.'} Known: {', '.join(known)} (a new task is "
            "added with grpokit.tasks.register_task, see docs/tasks.md)"
        )


def build_config(values: dict[str, Any], *, source: str = "config") -> GRPOConfig:
    """Validate ``values`` (types, ranges, batch arithmetic, the task's name) and return a
    frozen config."""
    clean = _typed_values(_renamed(values, source), source)
    _resolve_task(clean, source)
    if clean.get("advantage_estimator") == "reinforce_plus_plus_baseline":
        clean.setdefault("scale_rewards", "batch")  # its own batch whitening, unless told
    return GRPOConfig(**clean)


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--beta", "0.04", "--use_peft", "--lr_scheduler_type=cosine"]`` -> dict.

    Values are read as YAML scalars/lists (``--reward_funcs "[a, b]"``); a flag without a
    value means true.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"unexpected argument {a!r}: overrides look like --key value")
        key = a[2:].replace("-", "_")
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            raw = args[i + 1]
            i += 2
        else:
            raw = "true"
            i += 1
        try:
            out[key] = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            out[key] = raw
    return out


def load_recipe(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"recipe {str(p)!r} does not exist; see recipes/ for examples")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {str(p)!r} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {str(p)!r} must be a mapping of config keys to values")
    return data


def load_config(
    recipe: str | os.PathLike | None = None, overrides: list[str] | None = None
) -> GRPOConfig:
    """Recipe file (optional) + ``--key value`` overrides -> validated frozen config."""
    values: dict[str, Any] = load_recipe(recipe) if recipe is not None else {}
    values.update(parse_overrides(overrides or []))
    return build_config(values, source=str(recipe) if recipe else "overrides")


def save_config(cfg: GRPOConfig, path: str | os.PathLike) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
