"""The one place a run's config is unpacked into its parts: task and data, rewards, models,
rollout engines, optimizer and schedule, the training strategy. The trainer receives the
parts (``Parts``) and never reads a model or engine setting itself.

Order matters and is kept: cheap checks first (task, rewards, batch arithmetic) before any
model loads, and the random draws (LoRA initialisation, ...) happen in the same order as
always, after ``torch.manual_seed(cfg.seed)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpokit import distributed as dist
from grpokit.algo import AdaptiveEntropy
from grpokit.batch import MicroBatchPlan
from grpokit.config import ConfigError, GRPOConfig, check_processes
from grpokit.dynamic import CallSizes
from grpokit.evaluation import held_out_rows
from grpokit.forward import LogProbs, cast_lm_head_to_fp32, is_checkpointing
from grpokit.launch import Launch, check_launch
from grpokit.optim import (
    EIGHT_BIT,
    LOW_PRECISION,
    FreedGradients,
    KeptGradients,
    allocate_state,
    build_optimizer,
    build_scheduler,
    params_to_clip,
)
from grpokit.prompts import PromptSampler, bind_chat_template_kwargs
from grpokit.reference import Reference, frozen_copy
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.scoring import reward_name
from grpokit.speed.cpu import warn_if_bf16_is_emulated
from grpokit.speed.pool import install as install_pool
from grpokit.speed.weights import sparse_tied_embedding_grad
from grpokit.tools.template import named_chat_template
from grpokit.update import GradientPass, SamplingCorrection


def preflight(
    cfg: GRPOConfig,
    launch: Launch,
    num_processes: int,
    device: torch.device,
    check_packages: bool = True,
):
    """Every refusal a run makes before any model loads, in one place: ``grpokit train``
    calls it at start with its own launch, ``grpokit plan`` with the launch it is asked
    about (``--accelerate_config``, ``--num_processes``), so plan refuses what train would:
    the config's process-count checks, the launch checks, the task, and (``check_packages``:
    where training runs, not where it is planned) the packages the recipe needs (deepspeed,
    vllm) and the rewards (reward models load their weights onto ``device``). Returns
    (task, rewards or None) for the run to keep. The row count against the prompts per
    step is ``PromptSampler``'s check, which both reach."""
    check_processes(cfg, num_processes)
    check_launch(cfg, launch, device, deepspeed_installed=None if check_packages else True)
    if check_packages and cfg.use_vllm:
        from grpokit.rollout.vllm_engine import VLLMError, require_vllm

        try:
            require_vllm()
        except VLLMError as e:
            raise ConfigError(f"{e}; or set use_vllm: false") from e
    task = build_task(cfg)
    load_agent_tools(cfg)  # a tools entry that names nothing fails before any model loads
    if not check_packages:  # planning: reward models are weights, which plan never loads
        return task, None
    return task, build_rewards(cfg, task, device)


def build_task(cfg: GRPOConfig):
    """The task named by the config, with its dataset, system prompt, seed and params."""
    from grpokit.tasks import get_task

    return get_task(
        cfg.task,
        dataset_name=cfg.dataset_name,
        dataset_config=cfg.dataset_config,
        system_prompt=cfg.system_prompt,
        seed=cfg.seed if cfg.data_seed is None else cfg.data_seed,
        dataset_prompt_column=cfg.dataset_prompt_column,
        train_split=cfg.dataset_train_split,
        **cfg.task_params,
    )


# the errors get_reward_funcs raises for an entry it cannot make (unknown name, bad
# parameter, missing plugin file, module or name); a reward model's are ModelSourceErrors
SPEC_ERRORS = (KeyError, TypeError, ValueError, FileNotFoundError, ImportError, AttributeError)


@dataclass
class Rewards:
    funcs: list
    weights: torch.Tensor  # (F,) float32
    names: list[str]
    environments: Any = None  # tools.Environments (environment_factory), whose get_reward is one


