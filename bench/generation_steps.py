"""Where a recipe's generation time goes: every decode step of grpokit's own loop timed with
the number of rows it ran, plus the prefill, over a few rounds after warm-up rounds (docs/speed.md,
"Merged micro-batches": the tail of one to three rows). Not a test.

    python bench/generation_steps.py                      # the default recipe, 2 + 6 rounds
    python bench/generation_steps.py --recipe recipes/mini_countdown.yaml --rounds 4

Run it as ``./run`` runs training (``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184
GLIBC_TUNABLES=glibc.malloc.hugetlb=1``), with nothing else on the cores. The rounds do not
train between them (the weights stay those of the start).
"""

import argparse
import collections
import tempfile
import time

import grpokit.rollout.hf as hf
import grpokit.rollout.sampler as sampler
from grpokit.config import load_config
from grpokit.trainer import GRPOTrainer

BUCKETS = ((29, "29+"), (9, "9-28"), (4, "4-8"), (3, "3"), (2, "2"), (1, "1"))


def timed(fn, log):
    def wrapper(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        log.append((time.perf_counter() - t, a, out))
        return out

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    a, overrides = ap.parse_known_args()
    cfg = load_config(
        a.recipe,
        ["--max_steps", str(a.warmup + a.rounds), "--save_steps", "0", "--max_eval_samples", "0",
         "--output_dir", tempfile.mkdtemp(prefix="generation_steps-"),
         "--log_completions", "false", *[x for x in overrides if x != "--"]],
    )  # fmt: skip
    tr = GRPOTrainer(cfg)
    steps, prefills, calls = [], [], []
    sampler._step = timed(sampler._step, steps)
    sampler.prefill = timed(sampler.prefill, prefills)
    hf.sample = timed(hf.sample, calls)
    for _ in range(a.warmup):
        tr.collect_round()
    steps.clear(), prefills.clear(), calls.clear()
    gen = sum(tr.collect_round()[1]["time/generation"] for _ in range(a.rounds))
    by = collections.defaultdict(lambda: [0, 0.0])
    for sec, args, _ in steps:
        name = next(name for low, name in BUCKETS if args[3].shape[0] >= low)  # rows fed
        by[name][0] += 1
        by[name][1] += sec
    decode = sum(s for s, _, _ in steps)
    print(
        f"{a.rounds} rounds: {len(calls)} generate calls, time/generation {gen:.2f} s, "
        f"prefill {sum(s for s, _, _ in prefills):.2f} s, {len(steps)} decode steps {decode:.2f} s"
    )
    for _, name in BUCKETS:
        if name in by:
            c, s = by[name]
            print(f"  {name:>4} rows: {c:4d} steps {s:6.2f} s  {1000 * s / c:6.1f} ms a step  "
                  f"{100 * s / decode:4.1f}% of decode")  # fmt: skip
    print("steps per call (longest completion):", [out.shape[1] for _, _, out in calls])


if __name__ == "__main__":
    main()
