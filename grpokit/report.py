"""``grpokit report RUN_DIR``: plots and one self-contained HTML page from a run's own files.

Inputs (all optional, all read tolerantly; a missing file or key drops its panel with a note):
``metrics.jsonl`` (one row per logged step, plus ``eval/<key>`` rows), ``completions.jsonl``
(``{step, prompt, completion, rewards: {func: value}, advantage}``), ``eval_summary.json``
or ``eval_before.json`` / ``eval_after.json``, and ``config.yaml``.

Outputs: ``report.html`` (inline CSS, PNGs embedded as base64 data URIs, no scripts, so it
opens from disk with no network) and the same plots as PNG files in ``plots/`` beside it.
matplotlib is imported only inside the plotting functions (``pip install grpokit[report]``).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEY_SETTINGS = (
    "model_name_or_path",
    "task",
    "reward_funcs",
    "reward_weights",
    "num_generations",
    "learning_rate",
    "beta",
    "loss_type",
    "max_steps",
)
TIME_PARTS = ("generation", "scoring", "reference", "training")


# ----------------------------------------------------------------------------- reading


@dataclass
class RunData:
    """Everything the report shows, read from a run directory."""

    run_dir: Path
    train: list[dict[str, Any]] = field(default_factory=list)  # one row per step, sorted
    evals: list[dict[str, Any]] = field(default_factory=list)  # rows holding eval/<key>
    completions: list[dict[str, Any]] = field(default_factory=list)
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    config_text: str | None = None
    skipped: dict[str, int] = field(default_factory=dict)  # file -> malformed lines
    notes: list[str] = field(default_factory=list)
    status: dict[str, Any] | None = None  # status.json: running / finished / stopped / failed


def finite(v: Any) -> float | None:
    """``v`` as a float, or None when it is missing, not a number, NaN or infinite."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a jsonl file, and the number of lines that were not one."""
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(obj, dict) and finite(obj.get("step")) is not None:
            rows.append(obj)
        else:
            bad += 1
    return rows, bad


def _read_json(path: Path, notes: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(errors="replace"))
    except ValueError as e:
        notes.append(f"{path.name} is not valid JSON ({e}); ignored")
        return None
    if not isinstance(obj, dict):
        notes.append(f"{path.name} does not hold a JSON object; ignored")
        return None
    return obj


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; never raises on missing or malformed files."""
    d = RunData(Path(run_dir))
    p = d.run_dir / "metrics.jsonl"
    if p.is_file():
        rows, d.skipped["metrics.jsonl"] = read_jsonl(p)
        by_step: dict[float, dict[str, Any]] = {}
        for r in rows:
            ev = {k: v for k, v in r.items() if k.startswith("eval/")}
            tr = {k: v for k, v in r.items() if not k.startswith("eval/")}
            if ev:
                d.evals.append({"step": r["step"], **ev})
            if len(tr) > 1:  # a resumed run may log a step twice: the last one wins
                by_step[r["step"]] = tr
        d.train = [by_step[s] for s in sorted(by_step)]
        d.evals.sort(key=lambda r: r["step"])
    else:
        d.notes.append("no metrics.jsonl: training curves are omitted")
    p = d.run_dir / "completions.jsonl"
    if p.is_file():
        d.completions, d.skipped["completions.jsonl"] = read_jsonl(p)
    summary = _read_json(d.run_dir / "eval_summary.json", d.notes) or {}
    before, after = summary.get("before"), summary.get("after")
    d.before = (
        before if isinstance(before, dict) else _read_json(d.run_dir / "eval_before.json", d.notes)
    )
    d.after = (
        after if isinstance(after, dict) else _read_json(d.run_dir / "eval_after.json", d.notes)
    )
    st = d.run_dir / "status.json"
    if st.is_file():
        status = _read_json(st, d.notes)
        d.status = status if isinstance(status, dict) else None
    p = d.run_dir / "config.yaml"
    if p.is_file():
        d.config_text = p.read_text(errors="replace")
        try:
            import yaml

            cfg = yaml.safe_load(d.config_text)
            d.config = cfg if isinstance(cfg, dict) else None
        except Exception as e:  # a broken config must not stop the report
            d.notes.append(f"config.yaml could not be parsed ({type(e).__name__}); shown raw")
    return d


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over ``rows``, keeping only finite values."""
    xs, ys = [], []
    for r in rows:
        v = finite(r.get(key))
        if v is not None:
            xs.append(float(r["step"]))
            ys.append(v)
    return xs, ys


