"""``grpokit plan``: batch arithmetic and a memory estimate per device, before any weights load.

Only the model's ``config.json`` is read (a local directory, the hub cache, or
``AutoConfig`` for a hub id), so a plan costs a second. Every number is a plain formula of
the config; the formulas are stated on the functions below and checked against measured
peak RSS in docs/plan.md.

    from grpokit.config import load_config
    from grpokit.plan import make_plan, format_plan
    print(format_plan(make_plan(load_config("recipes/gsm8k.yaml"))))
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpokit.config import GRPOConfig

GB = 1e9
# Resident memory of a grpokit training process apart from the model: python, torch,
# transformers, tokenizer, data. Measured on CPU: a whole 2-step run of the tiny test
# model peaks at 0.41 GB (docs/plan.md).
PROCESS_BASELINE_BYTES = int(0.4 * GB)

# Shapes of the recipe models, used only when their config.json cannot be read (offline, not
# in the hub cache). Taken from each model's config.json on the hub.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-1.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    ),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    ),
    "Qwen/Qwen2.5-3B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008,
        num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    ),
    "HuggingFaceTB/SmolLM-135M-Instruct": dict(
        model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    ),
    "HuggingFaceTB/SmolLM2-135M-Instruct": dict(
        model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    ),
}  # fmt: skip

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class PlanError(ValueError):
    """The model's shape cannot be read; the message says why and what to do."""


# ---------------------------------------------------------------------- model shape
@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a decoder-only transformer's config.json."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3-style per-head RMSNorm on q and k
    dtype: str = "float32"  # the checkpoint's torch_dtype (used by torch_dtype: auto)
    model_type: str = "llama"
    source: str = ""

    @classmethod
    def from_config(cls, d: dict[str, Any], source: str = "") -> ModelShape:
        text = d.get("text_config")
        if isinstance(text, dict) and "hidden_size" not in d:
            d = {**text, "tie_word_embeddings": d.get("tie_word_embeddings", True)}
        try:
            h, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
            mt = str(d.get("model_type", "llama"))
            shape = cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=h,
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or h // heads),
                intermediate_size=int(d.get("intermediate_size") or 4 * h),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
                qkv_bias=mt == "qwen2" or bool(d.get("attention_bias", False)),
                o_bias=bool(d.get("attention_bias", False)),
                mlp_bias=bool(d.get("mlp_bias", False)),
                qk_norm=mt.startswith("qwen3"),
                dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
                model_type=mt,
                source=source,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"{source}: config.json lacks a decoder field ({e})") from e
        return shape


def read_model_config(spec: str) -> ModelShape:
    """The shape of ``spec`` (hub id, local dir or .gguf) from its config.json, no weights.

    Order: a local directory's config.json; the hub cache's config.json; a GGUF already
    converted by grpokit; ``AutoConfig.from_pretrained`` (network); the built-in shapes of
    the recipe models. Nothing is downloaded except, online, the config itself.
    """
    from grpokit.models import ModelSourceError, resolve_model

    p = Path(spec).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return ModelShape.from_config(_read_json(p / "config.json"), f"{p}/config.json")
    cached = _hub_cached_config(spec)
    if cached:
        return ModelShape.from_config(_read_json(Path(cached)), cached)

    def no_download(requirement: str, dest: Path) -> Path:
        raise ModelSourceError(f"grpokit plan does not download weights ({requirement})")

    why = ""
    try:
        res = resolve_model(spec, downloader=no_download)
        rp = Path(res.path)
        if (rp / "config.json").is_file():
            return ModelShape.from_config(_read_json(rp / "config.json"), f"{rp}/config.json")
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(res.path)
        return ModelShape.from_config(cfg.to_dict(), f"hub {spec} (AutoConfig)")
    except Exception as e:  # offline, unknown repo, gated repo, ...
        why = f"{type(e).__name__}: {e}"
    if spec in KNOWN_CONFIGS:
        return ModelShape.from_config(KNOWN_CONFIGS[spec], f"built-in shape of {spec}")
    raise PlanError(
        f"cannot read the config of {spec!r} without loading it: {why.strip()[:300]}. Give a "
        "local model directory as --model_name_or_path, or make the hub reachable"
    )


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _hub_cached_config(spec: str) -> str | None:
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        got = try_to_load_from_cache(spec, "config.json")
    except Exception:
        return None
    return got if isinstance(got, str) else None


