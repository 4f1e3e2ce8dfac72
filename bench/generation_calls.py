"""What one generation call of k prompts x G completions costs (docs/speed.md, "Generation
calls sized from the informative rate"): the measurement behind dynamic sampling's automatic
call size (``grpokit.dynamic.CallSizes``). A call's fixed costs (the prefill of the common
prompt prefix, the decode tail where a few long completions run alone) are paid once, so a
call of 2k prompts costs less than two calls of k. Not a test.

    python bench/generation_calls.py                     # the default recipe, 4 / 8 / 12 prompts
    python bench/generation_calls.py --sizes 4,8 --reps 8 --recipe recipes/mini_countdown.yaml

The sizes take turns, each repetition on the next prompts of the training set, with the
recipe's sampling settings and the untrained weights. Run it as ``./run`` runs training
(``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184 GLIBC_TUNABLES=glibc.malloc.hugetlb=1``)
with nothing else on the cores.
"""

import argparse
import statistics
import tempfile
import time

from grpokit.config import load_config
from grpokit.prompts import render_prompts, tokenize_prompts
from grpokit.speed.fastdecode import keep_decoders
from grpokit.trainer import GRPOTrainer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--sizes", default="4,8,12", help="prompts per call, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    cfg = load_config(a.recipe, ["--max_steps", "1", "--save_steps", "0", "--max_eval_samples",
                                 "0", "--output_dir", tempfile.mkdtemp(), "--log_completions",
                                 "false"])  # fmt: skip
    tr = GRPOTrainer(cfg)
    G, pool = cfg.num_generations, max(sizes) * (a.reps + 1)
    rows = [tr.train_rows[i] for i in range(pool)]
    texts = render_prompts(tr.tokenizer, [r["prompt"] for r in rows])
    ids, mask = tokenize_prompts(
        tr.tokenizer, texts, cfg.max_prompt_length, cfg.prompt_truncation, tr.counters
    )
    seconds = {k: [] for k in sizes}
    tokens = {k: [] for k in sizes}
    with keep_decoders():
        tr.engine.generate(ids[:4], mask[:4], tr.sampling, num_generations=G)  # warm-up
        for rep in range(a.reps):
            for k in sizes:
                at = max(sizes) * (rep + 1)
                t = time.perf_counter()
                ro = tr.engine.generate(ids[at : at + k], mask[at : at + k], tr.sampling, G)
                seconds[k].append(time.perf_counter() - t)
                tokens[k].append(int(ro.completion_mask.sum()))
    base = statistics.median(seconds[sizes[0]])
    print(f"{a.recipe}: {G} completions a prompt, {a.reps} calls of each size")
    print("prompts | median s | min s | x the first size | s a prompt | tokens a call (mean)")
    for k in sizes:
        med = statistics.median(seconds[k])
        print(f"{k:7d} | {med:8.2f} | {min(seconds[k]):5.2f} | {med / base:16.2f} | "
              f"{med / k:10.2f} | {statistics.mean(tokens[k]):.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