def build_rewards(cfg: GRPOConfig, task, device: torch.device | None = None) -> Rewards:
    """The recipe's reward functions and weights, or the task's defaults. Reward models
    (sequence classifiers) load in the run's dtype onto ``device``, the training device."""
    from grpokit.rewards import get_reward_funcs

    specs = cfg.reward_funcs if cfg.reward_funcs is not None else list(task.default_reward_funcs)
    if not specs:
        raise ConfigError(
            f"task {cfg.task!r} has no default rewards; set reward_funcs in the recipe"
        )
    try:
        funcs = get_reward_funcs(
            specs,
            processing_classes=cfg.reward_processing_classes,
            device=device if device is not None else torch.device("cpu"),
            dtype=cfg.torch_dtype,
            trust_remote_code=cfg.trust_remote_code,
        )
    except SPEC_ERRORS as e:  # what get_reward_funcs says about an entry: one line
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise ConfigError(f"reward_funcs: {message}") from e
    if cfg.reward_weights is not None:
        weights = list(cfg.reward_weights)
    elif cfg.reward_funcs is None and task.default_reward_weights is not None:
        weights = list(task.default_reward_weights)
    else:
        weights = [1.0] * len(funcs)
    if len(weights) != len(funcs):
        raise ConfigError(
            f"{len(weights)} reward_weights for {len(funcs)} reward_funcs (the task's defaults "
            "when reward_funcs is unset); give one weight per function"
        )
    envs = build_environments(cfg)
    if envs is not None and envs.reward_function() is not None:  # TRL: weight 1, its class name
        funcs, weights = [*funcs, envs.reward_function()], [*weights, 1.0]
    return Rewards(
        funcs, torch.tensor(weights, dtype=torch.float32), [reward_name(f) for f in funcs], envs
    )


def load_agent_tools(cfg: GRPOConfig) -> list:
    """The recipe's ``tools`` (functions and JSON schemas), or a one-line ConfigError."""
    from grpokit.tools import ToolSpecError, load_tools

    try:
        return load_tools(cfg.tools)
    except ToolSpecError as e:
        raise ConfigError(str(e)) from None


def build_environments(cfg: GRPOConfig):
    """The recipe's ``environment_factory`` environments, or None."""
    if cfg.environment_factory is None:
        return None
    from grpokit.tools import Environments, ToolSpecError

    try:
        return Environments(cfg.environment_factory)
    except ToolSpecError as e:
        raise ConfigError(str(e)) from None


def build_agent(cfg: GRPOConfig, m: Models, rewards: Rewards, rows: Sequence):
    """The multi-turn rollouts (``rollout/agent.py``) when the recipe has tools or an
    environment_factory, else None. The chat template must have a tool format."""
    if not cfg.tools and cfg.environment_factory is None:
        return None
    if len(rows) and isinstance(rows[0]["prompt"], str):
        raise ConfigError(
            f"tools / environment_factory need chat prompts (messages); task {cfg.task!r} "
            "gives plain strings"
        )
    return make_agent(cfg, m.tokenizer, m.model, rewards.environments, cfg.model_name_or_path)


def make_agent(cfg: GRPOConfig, tokenizer, model, environments, model_name: str):
    """The ``Agent`` of ``cfg``'s tools and tool settings over ``environments`` (the
    trainer's, or ``build_environments(cfg)`` for an evaluation); one-line ConfigErrors."""
    from grpokit.rollout.agent import Agent
    from grpokit.tools import ToolFormatError

    try:
        return Agent(
            tokenizer, load_agent_tools(cfg), environments,
            max_iterations=cfg.max_tool_calling_iterations,
            timeout=cfg.tool_timeout,
            max_prompt_length=cfg.max_prompt_length, prompt_truncation=cfg.prompt_truncation,
            model=model_name, vocab_size=int(getattr(model.config, "vocab_size", 0)),
        )  # fmt: skip
    except ToolFormatError as e:
        raise ConfigError(str(e)) from None


@dataclass
class Data:
    task: Any
    train_rows: Sequence  # rows made when read (grpokit.tasks.base.SourceRows) or a list
    eval_rows: Sequence
    sampler: PromptSampler
    prompts_per_rank: int
    call_sizes: CallSizes  # dynamic sampling: prompts a generation call draws
    total_steps: int
    save_every: int  # optimizer steps between checkpoints (0: none before the end)


def build_data(cfg: GRPOConfig, task) -> Data:
    """Training and held-out rows, the seeded prompt order, and the number of steps."""
    train_rows = task.build(cfg.dataset_train_split, limit=cfg.max_train_samples)
    eval_rows = held_out_rows(cfg, task)
    W = dist.world_size()  # prompts_per_step % W == 0: config.check_processes
    sampler = PromptSampler(len(train_rows), cfg.prompts_per_step, cfg.seed, cfg.shuffle_dataset)
    if cfg.max_steps > 0:
        total = cfg.max_steps
    else:
        total = math.ceil(cfg.num_train_epochs * sampler.batches_per_epoch) * cfg.num_iterations
    per_rank = cfg.prompts_per_step // W
    if cfg.gen_batch_size > len(train_rows):
        raise ConfigError(
            f"gen_batch_size={cfg.gen_batch_size} prompts a generation call, but the training "
            f"set has {len(train_rows)}; lower it (0: sized automatically)"
        )
    sizes = CallSizes(
        per_rank, cfg.gen_batch_size // W, cfg.max_num_gen_batches, len(train_rows) // W
    )
    return Data(
        task, train_rows, eval_rows, sampler, per_rank, sizes, total,
        save_every=save_every(cfg, sampler.batches_per_epoch),
    )  # fmt: skip


