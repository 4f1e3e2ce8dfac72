"""Which tensors are alive at a training step's memory peak, by completion length. Not a test.

    python bench/memory_profile.py --lengths 256,512,1024            # SmolLM2-135M, config (a)
    python bench/memory_profile.py --model tiny --lengths 512,2048   # the tests' tiny model
    python bench/memory_profile.py --lengths 1024 --max_micro_batch_tokens 0   # no token bound
    python bench/memory_profile.py --lengths 128 --lora --generate  # configuration (c)
    python bench/memory_profile.py --lengths 128 --generate --bf16  # (a) as bench/speed.py runs it

Each length runs in its own subprocess (its peak RSS is the child's ``ru_maxrss``): the speed
bench's configuration (a) in float32 (4 prompts x G=8, micro-batch 16 x accumulation 2, beta
0.04, dapo), one round: the reference forward and one optimizer step, under
``grpokit.memory.LiveTensors``. ``--generate`` decodes the completions for real with EOS
masked (as ``bench/speed.py --forced_length``); by default the rollout is the real prompts
with random completion tokens of exactly the length (no decoding: minutes saved, and the
decode loop's KV cache, (N, P + T) per layer, is linear and printed apart).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = os.environ.get("GRPOKIT_BENCH_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")


def synthetic_generate(engine, length: int):
    """``engine.generate`` returning random completions of exactly ``length`` tokens."""
    import torch

    from grpokit.rollout.base import Rollout

    def generate(prompt_ids, prompt_mask, params, num_generations=1):
        g = torch.Generator().manual_seed(0)
        ids = prompt_ids.repeat_interleave(num_generations, dim=0)
        mask = prompt_mask.repeat_interleave(num_generations, dim=0)
        N = ids.shape[0]
        V = engine.model.get_output_embeddings().weight.shape[0]
        comp = torch.randint(0, V, (N, length), generator=g)
        for e in engine.eos_ids:  # no EOS: every row runs to the length
            comp[comp == e] = (e + 1) % V
        texts = engine.tokenizer.batch_decode(comp, skip_special_tokens=True)
        return Rollout(
            ids, mask, comp, torch.ones_like(comp), torch.ones(N, dtype=torch.bool), texts
        )

    return generate


def child(spec: dict) -> dict:
    import dataclasses

    from grpokit.config import GRPOConfig
    from grpokit.memory import LiveTensors
    from grpokit.rollout.hf import HFRolloutEngine
    from grpokit.trainer import GRPOTrainer

    model = spec["model"]
    if model == "tiny":
        from grpokit.testing import make_tiny_model

        model = str(make_tiny_model(Path(spec["output_dir"]) / "tiny"))
    if spec["generate"]:
        orig = HFRolloutEngine.generate

        def forced(self, prompt_ids, prompt_mask, params, num_generations=1):
            params = dataclasses.replace(params, min_new_tokens=params.max_new_tokens)
            return orig(self, prompt_ids, prompt_mask, params, num_generations)

        HFRolloutEngine.generate = forced
    extra = {}
    if spec["max_micro_batch_tokens"] is not None:
        extra["max_micro_batch_tokens"] = spec["max_micro_batch_tokens"]
    if spec.get("lora"):  # bench/speed.py's configuration (c)
        extra.update(use_peft=True, lora_r=16, lora_alpha=32, lora_dropout=0.05)
    cfg = GRPOConfig(
        model_name_or_path=model,
        task="arithmetic",
        task_params={"ops": ["+"], "digits": [1, 2], "train_size": 64, "test_size": 4},
        reward_funcs=["arithmetic_correct"],
        num_generations=8,
        per_device_train_batch_size=16,
        gradient_accumulation_steps=2,
        max_completion_length=spec["length"],
        temperature=0.8,
        beta=0.04,
        loss_type="dapo",
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        bf16=spec.get("bf16", False),
        gradient_checkpointing=spec["gradient_checkpointing"],
        max_steps=1,
        seed=42,
        max_eval_samples=0,
        save_steps=0,
        logging_steps=1,
        output_dir=spec["output_dir"],
        **extra,
    )
    trainer = GRPOTrainer(cfg)
    if not spec["generate"]:
        trainer.engine.generate = synthetic_generate(trainer.engine, spec["length"])
    K = spec.get("micro_batches")
    if K:  # only the first K micro-batches of each pass (all of one size at forced lengths)
        full_plan = trainer.opt.plan
        trainer.opt.plan = lambda ro, **kw: full_plan(ro, **kw)[:K]
        _optimizer_state(trainer)  # as in every step after the first
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.time()
    with LiveTensors() as live:
        batch, _, _ = trainer.collect_round()
        plan = [len(p) for p in (full_plan if K else trainer.opt.plan)(batch.rollout)]
        trainer.optimizer_step(batch)
    mc = trainer.model.config
    kv_heads = getattr(mc, "num_key_value_heads", mc.num_attention_heads)
    head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads
    N, P = batch.rollout.prompt_ids.shape
    kv = 2 * mc.num_hidden_layers * N * (P + spec["length"]) * kv_heads * head_dim * 4
    return {
        "length": spec["length"],
        "seconds": time.time() - t0,
        "rss_before_step_gb": rss0,
        "tracked_peak_gb": live.peak_bytes / 2**30,
        "summary": live.summary(),
        "micro_batches": plan,
        "decode_kv_cache_gb": kv / 2**30,
        "largest_numel": 0 if live.largest is None else _numel(live.largest.shape),
        "NTV": N * spec["length"] * mc.vocab_size,
    }


def _optimizer_state(trainer) -> None:
    """The optimizer's state, allocated as after a first step (zero gradients, lr 0)."""
    import torch

    opt = trainer.opt.optimizer
    for p in trainer.opt.params:
        p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
    opt.step()
    for g, lr in zip(opt.param_groups, lrs):
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a model directory, or tiny")
    ap.add_argument("--lengths", default="256,512,1024")
    ap.add_argument("--generate", action="store_true", help="decode for real (EOS masked)")
    ap.add_argument("--gradient_checkpointing", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (default: float32)")
    ap.add_argument(
        "--lora", action="store_true", help="configuration (c): LoRA r 16, alpha 32, dropout 0.05"
    )
    ap.add_argument(
        "--max_micro_batch_tokens", type=int, default=None, help="default: the config's"
    )
    ap.add_argument(
        "--micro_batches",
        type=int,
        default=0,
        help="run only the first K micro-batches of the reference and training passes, with "
        "the optimizer state allocated first (the peak of a later step, in 1/k of the time; "
        "0: the whole step)",
    )
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._child:
        spec = json.loads(Path(a._child).read_text())
        Path(spec["out"]).write_text(json.dumps(child(spec)))
        return 0
    if a.model != "tiny":
        from grpokit.models import local_model_path

        a.model = local_model_path(a.model)
    work = Path(tempfile.mkdtemp(prefix="memprof-"))
    print(f"bench/memory_profile.py {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for L in (int(x) for x in a.lengths.split(",")):
        spec = {
            "model": a.model,
            "length": L,
            "generate": a.generate,
            "gradient_checkpointing": a.gradient_checkpointing,
            "bf16": a.bf16,
            "lora": a.lora,
            "max_micro_batch_tokens": a.max_micro_batch_tokens,
            "micro_batches": a.micro_batches,
            "output_dir": str(work / f"L{L}"),
            "out": str(work / f"L{L}.json"),
        }
        spec_path = work / f"L{L}.spec.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ)  # the heap as ./run and bench/speed.py set it
        env.setdefault("MALLOC_MMAP_MAX_", "0")
        env.setdefault("MALLOC_TRIM_THRESHOLD_", "17179869184")
        env.setdefault("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
        with open(work / f"L{L}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--_child", str(spec_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=env,
            )
            _, status, usage = os.wait4(proc.pid, 0)
        rss = usage.ru_maxrss / 2**20
        if status != 0:
            print(f"L={L} FAILED:\n" + (work / f"L{L}.log").read_text()[-3000:])
            continue
        r = json.loads(Path(spec["out"]).read_text())
        print(
            f"\n== completion length {L}: peak RSS {rss:.2f} GB (before the step "
            f"{r['rss_before_step_gb']:.2f}); tracked tensors' peak {r['tracked_peak_gb']:.2f} "
            f"GiB; micro-batches (rows) {r['micro_batches']}"
            + (f" (first {a.micro_batches} run)" if a.micro_batches else "")
            + f"; decode KV cache would be "
            f"{r['decode_kv_cache_gb']:.2f} GiB; largest tensor {r['largest_numel']:,} elements "
            f"(N x T x V = {r['NTV']:,}); {r['seconds']:.0f} s"
        )
        print(r["summary"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
