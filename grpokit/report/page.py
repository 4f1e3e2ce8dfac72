"""The page: one self-contained ``report.html`` (inline CSS, PNGs as base64 data URIs, no
scripts, so it opens from disk with no network), written atomically with its PNGs in
``plots/`` beside it."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from grpokit.report.data import RunData, load_run
from grpokit.report.plots import Plot, make_plots
from grpokit.report.sections import (
    completions_html,
    escape,
    eval_examples_html,
    eval_table_html,
    health_html,
    settings_html,
    status_banner,
    summary_html,
)

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


WIDE = ' class="wide"'


def render_html(d: RunData, plots: list[Plot], notes: list[str]) -> str:
    cfg = d.config or {}
    title = f"grpokit report — {d.run_dir.name or d.run_dir}"
    sub = " · ".join(escape(cfg[k]) for k in ("model_name_or_path", "task") if cfg.get(k))
    figs = "".join(
        f'<figure id="{p.slug}"{WIDE if p.wide else ""}>'
        f"<figcaption>{escape(p.title)}</figcaption>"
        f'<img alt="{escape(p.title)}" src="data:image/png;base64,{base64.b64encode(p.png).decode()}">'
        "</figure>"
        for p in plots
    )
    all_notes = (
        d.notes + [f"{f}: {n} malformed line(s) skipped" for f, n in d.skipped.items() if n] + notes
    )
    notes_html = "".join(f'<li class="note">{escape(n)}</li>' for n in all_notes)
    config_html = (
        f"<details><summary>full config.yaml</summary><pre>{escape(d.config_text)}</pre></details>"
        if d.config_text
        else ""
    )
    refresh, banner = status_banner(d.status)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">{refresh}
<title>{escape(title)}</title><style>{CSS}</style></head>
<body>
<h1>{escape(title)}</h1><p>{sub}</p>{banner}
<h2>Run summary</h2>{summary_html(d)}
{"<ul>" + notes_html + "</ul>" if notes_html else ""}
<h2>Training health</h2>{health_html(d)}
<h2>Key settings</h2>{settings_html(d)}{config_html}
<h2>Held-out evaluation, before → after</h2>{eval_table_html(d)}
<h2>Training curves</h2><p>Noisy per-step values are drawn as faint points with an
exponential moving average (EMA) over them.</p>
<div class="grid">{figs or '<p class="note">no plots</p>'}</div>
<h2>Sampled completions at milestone steps</h2>{completions_html(d)}
<h2>Held-out examples, before and after</h2>{eval_examples_html(d)}
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