# ---------------------------------------------------------------------- parameters
def param_counts(m: ModelShape) -> dict[str, int]:
    """Parameters by part. h hidden, a/k query/key-value heads, d head_dim, I intermediate:

    embeddings V*h; attention per layer h*a*d (q) + 2*h*k*d (k, v, GQA) + a*d*h (o) + biases;
    MLP per layer 3*h*I (gate, up, down) + biases; norms (2L + 1)*h (+ 2*d per layer with
    q/k norms); lm_head V*h unless tied to the embeddings.
    """
    h, a, k, d, ffn, L = (
        m.hidden_size,
        m.num_heads,
        m.num_kv_heads,
        m.head_dim,
        m.intermediate_size,
        m.num_layers,
    )
    attn = h * a * d + 2 * h * k * d + a * d * h
    attn += (a * d + 2 * k * d) * m.qkv_bias + h * m.o_bias
    mlp = 3 * h * ffn + (2 * ffn + h) * m.mlp_bias
    norms = (2 * L + 1) * h + 2 * d * L * m.qk_norm
    out = {
        "embeddings": m.vocab_size * h,
        "attention": attn * L,
        "mlp": mlp * L,
        "norms": norms,
        "lm_head": 0 if m.tie_word_embeddings else m.vocab_size * h,
    }
    out["total"] = sum(out.values())
    return out


