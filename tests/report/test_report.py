import json
import re

import pytest

pytest.importorskip("matplotlib")

from grpokit.cli import main  # noqa: E402
from grpokit.report import ema, load_run, milestone_steps, write_report  # noqa: E402

FUNCS = ("correct", "format")


def _metrics_row(step: int) -> dict:
    r = {
        "step": step,
        "loss": 0.1 - 0.01 * step,
        "reward": 0.1 * step,
        "reward_std": 0.5,
        "frac_reward_zero_std": 0.25,
        "kl": 0.001 * step,
        "clip_ratio/low_mean": 0.0,
        "clip_ratio/high_mean": 0.01,
        "clip_ratio/region_mean": 0.01,
        "entropy": 1.0 - 0.05 * step,
        "completions/mean_length": 30.0 - step,
        "completions/min_length": 5.0,
        "completions/max_length": 64.0,
        "completions/clipped_ratio": 0.1,
        "grad_norm": 1.5,
        "learning_rate": 1e-5,
        "accuracy": 0.05 * step,
        "time/generation": 2.0,
        "time/scoring": 0.1,
        "time/reference": 0.2,
        "time/training": 1.0,
        "time/step": 3.5,
        "tokens_generated": 100.0,
    }
    for f in FUNCS:
        r[f"rewards/{f}/mean"] = 0.05 * step
        r[f"rewards/{f}/std"] = 0.3
    return r


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _eval(acc: float, completion: str) -> dict:
    return {
        "accuracy": acc,
        "format_rate": acc / 2,
        "mean_length": 20.0,
        "truncated_ratio": 0.1,
        "rewards": {f: acc for f in FUNCS},
        "num_prompts": 8,
        "examples": [{"prompt": "What is 2 + 3?", "completion": completion, "correct": acc > 0.5}],
    }


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    rows = [_metrics_row(s) for s in range(1, 11)]
    rows.insert(5, {"step": 5, "eval/accuracy": 0.4, "eval/format_rate": 0.3})
    _write_jsonl(d / "metrics.jsonl", rows)
    comps = [
        {
            "step": s,
            "prompt": "What is 2 + 3?",
            "completion": f"step{s} sample{g} <answer>5</answer> & done",
            "rewards": {"correct": float(g % 2), "format": None},
            "advantage": 1.0 if g % 2 else -1.0,
        }
        for s in range(1, 11)
        for g in range(4)
    ]
    _write_jsonl(d / "completions.jsonl", comps)
    before, after = _eval(0.25, "2 + 3 = 6 <b>"), _eval(0.75, "<answer>5</answer>")
    (d / "eval_before.json").write_text(json.dumps(before))
    (d / "eval_after.json").write_text(json.dumps(after))
    (d / "eval_summary.json").write_text(json.dumps({"before": before, "after": after}))
    (d / "config.yaml").write_text(
        "model_name_or_path: tiny/model\ntask: arithmetic\nreward_funcs: [correct, format]\n"
        "num_generations: 4\nlearning_rate: 1.0e-05\nbeta: 0.0\nloss_type: dapo\nmax_steps: 10\n"
    )
    return d


def _assert_self_contained(text: str) -> None:
    assert "<script" not in text.lower()
    assert not re.search(r"<link[^>]+href=", text, re.I)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text, re.I)
    assert "url(http" not in text and "@import" not in text


