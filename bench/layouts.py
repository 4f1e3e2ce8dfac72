"""Launch layouts with vLLM, timed against each other on one machine. Not a test.

    python bench/layouts.py                      # the four layouts below, SmolLM2-135M, float32
    python bench/speed.py --layouts              # the same (speed.py hands over to this file)
    python bench/layouts.py --tiny               # smoke run: tiny random model, 2 steps
    python bench/layouts.py --rows 1,3 --steps 6 --max_completion_length 128

Rows, all with the same recipe (recipes/default.yaml in float32, its global batch of 32
completions: 4 prompts x G=8, micro-batch 16 x accumulation 2 for one process, 8 x 2 for
each of two), every completion forced to ``max_completion_length`` tokens (EOS held back):

1. 1 process, vLLM colocated (the engine in the training process)
2. 1 process + ``grpokit rollout-server``
3. 2 processes (torchrun, gloo) + ``grpokit rollout-server``
4. 2 processes colocated (an engine in each)

Per row: seconds per step (median over the steps after ``--warmup`` from metrics.jsonl's
``time/step``) and its parts (``time/generation``; ``time/weight_sync``, the push to the
server or the reload into the colocated engine, done at the start of generation and part of
its time; ``time/training``), the peak RSS summed
over every process of the layout (each training process and the server; each process's own
peak, sampled every 0.25 s, so the sum bounds what was resident at once from above), and the
ratio of the step time and the memory to row 1.

Runs in the vLLM environment (``--python``, default ``.venv-vllm/bin/python``; ``./run
test-vllm`` builds it). Threads: every layout gets the machine's cores -- each of N training
processes ``OMP_NUM_THREADS`` = cores / N, the server (it works while the training processes
wait for it) all of them; ``--threads K`` gives every process K instead.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
HELPERS = {"g++", "gcc", "cc", "c++", "cc1plus", "cc1", "as", "ld", "collect2", "sh", "bash"}
ROWS = {
    1: ("1 process, colocated", 1, "colocate"),
    2: ("1 process + server", 1, "server"),
    3: ("2 processes + server", 2, "server"),
    4: ("2 processes, colocated", 2, "colocate"),
}
CAVEAT = (
    "Every layout here runs on the same {cores} cores (all threads in one process, or split "
    "between two): a second process brings no extra hardware, so a 2-process row cannot show "
    "the speed-up separate devices give; its difference to row 1 is the layouts' overhead "
    "(the weight push or reload each step, the server's round trips and one-after-the-other "
    "serving, the gradient all-reduce, a second engine's memory) plus how well one process's "
    "threads use the cores against two processes' half each."
)


# ============================================================================ worker
def worker(forced: bool, argv: list[str]) -> int:
    """``grpokit <argv>`` with every vLLM request holding EOS back until max_new_tokens
    (as speed.py's --forced_length), so every layout generates the same number of tokens."""
    import dataclasses

    from grpokit.cli import main as grpokit_main

    if forced:
        from grpokit.rollout import vllm_engine

        for cls in (vllm_engine.VLLMColocateEngine, vllm_engine.VLLMServerEngine):
            orig = cls.generate

            def generate(self, prompt_ids, prompt_mask, params, *a, _orig=orig, **k):
                params = dataclasses.replace(params, min_new_tokens=params.max_new_tokens)
                return _orig(self, prompt_ids, prompt_mask, params, *a, **k)

            cls.generate = generate
    return grpokit_main(argv)


# ============================================================================ processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def _hwm_gb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return None


class PeakRSS:
    """Each process's peak RSS (VmHWM) in the trees under the given roots, sampled."""

    def __init__(self):
        self.roots: list[int] = []
        self.peaks: dict[int, tuple[str, float]] = {}

    def sample(self) -> None:
        kids, todo, seen = _children(), list(self.roots), set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo += kids.get(pid, [])
            hwm = _hwm_gb(pid)
            if hwm is None:
                continue
            try:
                name = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
            except OSError:
                name = b""
            old = self.peaks.get(pid, ("", 0.0))[1]
            self.peaks[pid] = (name.decode(errors="replace"), max(old, hwm))

    @staticmethod
    def transient(cmd: str) -> bool:
        """A short-lived helper a process starts and waits for (torch's compiler probe
        ``python -c ...`` and the compilers it runs), not a process of the layout."""
        args = cmd.split()
        exe = Path(args[0]).name if args else ""
        return exe in HELPERS or (len(args) > 1 and args[1] == "-c")

    def total_gb(self) -> float:
        """Summed over the layout's processes: training processes, torchrun's launcher,
        the server (and any engine process it starts); transient helpers are left out."""
        return sum(gb for cmd, gb in self.peaks.values() if not self.transient(cmd))

    def helpers_gb(self) -> float:
        return max((gb for cmd, gb in self.peaks.values() if self.transient(cmd)), default=0.0)


def cores() -> int:
    return len(os.sched_getaffinity(0))


def threads(a, nproc: int) -> int:
    """OMP_NUM_THREADS of each of ``nproc`` processes sharing the cores (the server's
    ``nproc`` is 1: it computes while the training processes wait for it)."""
    return a.threads or max(1, cores() // nproc)


def _env(threads: int, kv_gb: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(threads))
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE=str(kv_gb))
    return env


def start_server(a, model: str, max_len: int, log: Path, peaks: PeakRSS):
    """``grpokit rollout-server`` on a free port; (process, port, start-up s) once /health
    answers, or raises with the log's tail."""
    port = free_port()
    cmd = [a.python, "-m", "grpokit", "rollout-server", "--model", model, "--port", str(port)]
    cmd += ["--host", "127.0.0.1", "--dtype", "float32", "--max_model_len", str(max_len)]
    f = open(log, "w")
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(threads(a, 1), a.kv_cache_gb), cwd=ROOT
    )
    peaks.roots.append(proc.pid)
    while time.time() - t0 < a.timeout:
        peaks.sample()
        if proc.poll() is not None:
            tail = " | ".join(log.read_text().splitlines()[-5:])
            raise RuntimeError(f"rollout server exited with {proc.returncode}: {tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port, time.time() - t0
        except OSError:
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"rollout server: no answer on port {port} within {a.timeout:.0f} s")


def stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def train(a, nproc: int, recipe: Path, log: Path, peaks: PeakRSS) -> None:
    me = [str(Path(__file__).resolve()), "--_worker"]
    me += ["--forced" if a.forced else "--not_forced", "--", "train", str(recipe)]
    if nproc == 1:
        cmd = [a.python, *me]
    else:
        cmd = [a.python, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
        cmd += ["--master_addr", "127.0.0.1", "--master_port", str(free_port()), *me]
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=_env(threads(a, nproc), a.kv_cache_gb),
            cwd=ROOT,
        )
        peaks.roots.append(proc.pid)
        t0 = time.time()
        while proc.poll() is None:
            peaks.sample()
            if time.time() - t0 > a.timeout:
                stop(proc)
                raise RuntimeError(f"training did not end within {a.timeout:.0f} s")
            time.sleep(0.25)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text().splitlines()[-8:])
        raise RuntimeError(f"training exited with {proc.returncode}: {tail}")


# ============================================================================ recipe
def recipe_values(a, model: str, nproc: int, mode: str, out: Path) -> dict:
    import yaml

    if a.tiny:  # as tests/vllm/test_multiprocess.py: global batch 4 completions
        v = dict(
            task="arithmetic",
            task_params={"digits": 1, "train_size": 64, "test_size": 4},
            num_generations=2,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            learning_rate=1e-2,
            max_prompt_length=128,
            seed=3,
        )
    else:
        v = yaml.safe_load((ROOT / "recipes" / "default.yaml").read_text())
    batch = v["per_device_train_batch_size"]
    if batch % nproc:
        raise SystemExit(f"per_device_train_batch_size {batch} does not split over {nproc}")
    v.update(
        model_name_or_path=model,
        output_dir=str(out),
        per_device_train_batch_size=batch // nproc,  # the same global batch in every row
        max_completion_length=a.max_completion_length,
        max_steps=a.steps,
        bf16=False,  # no native bf16 on an AVX2 CPU; float32 everywhere
        dynamic_sampling=False,  # one generation round a step in every row: like for like
        save_steps=0,
        max_eval_samples=0,
        log_completions=False,
        write_report=False,
        logging_steps=1,
        use_vllm=True,
        vllm_mode=mode,
        vllm_server_timeout=a.timeout,
    )
    return v