def linear_shapes(m: ModelShape) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each linear layer of one decoder block."""
    h, a, k, d, ffn = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size
    return {
        "q_proj": (h, a * d),
        "k_proj": (h, k * d),
        "v_proj": (h, k * d),
        "o_proj": (a * d, h),
        "gate_proj": (h, ffn),
        "up_proj": (h, ffn),
        "down_proj": (ffn, h),
    }


def lora_param_count(m: ModelShape, r: int, targets: str | list | None = None) -> int:
    """LoRA adds r*(in + out) per targeted linear per layer (A: r x in, B: out x r).

    ``targets`` None or "all-linear" means every linear of the blocks (peft leaves lm_head
    out); a list names modules (q_proj, ...); a string is a regex on the module name.
    """
    shapes = linear_shapes(m)
    if targets in (None, "all-linear"):
        names = list(shapes)
    elif isinstance(targets, str):
        names = [n for n in shapes if re.search(targets, n)]
    else:
        names = [n for n in shapes if n in set(targets)]
    return m.num_layers * sum(r * (shapes[n][0] + shapes[n][1]) for n in names)


# ---------------------------------------------------------------------- batches
@dataclass
class BatchPlan:
    num_processes: int
    num_generations: int
    micro_batch: int  # completions per forward/backward, per process
    gradient_accumulation_steps: int
    completions_per_step: int  # all processes
    prompts_per_step: int
    generation_batch: int  # completions generated in one call, per process
    prompts_per_process: int
    optimizer_steps: int | None  # None: epochs of a dataset of unknown size
    steps_per_epoch: int | None
    train_rows: int | None
    max_tokens_generated: int | None
    divisible: bool
    notes: list[str] = field(default_factory=list)


def batch_plan(cfg: GRPOConfig, num_processes: int, train_rows: int | None) -> BatchPlan:
    """GRPO batch arithmetic, as the trainer does it.

    completions/step = per_device_train_batch_size x gradient_accumulation_steps x processes;
    prompts/step = that / G; each process generates its prompts x G completions in one call;
    rounds/epoch = train rows // prompts/step (the last partial batch is dropped); each round
    makes num_iterations optimizer steps; tokens generated <= rounds x completions/step x
    max_completion_length.
    """
    G, mb, ga = (
        cfg.num_generations,
        cfg.per_device_train_batch_size,
        cfg.gradient_accumulation_steps,
    )
    n = mb * ga * num_processes
    prompts = n // G
    rows = train_rows
    if rows is not None and cfg.max_train_samples is not None:
        rows = min(rows, cfg.max_train_samples)
    mu = cfg.num_iterations
    rounds_per_epoch = rows // prompts if rows is not None and prompts else None
    steps_per_epoch = rounds_per_epoch * mu if rounds_per_epoch is not None else None
    if cfg.max_steps > 0:
        steps = cfg.max_steps
    elif rounds_per_epoch is not None:
        steps = math.ceil(cfg.num_train_epochs * rounds_per_epoch) * mu
    else:
        steps = None
    notes = []
    if n % G:
        notes.append(f"{n} completions per step is not divisible by num_generations {G}")
    if rows is not None and prompts and rows < prompts:
        notes.append(f"only {rows} training prompts for {prompts} prompts per step")
    return BatchPlan(
        num_processes=num_processes,
        num_generations=G,
        micro_batch=mb,
        gradient_accumulation_steps=ga,
        completions_per_step=n,
        prompts_per_step=prompts,
        generation_batch=mb * ga,
        prompts_per_process=(mb * ga) // G,
        optimizer_steps=steps,
        steps_per_epoch=steps_per_epoch,
        train_rows=rows,
        max_tokens_generated=(
            math.ceil(steps / mu) * n * cfg.max_completion_length if steps is not None else None
        ),
        divisible=n % G == 0,
        notes=notes,
    )


# ---------------------------------------------------------------------- memory
def activation_bytes_per_token_layer(m: ModelShape, s: int, autocast: bool) -> int:
    """Bytes one decoder layer keeps for backward, per token (no gradient checkpointing).

    With h hidden, a/k query/kv heads, d head_dim, I intermediate, s the activation bytes
    (2 under bf16 autocast or 16-bit weights, else 4), c = 3 copies of the normed input for
    q/k/v and 2 for gate/up under autocast (it casts the fp32 input once per linear), else 1:

        s * (c_qkv*h + 3*a*d + 3*k*d + c_mlp*h + 4*I) + 2 norms * 2*h * 4

    3*a*d: q before and after RoPE and the attention output (= o_proj input); 3*k*d: k
    before and after RoPE, and v (SDPA runs GQA without expanding k/v and keeps no (T, T)
    score matrix); 4*I: gate and up outputs, silu(gate), and the product (down_proj input);
    each RMSNorm keeps its fp32 input and normalised output.
    """
    h, a, k, d, ffn = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size
    c_qkv, c_mlp = (3, 2) if autocast else (1, 1)
    return s * (c_qkv * h + 3 * a * d + 3 * k * d + c_mlp * h + 4 * ffn) + 2 * 2 * h * 4


def logits_bytes(batch: int, completion: int, vocab: int, s: int) -> int:
    """Logits of a micro-batch: only the completion positions are computed (logits_to_keep).

    (B, C+1, V) lm_head output and the (B, C, V) temperature-scaled copy in activation
    dtype s, plus the (B, C, V) fp32 upcasts that log-softmax (logsumexp) keeps for
    backward; in fp32 the upcast is the scaled copy itself. The entropy's (1, C, V) fp32
    temporaries are transient, one sequence at a time.
    """
    bcv = batch * completion * vocab
    return bcv * (2 * s + (4 if s < 4 else 0)) + 3 * completion * vocab * 4


def estimate_memory(
    cfg: GRPOConfig,
    m: ModelShape,
    *,
    num_processes: int = 1,
    zero_stage: int = 0,
    prompt_length: int | None = None,
) -> dict[str, Any]:
    """Bytes per device, by component. ``prompt_length`` defaults to max_prompt_length.

    peak = baseline + weights + reference + sampling copy + optimizer
           + max(training phase, generation phase)
    training phase = gradients + autocast weight copies + activations of one micro-batch
    generation phase = KV cache + sampling temporaries
    (gradients are freed after each optimizer step, so they do not meet the KV cache).
    ZeRO-1 shards the optimizer states over processes, ZeRO-2 also the gradients, ZeRO-3
    also the weights (policy and reference).
    """
    params = param_counts(m)["total"]
    dtype = m.dtype if cfg.torch_dtype == "auto" else cfg.torch_dtype
    wb = _BYTES.get(dtype, 4)
    autocast = cfg.bf16 and wb == 4
    s = 2 if (autocast or wb == 2) else 4
    if cfg.use_peft:
        trainable, tb = lora_param_count(m, cfg.lora_r, cfg.lora_target_modules), 4
    else:
        trainable, tb = params, wb
    n = max(1, num_processes)
    shard_opt = n if zero_stage >= 1 else 1
    shard_grad = n if zero_stage >= 2 else 1
    shard_w = n if zero_stage >= 3 else 1

    P = prompt_length if prompt_length is not None else (cfg.max_prompt_length or 512)
    C = cfg.max_completion_length
    T = P + C
    B = cfg.per_device_train_batch_size
    L = m.num_layers
    per_tok = activation_bytes_per_token_layer(m, s, autocast)
    full_acts = L * per_tok * B * T
    ckpt_acts = L * B * T * m.hidden_size * (4 if autocast else s) + per_tok * B * T
    acts = ckpt_acts if cfg.gradient_checkpointing else full_acts
    logits = logits_bytes(B, C, m.vocab_size, s)

    gen_batch = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    gen_len = T
    if cfg.do_eval and cfg.max_eval_samples > 0:
        eval_len = P + (cfg.eval_max_completion_length or C)
        eval_batch = min(cfg.per_device_eval_batch_size, cfg.max_eval_samples)
        if eval_batch * eval_len > gen_batch * gen_len:
            gen_batch, gen_len = eval_batch, eval_len
    kv = 2 * L * m.num_kv_heads * m.head_dim * gen_len * gen_batch * s
    gen_tmp = (
        gen_batch * m.vocab_size * 4 * 3
        + gen_batch * P * (4 * m.hidden_size + 3 * m.intermediate_size) * s
    )

    out: dict[str, Any] = {
        "params": params,
        "trainable_params": trainable,
        "weights_dtype": dtype,
        "activation_bytes": s,
        "baseline": PROCESS_BASELINE_BYTES,
        "weights": params * wb // shard_w,
        "reference": (params * wb // shard_w) if cfg.beta > 0 and not cfg.use_peft else 0,
        "optimizer": 2 * trainable * tb // shard_opt,
        "gradients": trainable * tb // shard_grad,
        "autocast_weights": params * 2 if autocast else 0,
        # bf16 full fine-tuning samples from a bf16 copy of the weights (rollout/hf.py);
        # with sharded weights (ZeRO-3, FSDP) sampling always uses a whole, unsharded copy
        "sampling_copy": (
            params * (2 if cfg.bf16 else wb)
            if zero_stage >= 3 and not cfg.use_peft
            else params * 2
            if cfg.bf16 and cfg.bf16_sampling_copy and not cfg.use_peft
            else 0
        ),
        "activations": acts,
        "activations_no_ckpt": full_acts,
        "activations_ckpt": ckpt_acts,
        "logits": logits,
        "kv_cache": kv,
        "generation_temporaries": gen_tmp,
        "generation_batch": gen_batch,
        "sequence_length": T,
    }
    train = out["gradients"] + out["autocast_weights"] + acts + logits
    gen = kv + gen_tmp
    out["training_phase"] = train
    out["generation_phase"] = gen
    out["peak"] = (
        out["baseline"]
        + out["weights"]
        + out["reference"]
        + out["sampling_copy"]
        + out["optimizer"]
        + max(train, gen)
    )
    return out


# ---------------------------------------------------------------------- the plan
@dataclass
class Plan:
    model: str
    shape: ModelShape
    batch: BatchPlan
    memory: dict[str, Any]
    params: dict[str, int]
    zero_stage: int
    device_memory: float | None  # bytes
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "shape": asdict(self.shape),
            "params": self.params,
            "batch": asdict(self.batch),
            "memory": self.memory,
            "zero_stage": self.zero_stage,
            "device_memory": self.device_memory,
            "warnings": self.warnings,
        }


def parse_size(text: str | float | int | None) -> float | None:
    """ "80GB", "24 GiB", "512MB", "8e9" -> bytes."""
    if text is None or isinstance(text, (int, float)):
        return None if text is None else float(text)
    mt = re.fullmatch(r"\s*([\d.]+(?:e\d+)?)\s*([kmgt]i?b?)?\s*", text.lower())
    if not mt:
        raise ValueError(f"device memory {text!r}: use e.g. 80GB, 24GiB or 512MB")
    unit = mt.group(2) or ""
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(unit[:1], 1.0)
    if "i" in unit:
        scale = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[unit[:1]]
    return float(mt.group(1)) * scale


def task_train_rows(cfg: GRPOConfig) -> tuple[int | None, str | None]:
    """Number of training rows of the recipe's task, or (None, why) when not cheaply known."""
    from grpokit.tasks import get_task

    try:
        task = get_task(
            cfg.task,
            dataset_name=cfg.dataset_name,
            dataset_config=cfg.dataset_config,
            system_prompt=cfg.system_prompt,
            seed=cfg.seed,
            dataset_prompt_column=cfg.dataset_prompt_column,
            **cfg.task_params,
        )
        source = task.source
        sizes = getattr(task, "sizes", None)
        if source in (None, "generate") and isinstance(sizes, dict) and "train" in sizes:
            return int(sizes["train"]), None  # a generated task's own count, no generation
        if source not in (None, "generate") and not Path(source).expanduser().exists():
            return None, f"{source} is a hub dataset, which plan does not download"
        return len(task.load_rows(cfg.dataset_train_split)), None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e)[:160]}"