def smoothing_weight(n: int) -> float:
    """EMA weight for ``n`` points: none for a handful, up to 0.95 for long runs."""
    return min(0.95, max(0.0, 1.0 - 5.0 / n)) if n else 0.0


def ema(values: list[float], weight: float | None = None) -> list[float]:
    """Debiased exponential moving average (as TensorBoard's smoothing slider)."""
    w = smoothing_weight(len(values)) if weight is None else weight
    out, acc, norm = [], 0.0, 0.0
    for v in values:
        acc = w * acc + (1 - w) * v
        norm = w * norm + (1 - w)
        out.append(acc / norm)
    return out


def reward_funcs(d: RunData) -> list[str]:
    """Reward-function names found in ``rewards/<func>/mean`` columns, in first-seen order."""
    names: dict[str, None] = {}
    for r in d.train:
        for k in r:
            if k.startswith("rewards/") and k.endswith("/mean"):
                names[k[len("rewards/") : -len("/mean")]] = None
    return list(names)


# ----------------------------------------------------------------------------- plots


@dataclass
class Plot:
    slug: str
    title: str
    png: bytes
    wide: bool = False  # several panels side by side: spans the page's whole row


def _figure(ncols: int = 1):
    from matplotlib.figure import Figure  # lazy: `import grpokit` stays light

    fig = Figure(figsize=(6.4 * ncols if ncols > 1 else 7.0, 3.4), dpi=100)
    axes = fig.subplots(1, ncols)
    for ax in axes if ncols > 1 else [axes]:
        ax.grid(alpha=0.3)
        ax.set_xlabel("step")
    return fig, axes


def _lines(ax, rows, keys: list[str], labels=None, smooth: bool = False) -> bool:
    """Draw each key as a line (or raw points + EMA when ``smooth``); False if none has data."""
    drawn = False
    for i, key in enumerate(keys):
        xs, ys = series(rows, key)
        if not xs:
            continue
        label = labels[i] if labels else key
        if smooth and len(xs) > 1:
            pts = ax.plot(xs, ys, ".", alpha=0.3, ms=4)[0]
            ax.plot(xs, ema(ys), "-", color=pts.get_color(), lw=2, label=f"{label} (EMA)")
        else:
            ax.plot(xs, ys, "-o" if len(xs) < 30 else "-", ms=3, label=label)
        drawn = True
    if drawn:
        ax.legend(fontsize=8)
    return drawn


def _simple(keys: list[str], ylabel: str, smooth: bool = False, log: bool = False) -> Callable:
    def draw(d: RunData):
        fig, ax = _figure()
        if not _lines(ax, d.train, keys, smooth=smooth):
            return None
        ax.set_ylabel(ylabel)
        if log and all(v > 0 for k in keys for v in series(d.train, k)[1]):
            ax.set_yscale("log")
        return fig

    return draw


def _plot_rewards(d: RunData):
    funcs = reward_funcs(d)
    fig, (a1, a2) = _figure(2)
    ok1 = _lines(a1, d.train, ["reward"], ["total reward"], smooth=True)
    keys = [f"rewards/{f}/mean" for f in funcs]
    ok2 = _lines(a2, d.train, keys, funcs, smooth=True)
    if not (ok1 or ok2):
        return None
    a1.set_title("total (weighted) reward", fontsize=10)
    a2.set_title("reward functions (mean)", fontsize=10)
    return fig


