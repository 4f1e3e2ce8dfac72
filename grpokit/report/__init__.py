"""``grpokit report RUN_DIR``: plots and one self-contained HTML page from a run's own files.

Inputs (all optional, all read tolerantly; a missing file or key drops its panel with a note):
``metrics.jsonl`` (one row per logged step, plus ``eval/<key>`` rows), ``completions.jsonl``
(``{step, prompt, completion, rewards: {func: value}, advantage}``), ``eval_summary.json``
or ``eval_before.json`` / ``eval_after.json``, ``status.json`` and ``config.yaml``.

Outputs: ``report.html`` (inline CSS, PNGs embedded as base64 data URIs, no scripts, so it
opens from disk with no network) and the same plots as PNG files in ``plots/`` beside it.
matplotlib is imported only inside the plotting functions (``pip install grpokit[report]``).

The rooms: ``data`` (reading the run directory), ``series`` (metric series, smoothing,
milestones), ``plots`` (the panels), ``sections`` (the page's HTML fragments), ``page`` (the
whole page, written atomically).
"""

from grpokit.report.data import RunData, finite, load_run, read_jsonl
from grpokit.report.page import render_html, write_report
from grpokit.report.plots import PANELS, Plot, make_plots
from grpokit.report.series import ema, milestone_steps, reward_funcs, series, smoothing_weight

__all__ = [
    "PANELS",
    "Plot",
    "RunData",
    "ema",
    "finite",
    "load_run",
    "make_plots",
    "milestone_steps",
    "read_jsonl",
    "render_html",
    "reward_funcs",
    "series",
    "smoothing_weight",
    "write_report",
]
