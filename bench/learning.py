"""Learning benchmark: run the default recipe from scratch and report held-out accuracy
before/after, wall time and peak memory. Not a test.

    python bench/learning.py [--output_dir DIR] [--key value ...]   (overrides go to the recipe)

To compare training seeds on the same held-out problems, fix the data's seed:
``python bench/learning.py --seed 1 --data_seed 42`` (without ``--data_seed`` the problems
follow ``--seed``, as transformers' data_seed does).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    args = sys.argv[1:]
    out = "outputs/bench-learning"
    if "--output_dir" in args:
        out = args[args.index("--output_dir") + 1]
    else:
        args += ["--output_dir", out]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.time()
    cmd = [sys.executable, "-m", "grpokit", "train", str(ROOT / "recipes" / "default.yaml"), *args]
    print("$", " ".join(cmd), flush=True)
    env = dict(os.environ)
    env.setdefault("MALLOC_MMAP_MAX_", "0")  # as ./run sets them
    env.setdefault("MALLOC_TRIM_THRESHOLD_", "17179869184")
    if "glibc.malloc.hugetlb=" not in env.get("GLIBC_TUNABLES", ""):
        env["GLIBC_TUNABLES"] = ":".join(
            x for x in (env.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1") if x
        )
    rc = subprocess.call(cmd, env=env)
    wall = time.time() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2
    summary = Path(out) / "eval_summary.json"
    if rc != 0 or not summary.exists():
        print(f"run failed (exit {rc}) after {wall:.0f}s")
        return 1
    s = json.loads(summary.read_text())
    b, a = s["before"], s["after"]
    res = {
        "held_out_problems": b["num_prompts"],
        "accuracy_before": b["accuracy"],
        "accuracy_after": a["accuracy"],
        "gain_points": 100 * (a["accuracy"] - b["accuracy"]),
        "format_before": b["format_rate"],
        "format_after": a["format_rate"],
        "wall_seconds": wall,
        "peak_rss_gb": peak_gb,
    }
    print(json.dumps(res, indent=1))
    (Path(out) / "bench_learning.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
