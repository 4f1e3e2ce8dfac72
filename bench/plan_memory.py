"""Measure the peak RSS of the pieces ``grpokit plan`` estimates (docs/plan.md).

    python bench/plan_memory.py MODEL_DIR --batch 8 --prompt 64 --completion 64 [--bf16]
        [--gradient_checkpointing] [--use_peft] [--beta 0.04]

Runs the trainer's own log-prob code on one micro-batch of random tokens: one forward +
backward, then one AdamW step. Prints JSON: RSS after imports (baseline), after loading
the weights, the peak during forward+backward, the peak during the optimizer step, and
`grpokit plan`'s estimates for the same shapes. Linux only (reads /proc/self/status and
resets the high-water mark with /proc/self/clear_refs).
"""

from __future__ import annotations

import argparse
import json
import types


def rss() -> tuple[int, int]:
    vals = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            vals[k] = int(v.split()[0]) * 1024
    return vals["VmRSS"], vals["VmHWM"]


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--gradient_checkpointing", action="store_true")
    ap.add_argument("--use_peft", action="store_true")
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import torch

    from grpokit.config import build_config
    from grpokit.models import load_model_and_tokenizer
    from grpokit.plan import estimate_memory, read_model_config
    from grpokit.rollout.base import Rollout
    from grpokit.trainer import GRPOTrainer

    torch.set_num_threads(a.threads)
    out: dict = {}
    out["baseline"] = rss()[0]
    model, tok, _ = load_model_and_tokenizer(
        a.model, use_peft=a.use_peft, gradient_checkpointing=a.gradient_checkpointing
    )
    model.train()
    out["after_load"] = rss()[0]
    B, P, C = a.batch, a.prompt, a.completion
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ro = Rollout(
        torch.randint(5, V, (B, P), generator=g),
        torch.ones(B, P, dtype=torch.long),
        torch.randint(5, V, (B, C), generator=g),
        torch.ones(B, C, dtype=torch.long),
        torch.zeros(B, dtype=torch.bool),
        [""] * B,
    )
    fake = types.SimpleNamespace(
        cfg=types.SimpleNamespace(temperature=1.0),
        amp_dtype=torch.bfloat16 if a.bf16 else None,
    )
    reset_peak()
    before = rss()[0]
    logp, ent = GRPOTrainer.completion_logps(fake, model, ro, slice(0, B), with_entropy=True)
    (-logp.mean()).backward()
    out["fwd_bwd_peak"] = rss()[1]
    out["fwd_bwd_increase"] = out["fwd_bwd_peak"] - before
    del logp, ent
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    reset_peak()
    opt.step()
    out["after_step_peak"] = rss()[1]

    cfg = build_config(
        dict(
            model_name_or_path=a.model,
            per_device_train_batch_size=B,
            num_generations=B,
            max_prompt_length=P,
            max_completion_length=C,
            bf16=a.bf16,
            gradient_checkpointing=a.gradient_checkpointing,
            use_peft=a.use_peft,
            beta=a.beta,
            max_eval_samples=0,
        )
    )
    est = estimate_memory(cfg, read_model_config(a.model))
    out["estimate"] = {
        k: est[k]
        for k in ("baseline", "weights", "gradients", "optimizer", "autocast_weights",
                  "activations", "logits")
    }  # fmt: skip
    out["estimate_fwd_bwd_increase"] = (
        est["gradients"] + est["autocast_weights"] + est["activations"] + est["logits"]
    )
    out["estimate_after_step"] = (
        est["baseline"] + est["weights"] + est["gradients"] + est["optimizer"]
    )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
