"""vLLM rollout figures on this machine: engine start-up, weight sync, decode tokens/s, and
the log-prob mismatch against the trainer's model.

    OMP_NUM_THREADS=2 .venv-vllm/bin/python bench/vllm_rollout.py [--model DIR] [--dtype float32]

One vLLM engine per process (run it once per dtype). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()

    import torch

    from grpokit.models import load_model_and_tokenizer, local_model_path
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.vllm_engine import VLLMColocateEngine

    a.model = local_model_path(a.model)  # the engine loads the directory itself
    model, tok, _ = load_model_and_tokenizer(a.model)
    model.eval()
    eng = VLLMColocateEngine(
        model, tok, a.model, dtype=a.dtype, max_model_len=1024, enforce_eager=True
    )
    msgs = [
        [{"role": "user", "content": f"What is {i + 3} times {i + 7}? Explain step by step."}]
        for i in range(a.prompts)
    ]
    texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in msgs]
    enc = tok(texts, return_tensors="pt", padding=True)
    params = SamplingParams(max_new_tokens=a.max_new_tokens, min_new_tokens=a.max_new_tokens)
    eng.generate(enc.input_ids, enc.attention_mask, params, a.generations)  # warm-up + first sync
    syncs, rates = [], []
    for _ in range(a.repeats):
        eng.weights_updated()
        t0 = time.time()
        eng.sync_weights()
        syncs.append(time.time() - t0)
        t0 = time.time()
        ro = eng.generate(enc.input_ids, enc.attention_mask, params, a.generations)
        rates.append(float(ro.lengths.sum()) / (time.time() - t0))
    # mismatch: the trainer model's log-probs of the sampled tokens vs vLLM's (row by row,
    # unpadded, so positions need no care)
    diffs = []
    with torch.no_grad():
        for i in range(ro.completion_ids.shape[0]):
            p = ro.prompt_ids[i][ro.prompt_mask[i].bool()]
            n = int(ro.lengths[i])
            c = ro.completion_ids[i, :n]
            lp = torch.log_softmax(model(torch.cat([p, c])[None]).logits[0, len(p) - 1 : -1], -1)
            ours = lp.gather(-1, c[:, None])[:, 0]
            diffs.append((ours - ro.sampling_logps[i, :n]).abs())
    d = torch.cat(diffs)
    print(
        json.dumps(
            {
                "model": os.path.basename(a.model),
                "dtype": a.dtype,
                "batch": a.prompts * a.generations,
                "max_new_tokens": a.max_new_tokens,
                "engine_start_s": round(eng.start_seconds, 1),
                "weight_sync_s": [round(s, 3) for s in syncs],
                "tokens_per_s": [round(r, 1) for r in rates],
                "logp_abs_diff_mean": float(d.mean()),
                "logp_abs_diff_max": float(d.max()),
            }
        )
    )


if __name__ == "__main__":
    main()
