"""health_checks / health_params in the config, and the report's 'Training health' section."""

from pathlib import Path

import pytest

from grpokit.config import ConfigError, build_config, load_config
from grpokit.report.data import RunData
from grpokit.report.sections import health_html


def test_health_checks_values(tmp_path):
    assert build_config({}).health_checks == "warn"
    assert build_config({"health_checks": "stop"}).health_checks == "stop"
    with pytest.raises(ConfigError, match="health_checks='loud': use warn"):
        build_config({"health_checks": "loud"})
    with pytest.raises(ConfigError, match="health_params: unknown key 'entropy'"):
        build_config({"health_params": {"entropy": 1.0}})
    recipe = tmp_path / "r.yaml"
    recipe.write_text("health_checks: off\nhealth_params: {clipped_ratio: 0.8}\n")
    cfg = load_config(str(recipe), [])
    assert cfg.health_checks is False  # YAML's off, which grpokit reads as off
    assert cfg.health_params == {"clipped_ratio": 0.8}
    assert load_config(str(recipe), ["--health_checks", "stop"]).health_checks == "stop"


def test_report_section():
    d = RunData(Path("run"))
    assert "no health checks recorded" in health_html(d)
    d.status = {"health": {"mode": "warn", "active": {}, "events": []}}
    assert "No training-health alert fired" in health_html(d)
    line = "health truncated at step 3: 100% of completions <cut>"
    d.status = {"health": {"mode": "stop", "active": {"truncated": line}, "stopped_by": line,
                           "events": [{"step": 3, "alert": "truncated", "event": "fired",
                                       "line": line}]}}  # fmt: skip
    html = health_html(d)
    assert "still active at the last write: truncated" in html
    assert "100% of completions &lt;cut&gt;" in html  # escaped
    assert "The run was ended by" in html
