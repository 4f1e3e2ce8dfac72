"""Forward + backward of the same rounds of a recipe two ways, alternately in one process.
Not a test.

``--compare prefix`` (default): the common prompt prefix computed once per micro-batch and
not (``min_shared_prefix`` 16 / 0; docs/speed.md, "A prompt prefix common to a
micro-batch"). ``--compare merge``: micro-batches merged into larger forwards and not
(``merge_micro_batches`` true / false; docs/speed.md, "Merged micro-batches").

    python bench/training_prefix.py                          # the default recipe, 3 rounds
    python bench/training_prefix.py --compare merge
    python bench/training_prefix.py --recipe recipes/default.yaml -- --per_device_train_batch_size 32

Run it as ``./run`` runs training (``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184
GLIBC_TUNABLES=glibc.malloc.hugetlb=1``), with nothing else on the cores.
"""

import argparse
import dataclasses
import statistics
import tempfile
import time

from grpokit.config import load_config
from grpokit.setup import forward_bounds
from grpokit.trainer import GRPOTrainer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--rounds", type=int, default=3, help="rounds generated, then timed")
    ap.add_argument("--repeats", type=int, default=3, help="each setting runs 2 x this often")
    ap.add_argument("--compare", choices=["prefix", "merge"], default="prefix")
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
    if a.compare == "prefix":
        settings = {"min_shared_prefix=0": 0, "min_shared_prefix=16": 16}

        def use(msp):
            tr.logprobs.min_shared_prefix = o.plan.min_shared_prefix = msp
    else:
        settings = {
            f"merge_micro_batches={m}": forward_bounds(
                dataclasses.replace(cfg, merge_micro_batches=m)
            )
            for m in (False, True)
        }

        def use(bounds):
            o.plan.max_tokens = bounds["max_tokens"]
            o.plan.max_rows = bounds["max_rows"]

    names = list(settings)
    res: dict[str, list[tuple[float, int, int]]] = {n: [] for n in names}
    for rep in range(a.repeats):
        for i in (1, 0, 0, 1) if rep % 2 else (0, 1, 1, 0):  # alternate the order
            use(settings[names[i]])
            t, pos0, fwd = time.perf_counter(), tr.logprobs.train_positions, 0
            for b in batches:
                pieces = o.plan(b.rollout)
                fwd += len(pieces)
                o.gradients.run(b, pieces, 1)
                o.grads.zero()
            res[names[i]].append((time.perf_counter() - t, tr.logprobs.train_positions - pos0, fwd))
    for name, runs in res.items():
        ts = sorted(r[0] for r in runs)
        print(
            f"{name}: {runs[0][1]} positions in {runs[0][2]} forwards; seconds for {a.rounds} "
            f"rounds: min {ts[0]:.2f}, median {statistics.median(ts):.2f}, "
            f"all {[round(x, 2) for x in ts]}"
        )


if __name__ == "__main__":
    main()
