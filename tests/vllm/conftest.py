"""Tests against the real vLLM (./run test-vllm builds .venv-vllm for them); in an env
without vllm every module here skips itself (importorskip at its top)."""

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "2")

REAL_MODEL = "/root/.cache/grpokit/models/SmolLM2-135M-Instruct"


def make_vllm_tiny(path, seed: int = 0):
    """A tiny random Llama vLLM can serve (its CPU attention needs head_dim >= 32: the
    default tiny model has 8), with weights scaled up so greedy decoding does not just
    repeat one token."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpokit.testing import make_tiny_model

    p = make_tiny_model(path, hidden=64, heads=2, seed=seed)
    m = AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in m.parameters():
            if w.dim() == 2:
                w.normal_(0.0, 0.15, generator=g)
    m.save_pretrained(p)
    return str(p)


@pytest.fixture(scope="session")
def vllm_tiny_dir(tmp_path_factory):
    return make_vllm_tiny(tmp_path_factory.mktemp("vtiny") / "model")
