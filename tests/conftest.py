import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama-shaped model with a real (offline) tokenizer and chat template."""
    from grpokit.testing import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))