def test_full_report(run_dir):
    out = write_report(run_dir)
    assert out == run_dir / "report.html"
    text = out.read_text()
    _assert_self_contained(text)
    assert text.count('src="data:image/png;base64,') >= 8
    pngs = sorted(p.name for p in (run_dir / "plots").glob("*.png"))
    assert {"reward.png", "accuracy.png", "time.png", "kl.png", "lengths.png"} <= set(pngs)
    assert all((run_dir / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
    # milestones: first, three in between, last; completions escaped, never raw
    for s in milestone_steps(list(range(1, 11))):
        assert f"<h3>step {s}</h3>" in text
        assert f"step{s} sample1 &lt;answer&gt;5&lt;/answer&gt; &amp; done" in text
    assert "<answer>" not in text
    # header: steps, wall time (10 x 3.5 s), before -> after table, key settings
    assert "10 (last step 10)" in text and "0m 35s" in text
    assert "0.25" in text and "0.75" in text and "+0.5" in text
    assert "tiny/model" in text and "dapo" in text
    # before/after examples, escaped
    assert "2 + 3 = 6 &lt;b&gt;" in text


def test_milestones_and_ema():
    assert milestone_steps([3, 1, 2]) == [1, 2, 3]
    assert milestone_steps(list(range(1, 101))) == [1, 26, 51, 75, 100]
    assert ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # debiased: no ramp-up
    assert ema([0.0, 1.0], 0.5) == pytest.approx([0.0, 2 / 3])


def test_only_metrics(tmp_path):
    _write_jsonl(tmp_path / "metrics.jsonl", [_metrics_row(s) for s in (1, 2, 3)])
    text = write_report(tmp_path).read_text()
    _assert_self_contained(text)
    assert "data:image/png;base64," in text
    assert "no completions.jsonl" in text and "no eval_summary.json" in text
    assert "no readable config.yaml" in text


def test_empty_dir(tmp_path):
    text = write_report(tmp_path).read_text()
    assert "no metrics.jsonl" in text and "data:image" not in text


def test_malformed_lines_and_nulls(tmp_path):
    rows = [_metrics_row(s) for s in range(1, 6)]
    rows[1]["reward"] = None
    rows[2]["kl"] = float("nan")  # json.dumps writes NaN, which json.loads accepts
    rows[3] = {"step": 4, "kl": None, "entropy": None}  # nulls only
    for r in rows:
        r.pop("time/scoring", None)
    lines = [json.dumps(r) for r in rows]
    lines.insert(2, '{"step": 3, "reward": 0.5')  # truncated by a crash
    lines.insert(4, "[1, 2]")
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "completions.jsonl").write_text(
        'not json\n{"step": 1, "prompt": "p", "completion": "c", "rewards": null, '
        '"advantage": null}\n'
    )
    (tmp_path / "eval_summary.json").write_text("{broken")
    (tmp_path / "config.yaml").write_text("a: [unclosed\n")
    d = load_run(tmp_path)
    assert d.skipped == {"metrics.jsonl": 2, "completions.jsonl": 1}
    text = write_report(tmp_path).read_text()
    assert "metrics.jsonl: 2 malformed line(s) skipped" in text
    assert "completions.jsonl: 1 malformed line(s) skipped" in text
    assert "eval_summary.json is not valid JSON" in text
    assert "data:image/png;base64," in text and "<h3>step 1</h3>" in text


def test_all_null_metric_omits_panel(tmp_path):
    rows = [_metrics_row(s) for s in (1, 2)]
    for r in rows:
        r["kl"] = None
    _write_jsonl(tmp_path / "metrics.jsonl", rows)
    text = write_report(tmp_path).read_text()
    assert 'id="kl"' not in text
    assert "plot &#x27;KL to the reference model&#x27; omitted: no data" in text
    assert not (tmp_path / "plots" / "kl.png").exists()


def test_cli_report(run_dir, tmp_path, capsys):
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").is_file()
    assert "report.html" in capsys.readouterr().out
    other = tmp_path / "elsewhere" / "r.html"
    assert main(["report", str(run_dir), "--output", str(other)]) == 0
    assert other.is_file() and (other.parent / "plots" / "reward.png").is_file()
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_tool_and_dynamic_sampling_panels_only_when_logged(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    _write_jsonl(plain / "metrics.jsonl", [_metrics_row(s) for s in (1, 2, 3)])
    text = write_report(plain).read_text()
    assert 'id="tools"' not in text and 'id="dynamic_sampling"' not in text
    assert "Tool calls" not in text and "Dynamic sampling" not in text  # no "omitted" note
    rows = []
    for s in (1, 2, 3):
        r = _metrics_row(s)
        r.update({"tools/call_frequency": 0.5 + 0.25 * (s - 1), "tools/failure_frequency": 0.1,
                  "tools/failures/malformed": 3 - s, "tools/failures/raised": 0,
                  "dynamic_sampling/num_gen_batches": s, "dynamic_sampling/dropped_frac": 0.25})  # fmt: skip
        rows.append(r)
    agent = tmp_path / "agent"
    agent.mkdir()
    _write_jsonl(agent / "metrics.jsonl", rows)
    text = write_report(agent).read_text()
    assert 'id="tools"' in text and 'id="dynamic_sampling"' in text
    for name in ("tools.png", "dynamic_sampling.png"):
        assert (agent / "plots" / name).read_bytes()[:4] == b"\x89PNG"
