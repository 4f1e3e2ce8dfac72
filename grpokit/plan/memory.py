"""Bytes per device, by component: a plain formula of the config and the model's shape for
each, checked against measured peak RSS in docs/plan.md.

    peak = baseline + weights + reference + sampling copy + optimizer + master weights
           + max(training phase, generation phase)
"""

from __future__ import annotations

from typing import Any

from grpokit.config import OPTIMS_8BIT, GRPOConfig
from grpokit.dynamic import AUTO_MAX_CALL
from grpokit.plan.params import lora_param_count, param_counts
from grpokit.plan.shape import ModelShape

GB = 1e9
# Resident memory of a grpokit training process apart from the model: python, torch,
# transformers, tokenizer, data. Measured on CPU: a whole 2-step run of the tiny test
# model peaks at 0.41 GB (docs/plan.md).
PROCESS_BASELINE_BYTES = int(0.4 * GB)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def activation_bytes_per_token_layer(
    m: ModelShape, s: int, autocast: bool, lean: bool = False
) -> int:
    """Bytes one decoder layer keeps for backward, per token (no gradient checkpointing).

    With h hidden, a/k query/kv heads, d head_dim, I intermediate, s the activation bytes
    (2 under bf16 autocast or 16-bit weights, else 4), c = 3 copies of the normed input for
    q/k/v and 2 for gate/up under autocast (it casts the fp32 input once per linear), else 1:

        s * (c_qkv*h + 3*a*d + 3*k*d + c_mlp*h + 4*I) + 2 norms * 2*h * 4

    3*a*d: q before and after RoPE and the attention output (= o_proj input); 3*k*d: k
    before and after RoPE, and v (SDPA runs GQA without expanding k/v and keeps no (T, T)
    score matrix); 4*I: gate and up outputs, silu(gate), and the product (down_proj input);
    each RMSNorm keeps its fp32 input and normalised output. With ``lean``
    (``grpokit.speed.layers``, the training forward without checkpointing): a gated SiLU MLP
    keeps gate and up only (2*I: silu(gate) and the product are made again in the backward)
    and Llama's RMSNorm its input only (h, and a (tokens, 1) reciprocal).
    """
    h, a, k, d, ffn = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size
    c_qkv, c_mlp = (3, 2) if autocast else (1, 1)
    n_ffn = 2 if lean and m.gated_silu else 4
    n_norm = 1 if lean and m.llama_norm else 2
    return s * (c_qkv * h + 3 * a * d + 3 * k * d + c_mlp * h + n_ffn * ffn) + 2 * n_norm * h * 4


def logits_bytes(batch: int, completion: int, vocab: int, s: int) -> int:
    """Logits of a micro-batch: only the completion positions are computed (logits_to_keep).

    (B, C+1, V) lm_head output and the (B, C, V) temperature-scaled copy in activation
    dtype s, plus the (B, C, V) fp32 upcasts that log-softmax (logsumexp) keeps for
    backward; in fp32 the upcast is the scaled copy itself. The entropy's (1, C, V) fp32
    temporaries are transient, one sequence at a time.
    """
    bcv = batch * completion * vocab
    return bcv * (2 * s + (4 if s < 4 else 0)) + 3 * completion * vocab * 4


def precision(cfg: GRPOConfig, m: ModelShape) -> tuple[str, int, bool, int]:
    """(weights dtype, bytes per weight, bf16 autocast over fp32 weights, activation bytes)."""
    dtype = m.dtype if cfg.torch_dtype == "auto" else cfg.torch_dtype
    wb = DTYPE_BYTES.get(dtype, 4)
    autocast = cfg.bf16 and wb == 4
    s = 2 if (autocast or wb == 2) else 4
    return dtype, wb, autocast, s