def save_every(cfg: GRPOConfig, batches_per_epoch: int) -> int:
    """save_strategy in optimizer steps: save_steps; an epoch (every batch of the training
    prompts once, each batch giving num_iterations steps); or 0 (no checkpoints)."""
    if cfg.save_strategy == "epoch":
        return batches_per_epoch * cfg.num_iterations
    return cfg.save_steps if cfg.save_strategy == "steps" else 0


@dataclass
class Models:
    model: Any  # the policy being trained (prepared by the strategy)
    tokenizer: Any
    source: Any  # where the weights came from (models.ModelSource)
    ref_copy: Any  # frozen reference copy, or None (beta 0, or LoRA: adapter-off base)
    amp_dtype: torch.dtype | None


def disable_dropout(model: torch.nn.Module) -> int:
    """Every dropout of ``model`` set to 0, as TRL's ``disable_dropout``: its ``nn.Dropout``
    modules (LoRA's included) and the attention-probability dropout layers keep as a float
    (``attention_dropout``, which TRL leaves). Returns how many were above 0."""
    n = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.Dropout):
            n += mod.p > 0
            mod.p = 0.0
        p = getattr(mod, "attention_dropout", None)
        if isinstance(p, float) and not isinstance(mod, torch.nn.Dropout):
            n += p > 0
            mod.attention_dropout = 0.0
    return n


def build_models(cfg: GRPOConfig, device: torch.device, strategy) -> Models:
    from grpokit.models import load_model_and_tokenizer

    if device.type == "cpu" and cfg.cpu_memory_pool:  # before any weight (speed/pool.py)
        install_pool()
    model, tokenizer, source = load_model_and_tokenizer(
        cfg.model_name_or_path,
        dtype=cfg.torch_dtype,
        use_peft=cfg.use_peft,
        lora_r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        lora_target_modules=cfg.lora_target_modules,
        gradient_checkpointing=cfg.gradient_checkpointing,
        trust_remote_code=cfg.trust_remote_code,
        chat_template=named_chat_template(cfg.chat_template),
        revision=cfg.model_revision,
        attn_implementation=cfg.attn_implementation,
        device_type=device.type,
    )
    bind_chat_template_kwargs(tokenizer, cfg.chat_template_kwargs)
    model.to(device)
    model.train()
    if cfg.disable_dropout:  # before the reference copy, as TRL
        disable_dropout(model)
    if cfg.cast_lm_head_to_fp32:  # before the reference copy: it is cast too (as TRL)
        cast_lm_head_to_fp32(model)
    amp_dtype = torch.bfloat16 if cfg.bf16 else None
    fix = " ".join(
        ["--bf16 false"] * cfg.bf16 + ["--torch_dtype float32"] * (cfg.torch_dtype == "bfloat16")
    )
    warn_if_bf16_is_emulated(bool(fix), device.type, fix=fix)
    ref = None
    if cfg.beta > 0 and not cfg.use_peft:  # with LoRA the reference is the adapter-disabled base
        # bf16 weights stored once, unless mixed with the policy or handed to a sharding engine
        lower = not cfg.sync_ref_model and not strategy.sharded
        ref = frozen_copy(model, amp_dtype, lower_linears=lower)
    return Models(model, tokenizer, source, ref, amp_dtype)


def build_engines(cfg: GRPOConfig, m: Models, strategy):
    """(rollout engine, held-out evaluation engine, sampling parameters)."""
    if cfg.use_vllm:
        engine = _vllm_engine(cfg, m)
    else:
        engine = HFRolloutEngine(
            m.model,
            m.tokenizer,
            autocast_dtype=m.amp_dtype,
            loop=cfg.generation_loop,
            fused_decode=cfg.fused_decode,
            share_prefix=cfg.share_prompt_prefix,
            # bf16 runs sample from a bf16 copy of the weights (LoRA merged in; see there)
            sampling_dtype=m.amp_dtype if cfg.bf16_sampling_copy else None,
        )
    # held-out evaluation decodes with the training model itself (autocast when bf16)
    eval_engine = HFRolloutEngine(
        m.model,
        m.tokenizer,
        autocast_dtype=m.amp_dtype,
        loop=cfg.generation_loop,
        fused_decode=cfg.fused_decode,
        share_prefix=cfg.share_prompt_prefix,
    )
    if strategy.sharded:  # sample and evaluate from an unsharded copy, refreshed each update
        engine.build_copy(m.amp_dtype or next(m.model.parameters()).dtype)
        eval_engine = engine
    sampling = SamplingParams(
        max_new_tokens=cfg.max_completion_length,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        min_p=cfg.min_p,
        repetition_penalty=cfg.repetition_penalty,
    )
    return engine, eval_engine, sampling


