"""Learning benchmark: run a recipe from scratch and report held-out accuracy and format
rate before/after, wall time and peak memory. Not a test.

    python bench/learning.py [--recipe R] [--seeds N] [--output_dir DIR] [--key value ...]

``--recipe``: a recipe file, or a name in ``recipes/`` (``default``, the default). Other
``--key value`` pairs go to the recipe as ``grpokit train`` overrides.

One run (no ``--seeds``): as ``grpokit train R``; the result is printed and written to
``DIR/bench_learning.json``.

``--seeds N``: N runs with training seeds 0..N-1 on one held-out set (``--data_seed 42``
unless given), each in ``DIR/seed-K``; prints each seed's row, then the mean and range
(min..max) of each figure, and writes them all to ``DIR/bench_learning.json``. Seed-to-seed
spread is what a code change has to beat before it counts. With ``--eval_steps K`` each run
also evaluates the held-out problems every K steps (the training's random stream untouched),
and a second table gives the accuracy at each of those steps per seed with the mean gain and
its range: the learning curve to choose ``max_steps`` by. ``periodic_eval_seconds`` says how
much of each run's wall time those evaluations took.

To compare single training seeds by hand, fix the data's seed the same way:
``python bench/learning.py --seed 1 --data_seed 42`` (without ``--data_seed`` the problems
follow ``--seed``, as transformers' data_seed does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA_SEED = "42"  # the held-out set every seed of a --seeds bench is measured on
FIGURES = (  # (key, column title, format)
    ("accuracy_before", "acc before", "{:.1%}"),
    ("accuracy_after", "acc after", "{:.1%}"),
    ("gain_points", "gain", "{:+.1f}"),
    ("format_before", "fmt before", "{:.1%}"),
    ("format_after", "fmt after", "{:.1%}"),
    ("wall_seconds", "wall s", "{:.0f}"),
    ("peak_rss_gb", "peak GB", "{:.2f}"),
)


def take(args: list[str], key: str, default: str | None = None) -> str | None:
    """Remove ``key value`` from ``args`` and return the value (``default`` if absent)."""
    if key not in args:
        return default
    i = args.index(key)
    if i + 1 >= len(args):
        raise SystemExit(f"{key} needs a value")
    value = args[i + 1]
    del args[i : i + 2]
    return value


def recipe_path(name: str) -> Path:
    for p in (Path(name), ROOT / "recipes" / name, ROOT / "recipes" / f"{name}.yaml"):
        if p.is_file():
            return p
    raise SystemExit(f"--recipe {name}: no such file, nor recipes/{name}.yaml")


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("MALLOC_MMAP_MAX_", "0")  # as ./run sets them
    env.setdefault("MALLOC_TRIM_THRESHOLD_", "17179869184")
    if "glibc.malloc.hugetlb=" not in env.get("GLIBC_TUNABLES", ""):
        env["GLIBC_TUNABLES"] = ":".join(
            x for x in (env.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1") if x
        )
    return env


MARK = ".bench-learning"  # in every directory this bench made, so a re-run may replace it


def clear_own_dir(out: Path) -> None:
    """Empty ``out`` for a fresh run, but only if this bench made it: never delete a user's run."""
    # before MARK existed, its result file marked a directory it made (a --seeds run's
    # seed-K directories: the parent's)
    own = (out / MARK).exists() or (out / "bench_learning.json").exists()
    own = own or (out.name.startswith("seed-") and (out.parent / "bench_learning.json").exists())
    if out.exists() and any(out.iterdir()) and not own:
        raise SystemExit(
            f"{out} exists and was not made by bench/learning.py: pass another --output_dir "
            "or move it away (the bench replaces its own directories only)"
        )
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / MARK).write_text("made by bench/learning.py; a re-run replaces this directory\n")


def run_once(recipe: Path, args: list[str], out: str) -> dict | None:
    """One training run into ``out``: its before/after figures, or None when it failed."""
    clear_own_dir(Path(out))
    cmd = [sys.executable, "-m", "grpokit", "train", str(recipe), *args, "--output_dir", out]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=run_env())
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the running max
    wall = time.time() - t0
    rc = os.waitstatus_to_exitcode(status)
    summary = Path(out) / "eval_summary.json"
    if rc != 0 or not summary.exists():
        print(f"run failed (exit {rc}) after {wall:.0f}s: {out}", flush=True)
        return None
    s = json.loads(summary.read_text())
    b, a = s["before"], s["after"]
    curve = held_out_curve(Path(out))
    status = Path(out) / "status.json"
    steps = json.loads(status.read_text()).get("step") if status.exists() else None
    return {
        "held_out_problems": b["num_prompts"],
        "accuracy_before": b["accuracy"],
        "accuracy_after": a["accuracy"],
        "gain_points": 100 * (a["accuracy"] - b["accuracy"]),
        "format_before": b["format_rate"],
        "format_after": a["format_rate"],
        "mean_length_before": b["mean_length"],
        "mean_length_after": a["mean_length"],
        "steps": steps or max(curve, default=0),  # optimizer steps trained
        "wall_seconds": wall,
        "peak_rss_gb": usage.ru_maxrss / 1024**2,
        # the periodic evaluations (eval_steps): step -> held-out accuracy, and their seconds
        # (part of wall_seconds; a run without eval_steps does not spend them)
        "curve": {step: acc for step, (acc, _) in curve.items()},
        "periodic_eval_seconds": sum(sec for _, sec in curve.values()),
    }


