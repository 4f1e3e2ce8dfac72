"""The page's sections as HTML fragments, each from the loaded run: summary, key settings,
held-out eval before/after, sampled completions at milestone steps, held-out examples, and
the status banner. Every value from the run is escaped."""

from __future__ import annotations

import html
import json
import time
from typing import Any

from grpokit.report.data import RunData, finite
from grpokit.report.series import ema, milestone_steps, series

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
REFRESH_SECONDS = 30


def escape(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(v: Any, digits: int = 4) -> str:
    f = finite(v)
    if f is None:
        return "—" if v is None else escape(v)
    return f"{int(f)}" if f == int(f) and abs(f) < 1e15 else f"{f:.{digits}g}"


def _fmt_seconds(s: float) -> str:
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(rows_) + "</tr>" for rows_ in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def summary_html(d: RunData) -> str:
    items: list[tuple[str, str]] = [("run directory", escape(d.run_dir))]
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


def settings_html(d: RunData) -> str:
    if d.config is None:
        return '<p class="note">no readable config.yaml</p>'
    rows = [
        [f"<th>{escape(k)}</th>", f"<td>{escape(_plain(d.config[k]))}</td>"]
        for k in KEY_SETTINGS
        if k in d.config
    ]
    return "<table>" + "".join("<tr>" + "".join(r) + "</tr>" for r in rows) + "</table>"


def eval_table_html(d: RunData) -> str:
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
        row = [f"<th>{escape(k)}</th>"] + [f'<td class="num">{_num(v)}</td>' for v in vals]
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
    return "<br>".join(f"{escape(f)}: {_num(v, 3)}" for f, v in r.items())


def completions_html(d: RunData, per_step: int = 4) -> str:
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
            f"advantage.</p><p><b>prompt</b></p><pre>{escape(group[0].get('prompt', ''))}</pre>"
        )
        rows = []
        for r in group:
            adv = finite(r.get("advantage"))
            cls = "" if adv is None else (' class="pos"' if adv > 0 else ' class="neg"')
            rows.append(
                [
                    f'<td class="num">{_num(r.get("advantage"), 3)}</td>',
                    f"<td>{_rewards_cell(r.get('rewards'))}</td>",
                    f"<td{cls}><pre>{escape(r.get('completion', ''))}</pre></td>",
                ]
            )
        out.append(_table(["advantage", "rewards", "completion"], rows))
    return "\n".join(out)


def eval_examples_html(d: RunData) -> str:
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
        return f"<td>{mark.get(ok, '')}<pre>{escape(e.get('completion', ''))}</pre></td>"

    rows = [
        [f"<td><pre>{escape(p)}</pre></td>"] + [cell(es.get(n)) for n, _ in cols]
        for p, es in prompts.items()
    ]
    return _table(["prompt"] + [n for n, _ in cols], rows)


def status_banner(status: dict[str, Any] | None) -> tuple[str, str]:
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
    where = f"step {escape(step)} of {escape(total)}" if step is not None else ""
    if state == "running":
        return (
            f'\n<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
            f'<p class="banner running">Run in progress: {where}, report written {when_s}; '
            f"this page reloads every {REFRESH_SECONDS} s.</p>",
        )
    if state == "failed":
        return "", (
            f'<p class="banner failed">The run failed at {where} ({when_s}): '
            f"{escape(status.get('error', ''))}</p>"
        )
    if state == "stopped":
        return "", (
            f'<p class="banner">The run was stopped at {where} ({when_s}) with a checkpoint; '
            "--resume continues it.</p>"
        )
    return "", ""


def health_html(d: RunData) -> str:
    """The training-health alerts (status.json's ``health`` section, grpokit/health.py): each
    alert that fired or cleared, with its line, and which are still active."""
    h = (d.status or {}).get("health")
    if not isinstance(h, dict):
        return (
            '<p class="note">no health checks recorded (health_checks: off, or no status.json)</p>'
        )
    events = [e for e in h.get("events") or [] if isinstance(e, dict)]
    mode = escape(h.get("mode", "?"))
    if not events:
        return f'<p class="good">No training-health alert fired (health_checks: {mode}).</p>'
    active = h.get("active") if isinstance(h.get("active"), dict) else {}
    rows = [
        [
            f'<td class="num">{_num(e.get("step"))}</td>',
            f"<td>{escape(e.get('alert', ''))}</td>",
            f'<td class="{"bad" if e.get("event") == "fired" else "good"}">'
            f"{escape(e.get('event', ''))}</td>",
            f"<td>{escape(e.get('line', ''))}</td>",
        ]
        for e in events
    ]
    still = ", ".join(escape(k) for k in active) or "none"
    head = f"<p>health_checks: {mode}; still active at the last write: {still}.</p>"
    if h.get("stopped_by"):
        head += f'<p class="bad">The run was ended by: {escape(h["stopped_by"])}</p>'
    return head + _table(["step", "alert", "event", "what is wrong and what to change"], rows)
