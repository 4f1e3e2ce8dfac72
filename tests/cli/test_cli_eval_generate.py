import json

from grpokit.cli import main

TP = '{"digits": 1, "test_size": 8, "train_size": 16}'


def test_eval_pass_at_k_and_json(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "e.json"
    rc = main(
        [
            "eval",
            tiny_model_dir,
            "--task",
            "arithmetic",
            "--task_params",
            TP,
            "--max_eval_samples",
            "4",
            "--num_samples",
            "3",
            "--max_completion_length",
            "4",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["num_prompts"] == 4 and r["num_samples"] == 3
    assert 0.0 <= r["pass@1"] <= r["pass@3"] <= 1.0
    assert set(r["rewards"]) == {"arithmetic_correct", "arithmetic_closeness", "arithmetic_format"}
    assert "accuracy" in capsys.readouterr().out


def test_eval_compare_side_by_side(tmp_path, tiny_model_dir, capsys):
    rc = main(
        [
            "eval",
            "--compare",
            tiny_model_dir,
            tiny_model_dir,
            "--task",
            "arithmetic",
            "--task_params",
            TP,
            "--max_eval_samples",
            "2",
            "--max_completion_length",
            "3",
        ]
    )
    assert rc == 0
    header = [ln for ln in capsys.readouterr().out.splitlines() if "accuracy" in ln]
    assert header and len(header[0].split()) == 3  # label + two columns


def test_generate_uses_task_system_prompt(tiny_model_dir, capsys, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("What is 1 + 1?\nWhat is 2 + 2?\n")
    assert (
        main(
            [
                "generate",
                tiny_model_dir,
                "Hello",
                "--file",
                str(f),
                "--task",
                "arithmetic",
                "--max_new_tokens",
                "3",
                "--num_samples",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("=== prompt") == 6 and "prompt 3, sample 2" in out


def test_train_config_errors_exit_2(tmp_path, capsys):
    r = tmp_path / "r.yaml"
    r.write_text("learnig_rate: 1.0e-6\n")
    assert main(["train", str(r)]) == 2
    assert "did you mean 'learning_rate'" in capsys.readouterr().err


def test_eval_takes_the_task_from_the_trained_models_config(tmp_path, tiny_model_dir, capsys):
    import shutil

    import yaml

    model = tmp_path / "final"
    shutil.copytree(tiny_model_dir, model)
    (model / "grpokit_config.yaml").write_text(
        yaml.safe_dump(
            {
                "task": "arithmetic",
                "task_params": {"digits": 1, "test_size": 8, "train_size": 16},
                "seed": 3,
            }
        )
    )
    assert (
        main(["eval", str(model), "--max_eval_samples", "2", "--max_completion_length", "3"]) == 0
    )
    out = capsys.readouterr().out
    assert "task arithmetic" in out and "from the run's config" in out
