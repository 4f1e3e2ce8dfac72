"""Peak memory of loading a large local dataset, up to the first prompt batch.

    python bench/data_memory.py make /tmp/openr1_synth      # 220k rows, ~2 KB each, 10 shards
    python bench/data_memory.py load /tmp/openr1_synth      # in a fresh process: prints peak RSS

``make`` writes an OpenR1-Math-220k-shaped directory (``data/train-0000k-of-00010.parquet``,
columns problem / solution / answer / uuid / source) of synthetic rows. ``load`` runs what
``grpokit train`` runs before the first step, with the ``math`` task on that directory:
``setup.build_task`` and ``setup.build_data`` (every row read and checked), then the first
batch of prompts rendered through a chat template and tokenised, and prints the peak
resident set (``ru_maxrss``) with its anonymous / file-backed parts at the end
(``/proc/self/status``: file-backed pages are the memory-mapped Arrow cache, which the
kernel can drop). Results: docs/tasks.md, "Memory".
"""

from __future__ import annotations

import random
import resource
import sys
import time
from pathlib import Path

ROWS, SHARDS = 220_000, 10


def make(out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    (out / "data").mkdir(parents=True, exist_ok=True)
    per = ROWS // SHARDS
    for s in range(SHARDS):
        rows = []
        for i in range(s * per, (s + 1) * per):
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            text = " ".join(rng.choices(words, k=260))  # ~1.6 KB of worked solution
            rows.append(
                {
                    "problem": f"Problem {i}: what is {a} + {b}? "
                    + " ".join(rng.choices(words, k=40)),
                    "solution": f"{text} So the answer is $\\boxed{{{a + b}}}$.",
                    "answer": str(a + b),
                    "uuid": f"{i:08x}-synthetic",
                    "source": "synthetic",
                }
            )
        pq.write_table(
            pa.Table.from_pylist(rows), out / "data" / f"train-{s:05d}-of-{SHARDS:05d}.parquet"
        )
    print(f"wrote {ROWS} rows in {SHARDS} shards to {out}")


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[k] = int(v.split()[0]) // 1024
    return out


def load(src: Path) -> None:
    from grpokit.config import build_config
    from grpokit.prompts import render_prompts, tokenize_prompts
    from grpokit.setup import build_data, build_task
    from grpokit.testing import make_tokenizer

    t0 = time.time()
    cfg = build_config(
        {"task": "math", "dataset_name": str(src), "do_eval": False, "max_steps": 1, "seed": 0}
    )
    task = build_task(cfg)
    data = build_data(cfg, task)
    t1 = time.time()
    tok = make_tokenizer()
    rows = [data.train_rows[i] for i in data.sampler.next()]
    ids, _ = tokenize_prompts(tok, render_prompts(tok, [r["prompt"] for r in rows]), 512)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(
        f"{len(data.train_rows)} train rows, first batch {tuple(ids.shape)}; data "
        f"{t1 - t0:.1f} s; peak RSS {peak} MB; at the end {_status()} (MB)"
    )


if __name__ == "__main__":
    cmd, path = sys.argv[1], Path(sys.argv[2])
    make(path) if cmd == "make" else load(path)
