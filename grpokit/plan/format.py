"""``grpokit plan``'s table: the plan as readable text."""

from __future__ import annotations

from grpokit.config import GRPOConfig
from grpokit.plan.make import Plan
from grpokit.plan.memory import GB


def _gb(x: float) -> str:
    return f"{x / GB:8.2f} GB"


def _num(x: int | None) -> str:
    return "unknown" if x is None else f"{x:,}"


def format_plan(plan: Plan, cfg: GRPOConfig) -> str:
    """A readable table of the plan."""
    b, m, s = plan.batch, plan.memory, plan.shape
    lines = [
        f"model       {plan.model}",
        f"            {s.model_type}: {s.num_layers} layers, hidden {s.hidden_size}, "
        f"heads {s.num_heads}/{s.num_kv_heads} kv x {s.head_dim}, mlp {s.intermediate_size}, "
        f"vocab {s.vocab_size}{', tied embeddings' if s.tie_word_embeddings else ''}",
        f"            (shape from {s.source})",
        f"parameters  {_num(plan.params['total'])} total, {_num(m['trainable_params'])} trainable"
        + (f" (LoRA r={cfg.lora_r})" if cfg.use_peft else ""),
        "",
        "batch",
        f"  processes                              {b.num_processes}",
        f"  completions per optimizer step         {b.completions_per_step} "
        f"(= {b.micro_batch} per micro-batch x {b.gradient_accumulation_steps} accumulation "
        f"x {b.num_processes} processes)",
        f"  prompts per step                       {b.prompts_per_step} "
        f"(x {b.num_generations} generations)",
        f"  generation batch per process           {b.generation_batch} completions "
        f"({b.prompts_per_process} prompts)",
        f"  completions per micro-batch            {b.micro_batch}",
        f"  training prompts                       {_num(b.train_rows)}",
        f"  optimizer steps                        {_num(b.optimizer_steps)}",
        f"  steps per epoch                        {_num(b.steps_per_epoch)}",
        f"  tokens generated, at most              {_num(b.max_tokens_generated)}",
        "",
        f"memory per device (weights {m['weights_dtype']}"
        + (", bf16 autocast" if cfg.bf16 else "")
        + (f", ZeRO-{plan.zero_stage}" if plan.zero_stage else "")
        + f"; sequence {m['sequence_length']} tokens)",
        f"  process baseline (python, torch)       {_gb(m['baseline'])}",
        f"  weights                                {_gb(m['weights'])}",
        f"  reference model                        {_gb(m['reference'])}",
        f"  {'AdamW states (' + cfg.optim + ')':<39}{_gb(m['optimizer'])}",
        f"  {'fp32 master weights':<39}{_gb(m['master_weights'])}",
        f"  gradients                              {_gb(m['gradients'])}",
        f"  autocast bf16 weight copies            {_gb(m['autocast_weights'])}",
        f"  {'activations, micro-batch of ' + str(b.micro_batch):<39}{_gb(m['activations'])}"
        f"   (checkpointing {'on' if cfg.gradient_checkpointing else 'off'}; "
        f"off {m['activations_no_ckpt'] / GB:.2f} GB, on {m['activations_ckpt'] / GB:.2f} GB)",
        f"  logits + log-softmax                   {_gb(m['logits'])}",
        f"  {'KV cache, ' + str(m['generation_batch']) + ' sequences':<39}{_gb(m['kv_cache'])}",
        f"  sampling temporaries                   {_gb(m['generation_temporaries'])}",
        f"  sampling copy of the weights (whole)   {_gb(m['sampling_copy'])}",
        f"  peak = static + max(training {m['training_phase'] / GB:.2f}, generation "
        f"{m['generation_phase'] / GB:.2f})",
        f"  ESTIMATED PEAK                         {_gb(m['peak'])}"
        + (f"  of {plan.device_memory / GB:.1f} GB" if plan.device_memory else ""),
    ]
    for w in plan.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)
