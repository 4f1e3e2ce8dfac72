import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama-shaped model with a real (offline) tokenizer and chat template."""
    from grpokit.testing import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture(autouse=True)
def _no_auto_report(request, monkeypatch):
    """Training runs in tests skip the automatic report.html (matplotlib costs ~1-2 s a run);
    tests marked ``auto_report`` keep it."""
    if request.node.get_closest_marker("auto_report"):
        return
    try:
        from grpokit.trainer import GRPOTrainer
    except ImportError:  # pragma: no cover
        return
    monkeypatch.setattr(GRPOTrainer, "_write_report", lambda self: None)
