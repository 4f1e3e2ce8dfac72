import io
import json

from grpokit.logging import MetricsLogger


def test_jsonl_and_plain_console(tmp_path):
    out = io.StringIO()
    lg = MetricsLogger(tmp_path, total_steps=4, stream=out)
    lg.start(0)
    lg.log(1, {"reward": 0.5, "kl": float("nan"), "time/step": 2.0, "time/generation": 1.5})
    lg.log(2, {"reward": 0.75, "loss": 0.1})
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {
        "step": 1,
        "reward": 0.5,
        "kl": None,
        "time/step": 2.0,
        "time/generation": 1.5,
    }
    text = out.getvalue()
    assert "step 1/4" in text and "step 2/4" in text and "reward 0.75" in text and "ETA" in text
    assert "\r" not in text and "\x1b" not in text  # readable in a plain log file
    assert "[##########..........] step 2/4" in text


def test_disabled_logger_writes_nothing(tmp_path):
    lg = MetricsLogger(tmp_path / "x", total_steps=1, enabled=False)
    lg.log(1, {"reward": 1.0})
    assert not (tmp_path / "x").exists()
