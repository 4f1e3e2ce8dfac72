"""Variants benchmark: the default recipe with each loss type and with dynamic sampling,
several seeds each; held-out accuracy before/after and wall time, as a markdown table.
Not a test (a full run is hours of CPU: 11 variants x 3 seeds x the default recipe).

    python bench/variants.py [--seeds 0 1 2] [--variants dapo cispo ...] [--out DIR] [--collect]
                             [-- --key value ...]   (extra overrides for every run)

Each run is ``grpokit train recipes/default.yaml`` with the variant's keys, ``--seed`` and
``--bf16 false`` (this CPU has no native bf16; see README), in its own output_dir. The
table (mean and each seed) goes to ``DIR/variants.md`` and ``DIR/variants.json``.
A smoke run on the tiny offline model: ``--tiny`` (1 step, 1 seed, seconds).

A run whose directory holds ``variant_run.json`` for the same command is reused, not trained
again, so the table can be filled a few runs at a time (several processes may share one
``--out``); ``--collect`` trains nothing and tabulates the finished runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> overrides of the default recipe (dapo with clip-higher 0.28, dynamic sampling and
# the adaptive entropy bonus is the recipe itself); the last two rows take one of those away
VARIANTS: dict[str, dict] = {
    "dapo (default)": {},
    "grpo": {"loss_type": "grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
    "sapo": {"loss_type": "sapo"},
    "luspo": {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    "vespo": {"loss_type": "vespo"},
    "dapo, no dynamic sampling": {"dynamic_sampling": False},
    "dapo, no entropy bonus": {"use_adaptive_entropy": False},
}
TINY = {
    "task": "arithmetic",
    "task_params": "{digits: 1, train_size: 64, test_size: 8}",
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 8,
    "max_eval_samples": 8,
    "max_steps": 1,
    "save_steps": 0,
    "reward_funcs": "null",
    "reward_weights": "null",
    "system_prompt": "null",
}


def _flags(d: dict) -> list[str]:
    return [x for k, v in d.items() for x in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]  # fmt: skip


def _slug(name: str) -> str:
    """A directory name for a variant: its full name, not only the first word (two rows
    start with "dapo,")."""
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


def run_one(name: str, overrides: dict, seed: int, out: Path, extra: list[str]) -> dict:
    """One training run; its held-out accuracy before/after and wall time. A finished run of
    the same command (``variant_run.json`` in its directory) is reused, not trained again,
    so a table can be filled over several sessions."""
    out_dir = out / f"{_slug(name)}-seed{seed}"
    cmd = [
        sys.executable, "-m", "grpokit", "train", str(ROOT / "recipes" / "default.yaml"),
        *_flags({**overrides, "seed": seed, "data_seed": 42, "bf16": False, "output_dir": out_dir}), *extra,
    ]  # fmt: skip
    record = out_dir / "variant_run.json"
    if record.exists():
        done = json.loads(record.read_text())
        if done.get("command") == cmd[1:] and "failed" not in done:
            print(f"reusing {record} (finished {done.get('finished', '?')})", flush=True)
            return done
    shutil.rmtree(out_dir, ignore_errors=True)
    env = {**os.environ, "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "17179869184"}
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    rc = subprocess.call(cmd, env=env)
    wall = time.time() - t0
    summary = out_dir / "eval_summary.json"
    if rc != 0 or not summary.exists():
        return {"variant": name, "seed": seed, "failed": f"exit {rc}", "wall_seconds": wall}
    s = json.loads(summary.read_text())
    status = out_dir / "status.json"
    alerts = json.loads(status.read_text()).get("health", {}) if status.exists() else {}
    result = {
        "variant": name,
        "seed": seed,
        "accuracy_before": s["before"]["accuracy"],
        "accuracy_after": s["after"]["accuracy"],
        "wall_seconds": wall,
        "health": alerts,
        "command": cmd[1:],
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu(),
        "threads": os.environ.get("OMP_NUM_THREADS", "all"),
    }
    record.write_text(json.dumps(result, indent=1))
    for ckpt in out_dir.glob("checkpoint-*"):  # 1.6 GB each; the table needs none of them
        shutil.rmtree(ckpt, ignore_errors=True)
    return result


def collect(out: Path, chosen: dict, seeds: list[int]) -> list[dict]:
    """The finished runs of the chosen variants and seeds found in ``out``, in table order."""
    found = []
    for name in chosen:
        for seed in seeds:
            record = out / f"{_slug(name)}-seed{seed}" / "variant_run.json"
            if record.exists():
                found.append(json.loads(record.read_text()))
    if not found:
        raise SystemExit(f"no finished runs (variant_run.json) under {out}; run without --collect")
    return found


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def table(results: list[dict], command: str, note: str = "") -> str:
    """The markdown table: one row per variant, mean over seeds and each seed's gain."""
    lines = [
        f"Measured {datetime.date.today().isoformat()} with `{command}`{note}.",
        "",
        "| variant | accuracy before | accuracy after (mean) | gain (points, per seed) "
        "| wall time per run (min) | health alerts fired (per seed) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in dict.fromkeys(r["variant"] for r in results):
        rs = [r for r in results if r["variant"] == name and "failed" not in r]
        failed = [r for r in results if r["variant"] == name and "failed" in r]
        if not rs:
            lines.append(f"| {name} | failed | | | | |")
            continue
        gains = ", ".join(f"{100 * (r['accuracy_after'] - r['accuracy_before']):+.1f}" for r in rs)
        lines.append(
            f"| {name} | {statistics.mean(r['accuracy_before'] for r in rs):.3f} "
            f"| {statistics.mean(r['accuracy_after'] for r in rs):.3f} | {gains} "
            f"| {statistics.mean(r['wall_seconds'] for r in rs) / 60:.1f} "
            f"| {'; '.join(_alerts(r) for r in rs)} |"
            + (f" ({len(failed)} failed)" if failed else "")
        )
    return "\n".join(lines) + "\n"


def _alerts(r: dict) -> str:
    """The health alerts a run fired, as ``name@step``; "none" when it fired none."""
    events = (r.get("health") or {}).get("events", [])
    fired = [f"{e['alert']}@{e['step']}" for e in events if e.get("event") == "fired"]
    return ", ".join(fired) or "none"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=None, help="first words of the names")
    p.add_argument("--out", default="outputs/bench-variants")
    p.add_argument("--tiny", action="store_true", help="1-step smoke run on the tiny model")
    p.add_argument(
        "--collect",
        action="store_true",
        help="train nothing: the table of the finished runs in --out (variant_run.json)",
    )
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.tiny:
        from grpokit.testing import make_tiny_model

        tiny = make_tiny_model(out / "tiny-model", seed=0)
        extra = [*_flags({**TINY, "model_name_or_path": tiny}), *extra]
        a.seeds = a.seeds[:1]
    chosen = {k: v for k, v in VARIANTS.items() if a.variants is None or k.split()[0] in a.variants}
    if a.collect:
        results = collect(out, chosen, a.seeds)
    else:
        results = [
            run_one(name, ov, seed, out, extra) for name, ov in chosen.items() for seed in a.seeds
        ]
    command = "python bench/variants.py " + " ".join(argv + (["--", *extra] if extra else []))
    if a.collect:
        days = sorted({str(r.get("finished", "?"))[:10] for r in results})
        note = f" (runs finished {', '.join(days)}; each run's command, CPU and threads: its variant_run.json)"
    md = table(results, command, note if a.collect else "")
    (out / "variants.json").write_text(json.dumps(results, indent=1))
    (out / "variants.md").write_text(md)
    print(md)
    return 0 if all("failed" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
