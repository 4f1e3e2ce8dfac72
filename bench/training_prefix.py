"""Forward + backward of the same rounds of a recipe with the common prompt prefix computed
once per micro-batch and without it (``min_shared_prefix`` 16 / 0), alternately in one
process (docs/speed.md, "A prompt prefix common to a micro-batch"). Not a test.

    python bench/training_prefix.py                          # the default recipe, 3 rounds
    python bench/training_prefix.py --recipe recipes/default.yaml -- --per_device_train_batch_size 32

Run it as ``./run`` runs training (``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184
GLIBC_TUNABLES=glibc.malloc.hugetlb=1``), with nothing else on the cores.
"""

import argparse
import statistics
import tempfile
import time

from grpokit.config import load_config
from grpokit.trainer import GRPOTrainer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--rounds", type=int, default=3, help="rounds generated, then timed")
    ap.add_argument("--repeats", type=int, default=3, help="each setting runs 2 x this often")
    a, overrides = ap.parse_known_args()  # the rest (after --): recipe overrides
    overrides = [x for x in overrides if x != "--"]
    out = tempfile.mkdtemp(prefix="training_prefix-")
    cfg = load_config(
        a.recipe,
        ["--max_steps", str(a.rounds), "--save_steps", "0", "--max_eval_samples", "0",
         "--output_dir", out, "--log_completions", "false", *overrides],
    )  # fmt: skip
    tr = GRPOTrainer(cfg)
    o = tr.opt
    batches = [tr.collect_round()[0] for _ in range(a.rounds)]
    res: dict[int, list[tuple[float, int]]] = {0: [], 16: []}
    for rep in range(a.repeats):
        for msp in (16, 0, 0, 16) if rep % 2 else (0, 16, 16, 0):  # alternate the order
            tr.logprobs.min_shared_prefix = o.plan.min_shared_prefix = msp
            t, pos0 = time.perf_counter(), tr.logprobs.train_positions
            for b in batches:
                o.gradients.run(b, o.plan(b.rollout), 1)
                o.grads.zero()
            res[msp].append((time.perf_counter() - t, tr.logprobs.train_positions - pos0))
    for msp, runs in res.items():
        ts = sorted(r[0] for r in runs)
        print(
            f"min_shared_prefix={msp}: {runs[0][1]} positions; seconds for {a.rounds} rounds: "
            f"min {ts[0]:.2f}, median {statistics.median(ts):.2f}, all {[round(x, 2) for x in ts]}"
        )


if __name__ == "__main__":
    main()
