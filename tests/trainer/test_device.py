"""The ``device`` key: resolution, the error for a GPU torch cannot see, and CPU runs with
device cpu and auto (this machine has no GPU; GPU placement is not run here)."""

import pytest
import torch

from grpokit import distributed as dist
from grpokit.config import ConfigError, build_config
from grpokit.testing import tiny_run_config

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


def test_resolve_device_cpu_and_auto_without_gpu():
    assert dist.resolve_device("cpu") == torch.device("cpu")
    expected = torch.device("cuda", dist.local_rank()) if torch.cuda.is_available() else "cpu"
    assert dist.resolve_device("auto") == torch.device(expected)


@no_cuda
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_cuda_without_gpu_is_a_clear_error(spec):
    with pytest.raises(ValueError, match=r"sees no CUDA GPU.*use device: cpu"):
        dist.resolve_device(spec)


def test_bad_device_value_is_refused_by_the_config():
    with pytest.raises(ConfigError, match=r"device='gpu0': use auto, cpu, cuda or cuda:N"):
        build_config({"device": "gpu0"})


@no_cuda
def test_trainer_refuses_cuda_before_loading_anything(tmp_path, tiny_model_dir):
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", device="cuda")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        GRPOTrainer(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("spec", ["cpu", "auto"])
def test_cpu_run_places_everything_on_the_resolved_device(tmp_path, tiny_model_dir, spec):
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", device=spec, beta=0.04, save_steps=1)
    tr = GRPOTrainer(cfg)
    want = dist.resolve_device(spec)
    assert tr.device == want
    tr.train()
    for m in (tr.model, tr.ref_model):
        assert {p.device for p in m.parameters()} == {want}
    assert {s["exp_avg"].device for s in tr.optimizer.state.values()} == {want}
    # a checkpoint loads back onto the device of the resuming run (map_location + load)
    tr2 = GRPOTrainer(
        tiny_run_config(tiny_model_dir, tmp_path / "run", device=spec, beta=0.04, max_steps=3),
        resume=True,
    )
    assert tr2.step == 2
    assert {s["exp_avg"].device for s in tr2.optimizer.state.values()} == {want}
    for a, b in zip(tr.model.parameters(), tr2.model.parameters()):
        torch.testing.assert_close(a, b)


@no_cuda
def test_cli_train_eval_generate_refuse_cuda_without_gpu(tmp_path, tiny_model_dir, capsys):
    import yaml

    from grpokit.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": tiny_model_dir, "task": "arithmetic"}))
    out = str(tmp_path / "run")
    assert main(["train", str(recipe), "--device", "cuda", "--output_dir", out]) == 2
    assert "config error: device='cuda' but torch" in capsys.readouterr().err
    assert main(["generate", tiny_model_dir, "1+1?", "--device", "cuda:0"]) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err
    assert main(["eval", tiny_model_dir, "--task", "arithmetic", "--device", "cuda"]) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err


def test_cli_generate_on_device_cpu(tiny_model_dir, capsys):
    from grpokit.cli import main

    rc = main(["generate", tiny_model_dir, "1+1?", "--device", "cpu", "--max_new_tokens", "3"])
    assert rc == 0 and capsys.readouterr().out.strip()


def test_one_gpu_index_for_several_processes_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match=r"all on one GPU; use device: auto or cuda"):
        dist.resolve_device("cuda:0")
    assert dist.resolve_device("cpu") == torch.device("cpu")