def held_out_curve(out: Path) -> dict[int, tuple[float, float]]:
    """step -> (accuracy, seconds) of a run's periodic evaluations (``eval_step-N.json``)."""
    found = {}
    for f in out.glob("eval_step-*.json"):
        step = f.stem.split("-", 1)[1]
        if step.isdigit():
            r = json.loads(f.read_text())
            found[int(step)] = (r["accuracy"], r.get("seconds", 0.0))
    return dict(sorted(found.items()))


def plot_curves(path: Path, title: str, seeds: list[int], runs: list[dict]) -> bool:
    """Each seed's held-out accuracy over the steps (before, the periodic evaluations, the
    final model) and their mean, as a png at ``path``; False when there is nothing to draw
    (no periodic evaluation) or matplotlib is missing (``pip install grpokit[report]``)."""
    if not any(r["curve"] for r in runs):
        return False
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(7.0, 3.6), dpi=100)
    ax = fig.subplots()
    points = []
    for s, r in zip(seeds, runs):
        pts = {0: r["accuracy_before"], **r["curve"], r["steps"]: r["accuracy_after"]}
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", ms=3, lw=1, alpha=0.6, label=f"seed {s}")
        points.append(pts)
    common = sorted(set.intersection(*(set(p) for p in points)))
    mean = [sum(p[x] for p in points) / len(points) for x in common]
    ax.plot(common, mean, color="black", lw=2, marker="s", label="mean")
    ax.set(xlabel="step", ylabel="held-out accuracy (greedy)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return True


def curve_table(seeds: list[int], runs: list[dict]) -> str | None:
    """Held-out accuracy at each periodic evaluation (eval_steps), one column per seed, then
    the mean gain over the seeds and its range; None when the runs had no periodic
    evaluation; the last row ("final") is the final model's, the "after" of the table above."""
    steps = sorted(set().union(*(r["curve"] for r in runs)))
    if not steps:
        return None
    head = ["step", *(f"seed {s}" for s in seeds), "mean gain", "range"]
    rows = []
    for step in [*steps, "final"]:
        if step == "final":
            accs = [r["accuracy_after"] for r in runs]
        else:
            accs = [r["curve"].get(step) for r in runs]
        gains = [100 * (a - r["accuracy_before"]) for a, r in zip(accs, runs) if a is not None]
        cells = ["-" if a is None else f"{a:.1%}" for a in accs]
        rng = f"{min(gains):+.1f}..{max(gains):+.1f}"
        rows.append([str(step), *cells, f"{sum(gains) / len(gains):+.1f}", rng])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *rows])


def spread(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Mean, min and max of every figure over the runs."""
    return {
        k: {
            "mean": sum(r[k] for r in runs) / len(runs),
            "min": min(r[k] for r in runs),
            "max": max(r[k] for r in runs),
        }
        for k in runs[0]
        if isinstance(runs[0][k], (int, float))
    }


def table(seeds: list[int], runs: list[dict], stats: dict) -> str:
    """Each seed's row, then the mean and the range."""
    head = ["seed", *(t for _, t, _ in FIGURES)]
    rows = [[str(s), *(f.format(r[k]) for k, _, f in FIGURES)] for s, r in zip(seeds, runs)]
    rows.append(["mean", *(f.format(stats[k]["mean"]) for k, _, f in FIGURES)])
    rows.append(
        ["range"]
        + [f"{f.format(stats[k]['min'])}..{f.format(stats[k]['max'])}" for k, _, f in FIGURES]
    )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *rows])


def main() -> int:
    args = sys.argv[1:]
    if {"-h", "--help"} & set(args):  # not a training override: grpokit train would start
        sys.stdout.write(__doc__)
        return 0
    recipe = recipe_path(take(args, "--recipe", "default"))
    n = take(args, "--seeds")
    out = take(args, "--output_dir", "outputs/bench-learning")
    if n is None:  # one run, as before
        res = run_once(recipe, args, out)
        if res is None:
            return 1
        print(json.dumps(res, indent=1))
        (Path(out) / "bench_learning.json").write_text(json.dumps(res, indent=1))
        return 0
    if not n.isdigit() or int(n) < 1:
        raise SystemExit(f"--seeds {n}: give a number of seeds >= 1 (seeds 0..N-1 are run)")
    if "--seed" in args:
        raise SystemExit("--seeds runs seeds 0..N-1 itself; drop --seed")
    data_seed = take(args, "--data_seed", DATA_SEED)
    seeds, runs = list(range(int(n))), []
    for s in seeds:
        res = run_once(
            recipe, [*args, "--seed", str(s), "--data_seed", data_seed], f"{out}/seed-{s}"
        )
        if res is None:
            return 1
        runs.append(res)
    stats = spread(runs)
    print(f"\n{recipe.name}, {len(seeds)} seeds, data_seed {data_seed}:\n")
    print(table(seeds, runs, stats))
    curve = curve_table(seeds, runs)
    if curve:
        print("\nheld-out accuracy at each periodic evaluation (eval_steps):\n")
        print(curve)
        png = Path(out) / "learning_curve.png"
        if plot_curves(png, f"{recipe.stem}, {len(seeds)} seeds", seeds, runs):
            print(f"\n{png}")
    result = {
        "recipe": str(recipe),
        "overrides": args,
        "data_seed": int(data_seed),
        "seeds": seeds,
        "runs": runs,
        "spread": stats,
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "bench_learning.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