def forward_rows(cfg: GRPOConfig, T: int) -> int:
    """Rows one training forward holds at T tokens a row: the micro-batch, cut by
    ``max_micro_batch_tokens`` (bnpo keeps whole micro-batches)."""
    B, bound = cfg.per_device_train_batch_size, cfg.max_micro_batch_tokens
    if not bound or cfg.loss_type == "bnpo":
        return B
    return max(1, min(B, bound // max(T, 1)))


def training_activations(
    cfg: GRPOConfig, m: ModelShape, s: int, autocast: bool, T: int
) -> tuple[int, int]:
    """Activations one forward of B sequences of T tokens keeps for backward:
    (without gradient checkpointing, with it). Without: L * per-token-layer bytes * B * T.
    With: each layer's input (fp32 under autocast) plus one layer's activations recomputed
    (by transformers' own layers, so without the lean MLP)."""
    B, L = forward_rows(cfg, T), m.num_layers
    per_tok = activation_bytes_per_token_layer(m, s, autocast)
    full = L * activation_bytes_per_token_layer(m, s, autocast, lean=True) * B * T
    ckpt = L * B * T * m.hidden_size * (4 if autocast else s) + per_tok * B * T
    return full, ckpt


def generation_memory(
    cfg: GRPOConfig, m: ModelShape, s: int, P: int, C: int
) -> tuple[int, int, int]:
    """(KV cache, sampling temporaries, sequences) of the largest generation call: the
    training rollout (micro-batch x accumulation sequences of P + C tokens) or, if larger,
    the eval batch; with dynamic sampling the largest call (``gen_batch_size`` prompts, or
    auto up to ``AUTO_MAX_CALL`` x the step's). KV = 2 * L * kv heads * head_dim * tokens *
    sequences * s; temporaries: three fp32 (sequences, V) rows and the prompt's prefill
    activations."""
    gen_batch = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    if cfg.dynamic_sampling:
        per_call = cfg.gen_batch_size // cfg.world_size * cfg.num_generations
        gen_batch = per_call or AUTO_MAX_CALL * gen_batch
    gen_len = P + C
    if cfg.do_eval is not False and cfg.max_eval_samples > 0:
        eval_len = P + (cfg.eval_max_completion_length or C)
        eval_batch = min(cfg.per_device_eval_batch_size, cfg.max_eval_samples)
        if eval_batch * eval_len > gen_batch * gen_len:
            gen_batch, gen_len = eval_batch, eval_len
    kv = 2 * m.num_layers * m.num_kv_heads * m.head_dim * gen_len * gen_batch * s
    gen_tmp = (
        gen_batch * m.vocab_size * 4 * 3
        + gen_batch * P * (4 * m.hidden_size + 3 * m.intermediate_size) * s
    )
    return kv, gen_tmp, gen_batch


def optimizer_bytes_per_param(cfg: GRPOConfig) -> float:
    """AdamW's two moments per trainable parameter: fp32 (8 bytes; fp32 too when the weights
    are bf16, whose fp32 master copies step), or bitsandbytes' 8-bit blockwise states (two
    uint8 plus two fp32 absmax per block of 256: 2.03 bytes; its tensors under 4096 elements,
    such as norms, keep fp32 states and are ignored here)."""
    return 2 + 2 * 4 / 256 if cfg.optim in OPTIMS_8BIT else 8


def sampling_copy_bytes(cfg: GRPOConfig, params: int, wb: int, zero_stage: int) -> int:
    """bf16 full fine-tuning samples from a bf16 copy of the weights (rollout/hf.py); with
    sharded weights (ZeRO-3, FSDP) sampling always uses a whole, unsharded copy. Either is
    held during generation only."""
    if zero_stage >= 3 and not cfg.use_peft:
        return params * (2 if cfg.bf16 else wb)
    if cfg.bf16 and cfg.bf16_sampling_copy and not cfg.use_peft:
        return params * 2
    return 0


def estimate_memory(
    cfg: GRPOConfig,
    m: ModelShape,
    *,
    num_processes: int = 1,
    zero_stage: int = 0,
    prompt_length: int | None = None,
) -> dict[str, Any]:
    """Bytes per device, by component. ``prompt_length`` defaults to max_prompt_length.

    peak = baseline + weights + reference + optimizer + master weights
           + max(training phase, generation phase)
    training phase = gradients + autocast weight copies + activations of one micro-batch
    generation phase = KV cache + sampling temporaries + the bf16 sampling copy
    (gradients are freed after each optimizer step, so they do not meet the KV cache; the
    sampling copy's weights are freed after each round's generation, ``rollout/hf.py``).
    ZeRO-1 shards the optimizer states over processes, ZeRO-2 also the gradients, ZeRO-3
    also the weights (policy and reference).
    """
    params = param_counts(m)["total"]
    dtype, wb, autocast, s = precision(cfg, m)
    if cfg.use_peft:
        trainable, tb = lora_param_count(m, cfg.lora_r, cfg.lora_target_modules), 4
    else:
        trainable, tb = params, wb
    n = max(1, num_processes)
    shard_opt, shard_grad, shard_w = (n if zero_stage >= k else 1 for k in (1, 2, 3))
    P = prompt_length if prompt_length is not None else (cfg.max_prompt_length or 512)
    C = cfg.max_completion_length
    full_acts, ckpt_acts = training_activations(cfg, m, s, autocast, P + C)
    kv, gen_tmp, gen_batch = generation_memory(cfg, m, s, P, C)
    out: dict[str, Any] = {
        "params": params,
        "trainable_params": trainable,
        "weights_dtype": dtype,
        "activation_bytes": s,
        "baseline": PROCESS_BASELINE_BYTES,
        "weights": params * wb // shard_w,
        "reference": (params * wb // shard_w) if cfg.beta > 0 and not cfg.use_peft else 0,
        "optimizer": int(trainable * optimizer_bytes_per_param(cfg)) // shard_opt,
        # bf16/fp16 trainable weights: their fp32 master copies (optimizer state, sharded so)
        "master_weights": (trainable * 4 if tb < 4 else 0) // shard_opt,
        # fp32: the master copies' gradients are fp32 too
        "gradients": trainable * 4 // shard_grad,
        "autocast_weights": params * 2 if autocast else 0,
        "sampling_copy": sampling_copy_bytes(cfg, params, wb, zero_stage),
        "activations": ckpt_acts if cfg.gradient_checkpointing else full_acts,
        "activations_no_ckpt": full_acts,
        "activations_ckpt": ckpt_acts,
        "logits": logits_bytes(forward_rows(cfg, P + C), C, m.vocab_size, s),
        "kv_cache": kv,
        "generation_temporaries": gen_tmp,
        "generation_batch": gen_batch,
        "sequence_length": P + C,
    }
    return _with_peak(out)


def _with_peak(out: dict[str, Any]) -> dict[str, Any]:
    """Add the two phases and the peak to the components of ``estimate_memory``."""
    train = out["gradients"] + out["autocast_weights"] + out["activations"] + out["logits"]
    gen = out["kv_cache"] + out["generation_temporaries"] + out["sampling_copy"]
    out["training_phase"] = train
    out["generation_phase"] = gen
    static = ("baseline", "weights", "reference", "optimizer", "master_weights")
    out["peak"] = sum(out[k] for k in static) + max(train, gen)
    return out