# ============================================================================ one row
def read_steps(metrics: Path) -> list[dict]:
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return [r for r in rows if "time/step" in r]


def summarize(steps: list[dict], warmup: int) -> dict:
    measured = steps[warmup:]
    if not measured:
        return {"measured": 0}

    def med(key):
        vals = [r[key] for r in measured if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    out = {k.split("/")[1]: med(k) for k in ("time/step", "time/generation", "time/training")}
    out["weight_sync"] = med("time/weight_sync")
    out["tokens"] = med("tokens_generated")
    out["measured"] = len(measured)
    return out


def run_row(a, key: int, model: str, work: Path) -> dict:
    label, nproc, mode = ROWS[key]
    d = work / f"row{key}"
    d.mkdir(parents=True, exist_ok=True)
    peaks, server, res = PeakRSS(), None, {"label": label}
    t0 = time.time()
    try:
        import yaml

        values = recipe_values(a, model, nproc, mode, d / "run")
        if mode == "server":
            max_len = values.get("max_prompt_length", 512) + a.max_completion_length + 16
            server, port, res["server_start_s"] = start_server(
                a, model, max_len, d / "server.log", peaks
            )
            values.update(vllm_server_host="127.0.0.1", vllm_server_port=port)
        recipe = d / "recipe.yaml"
        recipe.write_text(yaml.safe_dump(values))
        train(a, nproc, recipe, d / "train.log", peaks)
        peaks.sample()
    except (RuntimeError, OSError) as e:
        res["error"] = str(e)
        return res
    finally:
        if server is not None:
            peaks.sample()  # the server's peak, read before it goes
            stop(server)
        res["wall_s"] = time.time() - t0
        res["processes"] = {str(p): v for p, v in peaks.peaks.items()}
        res["rss_gb"] = peaks.total_gb()
        res["transient_helpers_max_gb"] = peaks.helpers_gb()  # not in rss_gb
    steps = read_steps(d / "run" / "metrics.jsonl")
    res["steps"] = len(steps)
    res.update(summarize(steps, a.warmup))
    return res


# ============================================================================ table
def table(results: dict[int, dict]) -> str:
    def cell(v, fmt="{:.2f}"):
        return "n/a" if v is None else fmt.format(v)

    base = results.get(1, {})
    lines = [
        "| layout | s / step | x row 1 | generation s (push included) | weight push/sync s | "
        "training s | "
        "peak RSS GB (all processes) | x row 1 | measured steps |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, r in results.items():
        if "error" in r:
            lines.append(f"| {k}. {r['label']} | FAILED: {r['error'][:200]} |")
            continue
        ratio_s = ratio_m = None
        if base.get("step") and r.get("step"):
            ratio_s = r["step"] / base["step"]
        if base.get("rss_gb") and r.get("rss_gb"):
            ratio_m = r["rss_gb"] / base["rss_gb"]
        lines.append(
            f"| {k}. {r['label']} | {cell(r.get('step'))} | {cell(ratio_s)} | "
            f"{cell(r.get('generation'))} | {cell(r.get('weight_sync'))} | "
            f"{cell(r.get('training'))} | {cell(r.get('rss_gb'))} | {cell(ratio_m)} | "
            f"{r.get('measured', 0)} |"
        )
    return "\n".join(lines)


def make_tiny(work: Path) -> str:
    """A tiny random Llama vLLM's CPU attention accepts (head_dim 32), as the vLLM tests."""
    from grpokit.testing import make_tiny_model

    return str(make_tiny_model(work / "tiny-model", hidden=64, heads=2, seed=0))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_worker"]:
        return worker(argv[1] == "--forced", argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,3,4", help="comma list from 1-4 (see above)")
    ap.add_argument("--model", default=os.environ.get("GRPOKIT_BENCH_MODEL", DEFAULT_MODEL))
    ap.add_argument("--python", default=os.environ.get("GRPOKIT_VLLM_PYTHON", str(VLLM_PY)))
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per row (4)")
    ap.add_argument("--warmup", type=int, default=1, help="first steps not counted (1)")
    ap.add_argument("--max_completion_length", type=int, default=None, help="(64)")
    ap.add_argument("--not_forced", dest="forced", action="store_false", help="allow EOS")
    ap.add_argument(
        "--threads", type=int, default=None, help="OMP_NUM_THREADS of every process (cores / N)"
    )
    ap.add_argument("--kv_cache_gb", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE (whole GB)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per server start / run, s")
    ap.add_argument("--tiny", action="store_true", help="smoke run: tiny model, 2 steps, 8 tokens")
    ap.add_argument("--output_dir", default="outputs/bench-layouts")
    a = ap.parse_args(argv)
    a.steps = a.steps or (2 if a.tiny else 4)
    a.max_completion_length = a.max_completion_length or (8 if a.tiny else 64)
    if a.warmup >= a.steps:
        print(f"--steps {a.steps} leaves no step after --warmup {a.warmup}; raise --steps")
        return 2
    if not Path(a.python).exists():
        print(f"missing {a.python}: `./run test-vllm` builds .venv-vllm, or pass --python")
        return 2
    try:
        rows = [int(x) for x in a.rows.split(",")]
    except ValueError:
        rows = [0]
    if not set(rows) <= set(ROWS):
        print(f"--rows: {a.rows!r} is not a comma list from 1, 2, 3, 4")
        return 2
    if not a.tiny:
        from grpokit.models import local_model_path

        a.model = local_model_path(a.model)
    if not a.tiny and not Path(a.model).is_dir():
        print(f"--model {a.model}: not a local model directory (the rollout server needs one)")
        return 2
    work = Path(a.output_dir) / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    model = make_tiny(work) if a.tiny else a.model
    ncores = cores()
    header = (
        f"bench/layouts.py {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {ncores} CPU "
        f"cores, no GPU; {'tiny random model' if a.tiny else Path(model).name}, float32, "
        f"max_completion_length {a.max_completion_length} "
        f"({'forced' if a.forced else 'EOS allowed'}), {a.steps} steps per row of which "
        f"{a.warmup} warm-up, OMP_NUM_THREADS "
        + (
            f"{a.threads} per process"
            if a.threads
            else f"{ncores} / training processes, server {ncores}"
        )
    )
    print(header, flush=True)
    results: dict[int, dict] = {}
    for k in rows:
        r = run_row(a, k, model, work)
        results[k] = r
        msg = r.get("error") or (
            f"{r.get('step') or float('nan'):.2f} s/step, peak RSS {r['rss_gb']:.2f} GB"
        )
        print(f"row {k} ({r['label']}): {msg}; wall {r['wall_s']:.0f} s", flush=True)
        (work / "layouts.json").write_text(
            json.dumps({"header": header, "rows": results}, indent=1)
        )
    print("\n" + table(results) + "\n")
    print(CAVEAT.format(cores=ncores))
    if a.threads:
        print(
            f"(Here --threads {a.threads}: every process has {a.threads} thread(s), so the "
            "layouts do not all use the same number of cores; leave --threads out to compare.)"
        )
    print(f"\nresults and logs: {work}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
