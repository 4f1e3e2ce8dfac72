"""The training-curve panels, drawn with matplotlib (imported only here, and only when
drawing: ``pip install grpokit[report]``)."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpokit.report.data import RunData, finite
from grpokit.report.series import ema, reward_funcs, series

TIME_PARTS = ("generation", "scoring", "reference", "training")


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


def _plot_tools(d: RunData):
    """Tool calling (TRL's names): how often completions call and how often a call fails,
    and the failures by kind (malformed, unknown, raised, timeout) per step."""
    kinds = sorted({k for r in d.train for k in r if k.startswith("tools/failures/")})
    fig, (a1, a2) = _figure(2)
    ok1 = _lines(a1, d.train, ["tools/call_frequency", "tools/failure_frequency"],
                 ["completions that called", "calls that failed"])  # fmt: skip
    ok2 = _lines(a2, d.train, kinds, [k.rsplit("/", 1)[1] for k in kinds])
    if not (ok1 or ok2):
        return None
    a1.set_ylabel("fraction")
    a2.set_ylabel("failed calls")
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
    ("tools", "Tool calls", _plot_tools),
    (
        "dynamic_sampling",
        "Dynamic sampling: generation rounds a step, dropped (equal-reward) groups",
        _simple(["dynamic_sampling/num_gen_batches", "dynamic_sampling/dropped_frac"], "value"),
    ),
]
# Panels only some runs have (tools, dynamic_sampling): no "omitted" note when absent.
OPTIONAL_PANELS = {"tools", "dynamic_sampling"}


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
            if (d.train and slug not in OPTIONAL_PANELS) or slug == "accuracy":
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
