"""The report as a user sees it: a short real run writes report.html by itself (and keeps
rewriting it while it runs), and headless Chromium renders it with every plot decoded and
non-blank and the completions tables filled.

Chromium is Debian's ``chromium`` package (``./run`` installs it when it sets up as root);
without it the browser test is skipped with that instruction."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from grpokit.testing import tiny_run_config  # noqa: E402

# Runs in the page after load: decodes every plot onto a canvas and counts non-white pixels,
# and reads the completions tables; the result is appended to the DOM for --dump-dom.
PROBE = """<script>
window.addEventListener('load', () => {
  const out = {plots: []};
  for (const fig of document.querySelectorAll('figure')) {
    const img = fig.querySelector('img');
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    let ink = 0;
    if (img.complete && c.width > 0) {
      const g = c.getContext('2d'); g.drawImage(img, 0, 0);
      const px = g.getImageData(0, 0, c.width, c.height).data;
      for (let i = 0; i < px.length; i += 4) if (px[i] < 235 || px[i+1] < 235 || px[i+2] < 235) ink++;
    }
    out.plots.push({id: fig.id, title: fig.querySelector('figcaption').textContent,
      width: img.naturalWidth, height: img.naturalHeight, shown: img.getBoundingClientRect().width,
      ink: ink / Math.max(1, c.width * c.height)});
  }
  const h2 = [...document.querySelectorAll('h2')].find(h => h.textContent.startsWith('Sampled'));
  out.milestones = []; let el = h2.nextElementSibling;
  while (el && el.tagName !== 'H2') {
    if (el.tagName === 'H3') out.milestones.push({step: el.textContent, rows: 0, text: 0});
    if (el.tagName === 'TABLE' && out.milestones.length) {
      const m = out.milestones[out.milestones.length - 1];
      const rows = [...el.querySelectorAll('tr')].slice(1);
      m.rows = rows.length;
      m.text = rows.filter(r => r.querySelector('pre') && r.querySelector('pre').textContent.length).length;
    }
    el = el.nextElementSibling;
  }
  out.refresh = !!document.querySelector('meta[http-equiv="refresh"]');
  const pre = document.createElement('pre'); pre.id = 'grpokit-probe';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    return None


def _browser(*args: str) -> subprocess.CompletedProcess:
    exe = _chromium()
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    cmd += ["--allow-file-access-from-files", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    """A short real run (tiny model) that writes its own report, with the HTML captured
    each time the trainer rewrote it."""
    from grpokit import report as report_mod
    from grpokit.trainer import GRPOTrainer

    out = tmp_path_factory.mktemp("browser") / "run"
    cfg = tiny_run_config(
        tiny_model_dir,
        out,
        task_params={"digits": 1, "train_size": 64, "test_size": 4},
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=6,
        max_steps=6,
        max_eval_samples=4,
        per_device_eval_batch_size=4,
        log_completions=True,
        report_steps=2,
    )
    versions = []
    real = report_mod.write_report

    def spy(run_dir, output=None):
        path = real(run_dir, output)
        versions.append(Path(path).read_text())
        return path

    mp = pytest.MonkeyPatch()
    mp.setattr(report_mod, "write_report", spy)
    try:
        GRPOTrainer(cfg).train()
    finally:
        mp.undo()
    return out, versions


@pytest.mark.auto_report
def test_the_run_writes_and_updates_its_report(run_dir):
    out, versions = run_dir
    # every 2 steps while running (steps 2 and 4; step 6 is the end), then once at the end
    assert len(versions) == 3
    assert 'http-equiv="refresh"' in versions[0] and "Run in progress: step 2 of 6" in versions[0]
    assert "Run in progress: step 4 of 6" in versions[1]
    assert 'http-equiv="refresh"' not in versions[-1] and "Run in progress" not in versions[-1]
    assert (out / "report.html").read_text() == versions[-1]
    assert json.loads((out / "status.json").read_text())["state"] == "finished"
    assert len(list((out / "plots").glob("*.png"))) >= 8


@pytest.mark.auto_report
def test_report_renders_in_chromium(run_dir, tmp_path):
    if _chromium() is None:
        pytest.skip("no Chromium: apt-get install chromium (./run does it when run as root)")
    out, _ = run_dir
    html = (out / "report.html").read_text()
    page = tmp_path / "probe.html"
    page.write_text(html.replace("</body>", PROBE + "</body>"))
    res = _browser("--virtual-time-budget=20000", "--dump-dom", page.as_uri())
    m = re.search(r'<pre id="grpokit-probe">(.*?)</pre>', res.stdout, re.S)
    assert m, f"probe did not run; chromium said: {res.stderr[-2000:]}"
    probe = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))

    ids = {p["id"] for p in probe["plots"]}
    for want in ("reward", "accuracy", "kl", "lengths", "learning_rate", "grad_norm", "time"):
        assert any(want in i for i in ids), f"no {want} plot among {sorted(ids)}"
    for p in probe["plots"]:
        assert p["width"] > 300 and p["height"] > 200, p  # decoded
        assert p["shown"] > 300, p  # laid out at a readable size
        assert p["ink"] > 0.02, p  # not blank: axes, lines and labels drawn
    steps = [m["step"] for m in probe["milestones"]]
    assert steps[0] == "step 1" and steps[-1] == "step 6" and len(steps) >= 3, steps
    for m in probe["milestones"]:
        assert m["rows"] >= 2 and m["text"] >= 1, m
    assert probe["refresh"] is False

    shot = tmp_path / "report.png"
    _browser("--window-size=1400,2600", f"--screenshot={shot}", (out / "report.html").as_uri())
    assert shot.is_file() and shot.stat().st_size > 50_000
