"""model_revision and attn_implementation reach from_pretrained: a hub cache with two
revisions of one repo (huggingface_hub's own cache layout, read by its own code), and the
attention kernels transformers builds, with the flash-attention fallback on this CPU."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpokit.models import attention_kernel, load_model_and_tokenizer, resolve_model
from grpokit.testing import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def _hub_cache(tmp_path: Path) -> Path:
    """``org/tiny`` in a hub cache: main -> a seed-0 model, tag v1 -> a seed-1 model."""
    repo = tmp_path / "hub" / "models--org--tiny"
    for ref, commit, seed in (("main", "a" * 40, 0), ("v1", "b" * 40, 1)):
        make_tiny_model(repo / "snapshots" / commit, seed=seed)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return tmp_path / "hub"


_PROBE = """
import json, sys, torch
from grpokit.models import load_model_and_tokenizer
rev = None if sys.argv[1] == "-" else sys.argv[1]
m, tok, res = load_model_and_tokenizer("org/tiny", revision=rev)
w = m.get_input_embeddings().weight
print(json.dumps({"path": res.path, "source": res.source, "sum": float(w.double().sum())}))
"""


def test_model_revision_picks_the_revision_from_the_hub_cache(tmp_path):
    hub = _hub_cache(tmp_path)
    env = {
        **os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
        "GRPOKIT_CACHE": str(tmp_path / "gk"), "OMP_NUM_THREADS": "1",
    }  # fmt: skip

    def load(rev):
        r = subprocess.run(
            [sys.executable, "-c", _PROBE, rev], env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    main, v1, by_commit = load("-"), load("v1"), load("b" * 40)
    assert main["path"].endswith("a" * 40) and v1["path"].endswith("b" * 40)
    assert "at revision v1" in v1["source"]
    assert by_commit["sum"] == v1["sum"] != main["sum"]  # the weights differ too
    assert load("main")["sum"] == main["sum"]
    # a revision the cache lacks, offline: a one-line error naming it
    bad = subprocess.run(
        [sys.executable, "-c", _PROBE, "v9"], env=env, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0 and "at revision v9" in bad.stderr


def test_model_revision_on_a_local_directory_says_so(tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        r = resolve_model(tiny_model_dir, revision="v1")
    assert r.path == tiny_model_dir and r.revision is None
    assert any("model_revision='v1' ignored" in m for m in caplog.messages)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        resolve_model(tiny_model_dir, revision="main")  # the default: nothing to say
    assert not caplog.messages


def test_pinned_revision_refuses_the_pypi_copy(monkeypatch, tmp_path):
    from grpokit import models

    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def never(*a, **k):
        raise AssertionError("the PyPI copy is no particular revision")

    with pytest.raises(models.ModelSourceError, match="PyPI copy is not that revision"):
        resolve_model(models.DEFAULT_MODEL, revision="v1", downloader=never)


def test_attn_implementation_reaches_the_model(tiny_model_dir):
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    out = {}
    for kernel in ("eager", "sdpa", None):
        m, _, _ = load_model_and_tokenizer(tiny_model_dir, attn_implementation=kernel)
        assert m.config._attn_implementation == (kernel or "sdpa")
        with torch.no_grad():
            out[kernel] = m(input_ids=ids).logits
    torch.testing.assert_close(out["eager"], out["sdpa"], atol=1e-5, rtol=1e-5)


def test_flash_attention_without_cuda_falls_back_to_sdpa(tiny_model_dir, caplog):
    if torch.cuda.is_available() and shutil.which("nvidia-smi"):
        pytest.skip("this machine could run flash attention")
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        m, _, _ = load_model_and_tokenizer(tiny_model_dir, attn_implementation="flash_attention_2")
    assert m.config._attn_implementation == "sdpa"
    (line,) = [x for x in caplog.messages if "flash_attention_2" in x]
    assert "not a CUDA GPU" in line and line.endswith("using sdpa") and "\n" not in line
    assert attention_kernel("flash_attention_2", "cuda") in ("sdpa", "flash_attention_2")
    assert attention_kernel("eager", "cpu") == "eager" and attention_kernel(None, "cpu") is None
