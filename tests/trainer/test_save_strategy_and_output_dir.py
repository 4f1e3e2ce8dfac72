"""save_strategy (transformers' steps / epoch / no) decides when checkpoints are written;
overwrite_output_dir decides what happens to an output_dir that already holds a run."""

import json

import pytest
import yaml

from grpokit.checkpoint import list_checkpoints, prepare_output_dir
from grpokit.testing import tiny_run_config

# 8 training prompts, 2 prompts a step (4 completions, G=2): an epoch is 4 rounds
SMALL = dict(
    task_params={"digits": 1, "train_size": 8, "test_size": 4},
    max_steps=-1,
    num_train_epochs=2,
    save_steps=3,
    write_report=False,
)


def _steps(out):
    return [int(p.name.split("-")[1]) for p in list_checkpoints(out)]


@pytest.mark.parametrize(
    "strategy,iterations",
    [("steps", 1), ("epoch", 1), ("epoch", 2), ("no", 1)],
)
def test_save_strategy_decides_the_checkpoints(tmp_path, tiny_model_dir, strategy, iterations):
    from grpokit.trainer import GRPOTrainer

    out = tmp_path / "run"
    cfg = tiny_run_config(
        tiny_model_dir, out, save_strategy=strategy, num_iterations=iterations, **SMALL
    )
    rounds_per_epoch = 8 // (cfg.completions_per_step // cfg.num_generations)
    steps_per_epoch = rounds_per_epoch * iterations
    total = 2 * steps_per_epoch
    GRPOTrainer(cfg).train()
    want = {
        "steps": sorted({*range(3, total + 1, 3), total}),  # every save_steps, and the end
        "epoch": [steps_per_epoch, total],
        "no": [],
    }[strategy]
    assert _steps(out) == want
    assert (out / "final" / "config.json").is_file()  # the final model is always written
    if strategy == "epoch":  # the first checkpoint sits exactly at the end of the first pass
        state = json.loads((out / f"checkpoint-{steps_per_epoch}/trainer_state.json").read_text())
        assert (state["sampler"]["epoch"], state["sampler"]["pos"]) == (0, 8)


def test_best_and_unknown_strategies_are_refused():
    from grpokit.config import ConfigError, build_config

    with pytest.raises(ConfigError, match="metric_for_best_model"):
        build_config({"save_strategy": "best"})
    with pytest.raises(ConfigError, match="save_strategy='often': use steps"):
        build_config({"save_strategy": "often"})


def test_overwrite_output_dir_moves_the_old_run_aside(tmp_path, tiny_model_dir, capsys):
    from grpokit.cli import main

    recipe = tmp_path / "r.yaml"
    values = tiny_run_config(tiny_model_dir, tmp_path / "x", save_steps=1).to_dict()
    recipe.write_text(yaml.safe_dump(values))
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--output_dir", str(out)]) == 0
    old_metrics = (out / "metrics.jsonl").read_text()
    old_weights = (out / "checkpoint-2" / "model.safetensors").read_bytes()
    capsys.readouterr()
    # a second run without --resume: refused, with both ways out named, nothing touched
    assert main(["train", str(recipe), "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "overwrite_output_dir: true" in err and len(err.splitlines()) == 1
    assert _steps(out) == [1, 2] and not list(tmp_path.glob("run.previous-*"))
    # overwrite: the old run is moved aside whole, the new run starts at step 1
    args = ["train", str(recipe), "--output_dir", str(out), "--max_steps", "1"]
    assert main([*args, "--overwrite_output_dir", "true"]) == 0
    (aside,) = tmp_path.glob("run.previous-*")
    assert f"moved to {aside}" in capsys.readouterr().out
    assert (aside / "metrics.jsonl").read_text() == old_metrics
    assert (aside / "checkpoint-2" / "model.safetensors").read_bytes() == old_weights
    assert _steps(out) == [1]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]
    # with --resume, overwrite_output_dir changes nothing: the run continues
    assert main([*args, "--max_steps", "2", "--overwrite_output_dir", "true", "--resume"]) == 0
    assert _steps(out) == [1, 2] and len(list(tmp_path.glob("run.previous-*"))) == 1


def test_only_the_main_process_moves_the_run(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoint-3").mkdir(parents=True)
    assert prepare_output_dir(out, resume=None, overwrite=True, is_main=False) == ""
    assert (out / "checkpoint-3").is_dir()
    assert prepare_output_dir(tmp_path / "new", resume=None, overwrite=False, is_main=True) == ""
    said = prepare_output_dir(out, resume=None, overwrite=True, is_main=True)
    assert not out.exists() and "moved to" in said