def _plot_lengths(d: RunData):
    fig, (a1, a2) = _figure(2)
    ok1 = False
    xs, lo = series(d.train, "completions/min_length")
    xh, hi = series(d.train, "completions/max_length")
    if xs and xs == xh:
        a1.fill_between(xs, lo, hi, alpha=0.2, label="min..max")
        ok1 = True
    ok1 = _lines(a1, d.train, ["completions/mean_length"], ["mean length"]) or ok1
    if ok1:
        a1.legend(fontsize=8)
    a1.set_ylabel("tokens")
    ok2 = _lines(a2, d.train, ["completions/clipped_ratio"], ["clipped (truncated) ratio"])
    if not (ok1 or ok2):
        return None
    return fig


def _plot_accuracy(d: RunData):
    fig, ax = _figure()
    ok = _lines(ax, d.train, ["accuracy"], ["train accuracy (samples)"], smooth=True)
    xs, ys = series(d.evals, "eval/accuracy")
    last = max([r["step"] for r in d.train + d.evals] or [0])
    b = finite((d.before or {}).get("accuracy"))
    a = finite((d.after or {}).get("accuracy"))
    ex, ey = ([0.0] if b is not None else []) + xs, ([b] if b is not None else []) + ys
    if a is not None:
        ex, ey = ex + [float(last)], ey + [a]
    if ex:
        ax.plot(ex, ey, "s--", color="black", ms=6, label="held-out eval (greedy)")
        ok = True
    if not ok:
        return None
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8)
    return fig


def _plot_time(d: RunData):
    rows = [r for r in d.train if any(finite(r.get(f"time/{p}")) for p in TIME_PARTS)]
    if not rows:
        return None
    fig, ax = _figure()
    xs = [float(r["step"]) for r in rows]
    parts = {p: [finite(r.get(f"time/{p}")) or 0.0 for r in rows] for p in TIME_PARTS}
    total = [finite(r.get("time/step")) for r in rows]
    parts["other"] = [
        max(0.0, (t or 0.0) - sum(v[i] for v in parts.values())) for i, t in enumerate(total)
    ]
    parts = {p: v for p, v in parts.items() if any(v)}
    if len(xs) <= 100:
        bottom = [0.0] * len(xs)
        width = 0.8 * (min(b - a for a, b in zip(xs, xs[1:])) if len(xs) > 1 else 1.0)
        for p, v in parts.items():
            ax.bar(xs, v, width=width, bottom=bottom, label=p)
            bottom = [b + y for b, y in zip(bottom, v)]
    else:
        ax.stackplot(xs, *parts.values(), labels=list(parts))
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8, ncol=len(parts))
    return fig


# (slug, title, draw function) in page order
PANELS: list[tuple[str, str, Callable]] = [
    ("reward", "Reward", _plot_rewards),
    ("accuracy", "Accuracy: training samples and held-out eval", _plot_accuracy),
    (
        "reward_spread",
        "Reward spread within groups",
        _simple(["reward_std", "frac_reward_zero_std"], "value"),
    ),
    ("kl", "KL to the reference model", _simple(["kl"], "kl")),
    (
        "clip_ratio",
        "Clip ratios",
        _simple(["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"], "ratio"),
    ),
    ("entropy", "Entropy", _simple(["entropy"], "nats / token", smooth=True)),
    ("lengths", "Completion length and truncation", _plot_lengths),
    ("loss", "Loss", _simple(["loss"], "loss", smooth=True)),
    ("learning_rate", "Learning rate", _simple(["learning_rate"], "lr")),
    ("grad_norm", "Gradient norm (before clipping)", _simple(["grad_norm"], "norm", smooth=True)),
    ("time", "Step time split", _plot_time),
]