def _vllm_engine(cfg: GRPOConfig, m: Models):
    from grpokit.rollout.vllm_engine import VLLMColocateEngine, VLLMServerEngine

    if cfg.vllm_mode == "server":
        return VLLMServerEngine(
            m.model,
            m.tokenizer,
            cfg.vllm_server_host,
            cfg.vllm_server_port,
            cfg.vllm_server_timeout,
        )
    max_len = cfg.vllm_max_model_len
    if max_len is None and cfg.max_prompt_length is not None:
        max_len = cfg.max_prompt_length + cfg.max_completion_length
        limit = getattr(m.model.config, "max_position_embeddings", None)
        if limit:  # vLLM refuses a longer context than the model's
            max_len = min(max_len, int(limit))
    dtype = "bfloat16" if cfg.bf16 else cfg.torch_dtype
    # vLLM's CPU worker binds this process's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND)
    # and from then on turns torch.set_num_threads into a no-op with a warning
    return VLLMColocateEngine(
        m.model,
        m.tokenizer,
        m.source.path,
        revision=m.source.revision,
        dtype="auto" if dtype == "auto" else dtype,
        max_model_len=max_len,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        enable_sleep_mode=cfg.vllm_enable_sleep_mode,
        enforce_eager=cfg.vllm_enforce_eager,
        seed=cfg.seed,
    )


@dataclass
class Optimization:
    params: list
    optimizer: Any
    scheduler: Any
    reference: Reference
    logprobs: LogProbs
    plan: MicroBatchPlan
    gradients: GradientPass
    grads: KeptGradients | FreedGradients  # the buffers between steps


