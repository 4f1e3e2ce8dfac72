import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama-shaped model with a real (offline) tokenizer and chat template."""
    from grpokit.testing import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture(scope="session")
def one_process_run(tmp_path_factory, tiny_model_dir):
    """The reference for the multi-process tests: tests/launch/_dist_worker.py (deterministic fake
    sampler) in one process with the global batch of 8 completions, 3 steps."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    out = tmp_path_factory.mktemp("one") / "run"
    env = {**os.environ, "PYTHONPATH": str(here.parent), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(here / "launch" / "_dist_worker.py"), tiny_model_dir, str(out), "8"]
    subprocess.run(cmd, check=True, env=env, timeout=300)
    return out


@pytest.fixture(autouse=True)
def _no_auto_report(request, monkeypatch):
    """Training runs in tests skip the automatic report.html (matplotlib costs ~1-2 s a run);
    tests marked ``auto_report`` keep it."""
    if request.node.get_closest_marker("auto_report"):
        return
    from grpokit.status import RunStatus

    monkeypatch.setattr(RunStatus, "write_report", lambda self, step: None)


@pytest.fixture(autouse=True)
def _sandbox_runs_every_program():
    """The code reward remembers recent verdicts (one sandbox run per program): each test
    starts without them, so its programs really run."""
    from grpokit.rewards.code import forget_scores

    forget_scores()