def make_plots(d: RunData, plots_dir: Path | None = None) -> tuple[list[Plot], list[str]]:
    """Render every panel that has data; write PNGs to ``plots_dir``. Returns (plots, notes)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return [], ["matplotlib is not installed (pip install 'grpokit[report]'): no plots"]
    plots, notes = [], []
    for slug, title, draw in PANELS:
        try:
            fig = draw(d)
        except Exception as e:  # one bad panel must not cost the whole report
            notes.append(f"plot '{title}' failed: {type(e).__name__}: {e}")
            continue
        if fig is None:
            if d.train or slug == "accuracy":
                notes.append(f"plot '{title}' omitted: no data")
            continue
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plots.append(Plot(slug, title, buf.getvalue(), wide=fig.get_figwidth() > 8))
    if plots_dir is not None and plots:
        plots_dir.mkdir(parents=True, exist_ok=True)
        for p in plots:
            (plots_dir / f"{p.slug}.png").write_bytes(p.png)
    return plots, notes


# ----------------------------------------------------------------------------- HTML

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
 max-width:1400px;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:4px 8px;
 text-align:left;vertical-align:top} th{background:#f5f5f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(620px,1fr));gap:1em}
figure{margin:0;border:1px solid #eee;padding:.5em} figure img{max-width:100%}
figure.wide{grid-column:1/-1}
figcaption{font-weight:600;margin-bottom:.3em}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font-size:.9em;max-width:900px}
.note{color:#8a5a00} .good{color:#176f2c} .bad{color:#a11}
.pos{background:#eef8ee} .neg{background:#fbeeee}
.banner{padding:.6em 1em;border:1px solid #ccc;background:#f7f7f7}
.banner.running{border-color:#7aa7d8;background:#eef4fb} .banner.failed{border-color:#d88;background:#fbeeee}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(v: Any, digits: int = 4) -> str:
    f = finite(v)
    if f is None:
        return "—" if v is None else _e(v)
    return f"{int(f)}" if f == int(f) and abs(f) < 1e15 else f"{f:.{digits}g}"


def _fmt_seconds(s: float) -> str:
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(rows_) + "</tr>" for rows_ in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(d: RunData) -> str:
    items: list[tuple[str, str]] = [("run directory", _e(d.run_dir))]
    cfg = d.config or {}
    if d.train:
        steps = [r["step"] for r in d.train]
        items.append(("steps logged", f"{len(steps)} (last step {_num(steps[-1])})"))
        wall = sum(series(d.train, "time/step")[1])
        if wall:
            items.append(("training wall time (sum of time/step)", _fmt_seconds(wall)))
        tok = sum(series(d.train, "tokens_generated")[1])
        if tok:
            items.append(("tokens generated", f"{int(tok):,}"))
        for key, label in (("reward", "reward"), ("accuracy", "train accuracy")):
            ys = series(d.train, key)[1]
            if len(ys) > 1:
                sm = ema(ys)
                items.append((f"{label} (EMA) first → last", f"{_num(sm[0])} → {_num(sm[-1])}"))
    if cfg.get("max_steps"):
        items.append(("max_steps (config)", _num(cfg["max_steps"])))
    rows = [[f"<th>{k}</th>", f"<td>{v}</td>"] for k, v in items]
    return "<table>" + "".join("<tr>" + "".join(r) + "</tr>" for r in rows) + "</table>"


def _plain(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _settings(d: RunData) -> str:
    if d.config is None:
        return '<p class="note">no readable config.yaml</p>'
    rows = [
        [f"<th>{_e(k)}</th>", f"<td>{_e(_plain(d.config[k]))}</td>"]
        for k in KEY_SETTINGS
        if k in d.config
    ]
    return "<table>" + "".join("<tr>" + "".join(r) + "</tr>" for r in rows) + "</table>"


def _eval_table(d: RunData) -> str:
    cols = [(n, r) for n, r in (("before", d.before), ("after", d.after)) if r]
    if not cols:
        return '<p class="note">no eval_summary.json / eval_before.json / eval_after.json</p>'
    keys = ["accuracy", "format_rate", "mean_length", "truncated_ratio", "num_prompts"]
    keys += sorted({k for _, r in cols for k in r if k.startswith("pass@")})
    funcs = sorted({f for _, r in cols if isinstance(r.get("rewards"), dict) for f in r["rewards"]})
    rows = []

    def get(r: dict[str, Any], k: str) -> Any:
        if k.startswith("reward/"):
            return (r.get("rewards") or {}).get(k[len("reward/") :])
        return r.get(k)

    for k in keys + [f"reward/{f}" for f in funcs]:
        vals = [get(r, k) for _, r in cols]
        if all(v is None for v in vals):
            continue
        row = [f"<th>{_e(k)}</th>"] + [f'<td class="num">{_num(v)}</td>' for v in vals]
        if (
            len(vals) == 2
            and k != "num_prompts"
            and finite(vals[0]) is not None
            and finite(vals[1]) is not None
        ):
            diff = vals[1] - vals[0]
            row.append(f'<td class="num">{"+" if diff >= 0 else ""}{_num(diff)}</td>')
        elif len(vals) == 2:
            row.append("<td></td>")
        rows.append(row)
    header = ["held-out eval"] + [n for n, _ in cols] + (["Δ"] if len(cols) == 2 else [])
    return _table(header, rows)


def milestone_steps(steps: list[float], between: int = 3) -> list[float]:
    """First, ``between`` evenly spaced, and last of the sorted distinct ``steps``."""
    steps = sorted(set(steps))
    n = len(steps)
    if n <= between + 2:
        return steps
    idx = {0, n - 1} | {round(i * (n - 1) / (between + 1)) for i in range(1, between + 1)}
    return [steps[i] for i in sorted(idx)]


def _pick(rows: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The first prompt's group at a step, best to worst advantage, trimmed to ``k`` (keeping
    both ends so the contrast the update learns from stays visible)."""
    prompt = rows[0].get("prompt")
    group = [r for r in rows if r.get("prompt") == prompt]
    group.sort(key=lambda r: -(finite(r.get("advantage")) or 0.0))
    if len(group) > k:
        group = group[: (k + 1) // 2] + group[len(group) - k // 2 :]
    return group


def _rewards_cell(r: Any) -> str:
    if not isinstance(r, dict):
        return "—"
    return "<br>".join(f"{_e(f)}: {_num(v, 3)}" for f, v in r.items())


def _completions(d: RunData, per_step: int = 4) -> str:
    if not d.completions:
        return '<p class="note">no completions.jsonl: no sampled completions to show</p>'
    by_step: dict[float, list[dict[str, Any]]] = {}
    for r in d.completions:
        by_step.setdefault(r["step"], []).append(r)
    out = []
    for s in milestone_steps(list(by_step)):
        group = _pick(by_step[s], per_step)
        n_prompts = len({r.get("prompt") for r in by_step[s]})
        out.append(
            f"<h3>step {_num(s)}</h3><p>{len(by_step[s])} completions logged for {n_prompts} "
            f"prompt(s); showing {len(group)} of the first prompt's group, best to worst "
            f"advantage.</p><p><b>prompt</b></p><pre>{_e(group[0].get('prompt', ''))}</pre>"
        )
        rows = []
        for r in group:
            adv = finite(r.get("advantage"))
            cls = "" if adv is None else (' class="pos"' if adv > 0 else ' class="neg"')
            rows.append(
                [
                    f'<td class="num">{_num(r.get("advantage"), 3)}</td>',
                    f"<td>{_rewards_cell(r.get('rewards'))}</td>",
                    f"<td{cls}><pre>{_e(r.get('completion', ''))}</pre></td>",
                ]
            )
        out.append(_table(["advantage", "rewards", "completion"], rows))
    return "\n".join(out)


def _eval_examples(d: RunData) -> str:
    cols = [(n, r) for n, r in (("before", d.before), ("after", d.after)) if r]
    ex = {n: [e for e in r.get("examples") or [] if isinstance(e, dict)] for n, r in cols}
    if not any(ex.values()):
        return '<p class="note">no held-out examples recorded</p>'
    prompts: dict[str, dict[str, dict[str, Any]]] = {}
    for n, es in ex.items():
        for e in es:
            prompts.setdefault(str(e.get("prompt", "")), {})[n] = e

    def cell(e: dict[str, Any] | None) -> str:
        if e is None:
            return "<td>—</td>"
        ok = e.get("correct")
        mark = {
            True: '<span class="good">✓ correct</span>',
            False: '<span class="bad">✗ wrong</span>',
        }
        return f"<td>{mark.get(ok, '')}<pre>{_e(e.get('completion', ''))}</pre></td>"

    rows = [
        [f"<td><pre>{_e(p)}</pre></td>"] + [cell(es.get(n)) for n, _ in cols]
        for p, es in prompts.items()
    ]
    return _table(["prompt"] + [n for n, _ in cols], rows)


REFRESH_SECONDS = 30


def _status_banner(status: dict[str, Any] | None) -> tuple[str, str]:
    """(meta refresh tag, banner HTML) for the run's status.json: a running run's page
    reloads itself, so an open tab follows the run."""
    if not status:
        return "", ""
    state = str(status.get("state", ""))
    step, total = status.get("step"), status.get("total_steps")
    when = status.get("updated")
    when_s = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
        if isinstance(when, (int, float))
        else "?"
    )
    where = f"step {_e(step)} of {_e(total)}" if step is not None else ""
    if state == "running":
        return (
            f'\n<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
            f'<p class="banner running">Run in progress: {where}, report written {when_s}; '
            f"this page reloads every {REFRESH_SECONDS} s.</p>",
        )
    if state == "failed":
        return "", (
            f'<p class="banner failed">The run failed at {where} ({when_s}): '
            f"{_e(status.get('error', ''))}</p>"
        )
    if state == "stopped":
        return "", (
            f'<p class="banner">The run was stopped at {where} ({when_s}) with a checkpoint; '
            "--resume continues it.</p>"
        )
    return "", ""