def make_plan(
    cfg: GRPOConfig,
    *,
    num_processes: int | None = None,
    zero_stage: int = 0,
    device_memory: str | float | None = None,
    count_rows: bool = True,
    prompt_length: int | None = None,
) -> Plan:
    if zero_stage not in (0, 1, 2, 3):
        raise PlanError(f"zero_stage={zero_stage}: use 0, 1, 2 or 3")
    nproc = num_processes or cfg.world_size
    shape = read_model_config(cfg.model_name_or_path)
    rows, why = task_train_rows(cfg) if count_rows else (None, "not counted")
    batch = batch_plan(cfg, nproc, rows)
    if rows is None and cfg.max_steps <= 0:
        batch.notes.append(f"steps per epoch unknown: training rows not counted ({why})")
    mem = estimate_memory(
        cfg, shape, num_processes=nproc, zero_stage=zero_stage, prompt_length=prompt_length
    )
    limit = parse_size(device_memory)
    warns = list(batch.notes)
    if limit is not None and mem["peak"] > limit:
        warns.append(
            f"estimated peak {mem['peak'] / GB:.1f} GB exceeds device memory {limit / GB:.1f} GB: "
            "try gradient_checkpointing, a smaller per_device_train_batch_size, use_peft, "
            "--zero_stage 2/3 over more processes, or bf16 weights"
        )
    return Plan(
        model=cfg.model_name_or_path,
        shape=shape,
        batch=batch,
        memory=mem,
        params=param_counts(shape),
        zero_stage=zero_stage,
        device_memory=limit,
        warnings=warns,
    )


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
        f"  sampling copy of the weights (whole)   {_gb(m['sampling_copy'])}",
        f"  AdamW states                           {_gb(m['optimizer'])}",
        f"  gradients                              {_gb(m['gradients'])}",
        f"  autocast bf16 weight copies            {_gb(m['autocast_weights'])}",
        f"  {'activations, micro-batch of ' + str(b.micro_batch):<39}{_gb(m['activations'])}"
        f"   (checkpointing {'on' if cfg.gradient_checkpointing else 'off'}; "
        f"off {m['activations_no_ckpt'] / GB:.2f} GB, on {m['activations_ckpt'] / GB:.2f} GB)",
        f"  logits + log-softmax                   {_gb(m['logits'])}",
        f"  {'KV cache, ' + str(m['generation_batch']) + ' sequences':<39}{_gb(m['kv_cache'])}",
        f"  sampling temporaries                   {_gb(m['generation_temporaries'])}",
        f"  peak = static + max(training {m['training_phase'] / GB:.2f}, generation "
        f"{m['generation_phase'] / GB:.2f})",
        f"  ESTIMATED PEAK                         {_gb(m['peak'])}"
        + (f"  of {plan.device_memory / GB:.1f} GB" if plan.device_memory else ""),
    ]
    for w in plan.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)