def build_optimization(cfg, m: Models, engine, strategy, device, total_steps: int):
    """Optimizer and schedule, the strategy's preparation of the policy (sharding), and the
    pieces of a step: log-prob forward, micro-batch plan, reference, gradient pass. Replaces
    ``m.model`` and ``m.ref_copy`` by their prepared versions."""
    params = [p for p in m.model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    if strategy.sharded:
        _check_sharded_optimizer(cfg, params, strategy)
    optimizer = build_optimizer(params, cfg)
    if strategy.sharded:
        m.model, optimizer, m.ref_copy = strategy.prepare(m.model, optimizer, m.ref_copy)
        engine.model = m.model
        engine.full_params = lambda: strategy.full_params(m.model)
        params = [p for p in m.model.parameters() if p.requires_grad]
    else:
        sparse_tied_embedding_grad(m.model)
    params = params_to_clip(optimizer, params)  # the fp32 master weights when there are any
    if strategy.sharded:
        grads = FreedGradients(optimizer)
    else:
        grads = KeptGradients(params)
        allocate_state(optimizer)
    logprobs, gradients = _step_pieces(cfg, m, strategy, device)
    reference = Reference(
        m.model,
        m.ref_copy,
        sync_steps=cfg.ref_model_sync_steps if cfg.sync_ref_model else None,
        mix_alpha=cfg.ref_model_mixup_alpha,
    )
    plan = MicroBatchPlan(
        cfg.per_device_train_batch_size,
        cfg.num_generations,
        share=cfg.share_prompt_forward,
        fixed=strategy.fixed_micro_batches,
        **forward_bounds(cfg),
    )
    scheduler = build_scheduler(optimizer, cfg, total_steps)
    return Optimization(params, optimizer, scheduler, reference, logprobs, plan, gradients, grads)


def forward_bounds(cfg: GRPOConfig) -> dict[str, int | None]:
    """The token positions (``max_tokens``: ``max_micro_batch_tokens``) and rows
    (``max_rows``) one training or reference forward may hold. Merged micro-batches
    (``merge_micro_batches``) take any number of the step's rows within ``max_tokens`` and
    within the positions of one micro-batch padded to the step's longest prompt and
    completion (``MicroBatchPlan``), so no forward holds more activations than the user's
    ``per_device_train_batch_size`` padded as TRL pads it would on that step. Not merged
    where the partition is part of the loss: bnpo's per-micro-batch mean,
    ``top_entropy_quantile`` < 1 (its quantile is over one forward's tokens); sharded engines
    cut fixed micro-batches anyway (batch.py)."""
    merge = cfg.merge_micro_batches and cfg.loss_type != "bnpo" and cfg.top_entropy_quantile >= 1.0
    return {
        "max_tokens": cfg.max_micro_batch_tokens or None,
        "max_rows": cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
        if merge
        else None,
    }


def _check_sharded_optimizer(cfg, params: list, strategy) -> None:
    """FSDP and DeepSpeed own the optimizer's sharding: grpokit's fp32 master weights and
    bitsandbytes' 8-bit AdamW are for unsharded training only."""
    where = strategy.launch.describe()
    if any(p.dtype in LOW_PRECISION for p in params):
        raise ConfigError(
            f"torch_dtype {cfg.torch_dtype} (bf16/fp16 trainable weights) under {where}: "
            "grpokit keeps fp32 master weights only without sharding; use torch_dtype: "
            "float32 with bf16: true, or torchrun / recipes/accelerate/multi_gpu.yaml"
        )
    if cfg.optim in EIGHT_BIT:
        raise ConfigError(
            f"optim {cfg.optim} under {where} is not supported; use optim: adamw_torch_fused, "
            "or torchrun / recipes/accelerate/multi_gpu.yaml"
        )


def _step_pieces(cfg, m: Models, strategy, device):
    """The log-prob forward and the gradient pass of an optimizer step."""
    # checkpointed layers recompute their forward inside the backward, outside the route:
    # they keep transformers' SDPA for both
    own_attention = (
        cfg.attention_backward and device.type == "cpu" and not is_checkpointing(m.model)
    )
    entropy = AdaptiveEntropy(
        cfg.entropy_coef,
        adaptive=cfg.use_adaptive_entropy,
        coef_min=cfg.entropy_coef_min,
        coef_max=cfg.entropy_coef_max,
        delta=cfg.entropy_coef_delta,
        target=cfg.entropy_target,
    )
    logprobs = LogProbs(
        temperature=cfg.temperature,
        amp_dtype=m.amp_dtype,
        fused=cfg.fused_logprobs,
        share_prompts=cfg.share_prompt_forward,
        entropy_grad=entropy.enabled,
    )
    loss_args = dict(
        loss_type=cfg.loss_type,
        epsilon_low=cfg.epsilon,
        epsilon_high=cfg.epsilon_high,
        beta=cfg.beta,
        importance_sampling_level=cfg.importance_sampling_level,
        max_completion_length=cfg.max_completion_length,
        **_frontier_loss_args(cfg),
    )
    correction = SamplingCorrection(
        mode=cfg.vllm_importance_sampling_mode,
        clip_max=cfg.vllm_importance_sampling_clip_max,
        clip_min=cfg.vllm_importance_sampling_clip_min,
        apply=cfg.vllm_importance_sampling_correction,
    )
    gradients = GradientPass(
        m.model,
        logprobs,
        strategy,
        loss_args=loss_args,
        record_old_logp=cfg.num_iterations > 1,
        correction=correction,
        own_attention_backward=own_attention,
        entropy=entropy,
        micro_batch_rows=cfg.per_device_train_batch_size,
    )
    return logprobs, gradients


def hub(cfg: GRPOConfig):
    """The Hub uploader of the main process when push_to_hub is on, after checking (before
    any model loads) that the uploads can work; None otherwise."""
    if not cfg.push_to_hub or not dist.is_main():
        return None
    from grpokit.hub import hub_for

    return hub_for(cfg)


def _frontier_loss_args(cfg: GRPOConfig) -> dict[str, Any]:
    """The newer losses' and stabilisers' keywords of ``algo.policy_loss`` (at their
    defaults the older loss types run exactly the operations they always ran)."""
    keys = (
        "delta", "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos",
        "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "top_entropy_quantile",
        "off_policy_mask_threshold", "use_bias_correction_kl",
    )  # fmt: skip
    return {k: getattr(cfg, k) for k in keys}


def trackers(cfg: GRPOConfig) -> list:
    names = [cfg.report_to] if isinstance(cfg.report_to, str) else list(cfg.report_to)
    names = [n for n in names if n != "none"]
    if not names or not dist.is_main():
        return []
    from grpokit.trackers import make_trackers

    return make_trackers(names, cfg)