WIDE = ' class="wide"'


def render_html(d: RunData, plots: list[Plot], notes: list[str]) -> str:
    cfg = d.config or {}
    title = f"grpokit report — {d.run_dir.name or d.run_dir}"
    sub = " · ".join(_e(cfg[k]) for k in ("model_name_or_path", "task") if cfg.get(k))
    figs = "".join(
        f'<figure id="{p.slug}"{WIDE if p.wide else ""}>'
        f"<figcaption>{_e(p.title)}</figcaption>"
        f'<img alt="{_e(p.title)}" src="data:image/png;base64,{base64.b64encode(p.png).decode()}">'
        "</figure>"
        for p in plots
    )
    all_notes = (
        d.notes + [f"{f}: {n} malformed line(s) skipped" for f, n in d.skipped.items() if n] + notes
    )
    notes_html = "".join(f'<li class="note">{_e(n)}</li>' for n in all_notes)
    config_html = (
        f"<details><summary>full config.yaml</summary><pre>{_e(d.config_text)}</pre></details>"
        if d.config_text
        else ""
    )
    refresh, banner = _status_banner(d.status)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">{refresh}
<title>{_e(title)}</title><style>{CSS}</style></head>
<body>
<h1>{_e(title)}</h1><p>{sub}</p>{banner}
<h2>Run summary</h2>{_summary(d)}
{"<ul>" + notes_html + "</ul>" if notes_html else ""}
<h2>Key settings</h2>{_settings(d)}{config_html}
<h2>Held-out evaluation, before → after</h2>{_eval_table(d)}
<h2>Training curves</h2><p>Noisy per-step values are drawn as faint points with an
exponential moving average (EMA) over them.</p>
<div class="grid">{figs or '<p class="note">no plots</p>'}</div>
<h2>Sampled completions at milestone steps</h2>{_completions(d)}
<h2>Held-out examples, before and after</h2>{_eval_examples(d)}
</body></html>
"""


def write_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write ``report.html`` (default ``RUN_DIR/report.html``) and its PNGs in ``plots/``
    beside it. Returns the HTML path. The HTML is replaced atomically, so a browser reading
    it while a run rewrites it never sees half a page."""
    d = load_run(run_dir)
    out = Path(output) if output else d.run_dir / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    plots, notes = make_plots(d, out.parent / "plots")
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(render_html(d, plots, notes), encoding="utf-8")
    os.replace(tmp, out)
    return out
