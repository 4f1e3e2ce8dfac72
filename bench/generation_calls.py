"""What one generation call of k prompts x G completions costs (docs/speed.md, "Generation
calls sized from the informative rate"): the measurement behind dynamic sampling's automatic
call size (``grpokit.dynamic.CallSizes``). A call's fixed costs (the prefill of the common
prompt prefix, the decode tail where a few long completions run alone) are paid once, so a
call of 2k prompts costs less than two calls of k. Not a test.

    python bench/generation_calls.py                     # the default recipe, 4 / 8 / 12 prompts
    python bench/generation_calls.py --sizes 4,8 --reps 8 --recipe recipes/mini_countdown.yaml

Each repetition takes the next block of training prompts and, for each size k, times one
call of k prompts against k / (the first size) calls of the first size on the same prompts:
the same work but for the fixed costs, so their ratio is what sizing the call saves. With the
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
    G, pool = cfg.num_generations, max(sizes) * (a.reps + 2)
    rows = [tr.train_rows[i] for i in range(pool)]
    texts = render_prompts(tr.tokenizer, [r["prompt"] for r in rows])
    ids, mask = tokenize_prompts(
        tr.tokenizer, texts, cfg.max_prompt_length, cfg.prompt_truncation, tr.counters
    )
    small = sizes[0]
    one = {k: [] for k in sizes}  # one call of k prompts
    split = {k: [] for k in sizes}  # k / small calls of small prompts, the same prompts

    def call(at: int, k: int) -> float:
        t = time.perf_counter()
        tr.engine.generate(ids[at : at + k], mask[at : at + k], tr.sampling, G)
        return time.perf_counter() - t

    with keep_decoders():
        call(0, small)  # warm-up
        for rep in range(a.reps):
            at = max(sizes) * (rep + 1)
            for k in sizes:
                one[k].append(call(at, k))
                split[k].append(sum(call(at + j, small) for j in range(0, k, small)))
    print(f"{a.recipe}: {G} completions a prompt, {a.reps} repetitions")
    print(
        f"prompts | one call, median s | {small}-prompt calls, median s | one / split (median of pairs)"
    )
    for k in sizes:
        ratio = statistics.median(o / s for o, s in zip(one[k], split[k]))
        print(f"{k:7d} | {statistics.median(one[k]):17.2f} | "
              f"{statistics.median(split[k]):24.2f} | {ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
