"""A problem in the user's input (model path, config, dataset) ends every command in one
line on stderr that names the problem and the fix, with exit code 2: no traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import grpokit
from grpokit.cli import main


def _one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("cmd", [["eval"], ["generate"]])
def test_missing_model_path(cmd, capsys):
    assert main([*cmd, "/no/such/path", *(["hi"] if cmd == ["generate"] else [])]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("model error: model path '/no/such/path' does not exist")
    assert "give a transformers model directory" in line  # the fix


def test_generate_missing_gguf_file(capsys):
    assert main(["generate", "./no_such.gguf", "hi"]) == 2
    line = _one_error_line(capsys)
    assert "GGUF file './no_such.gguf' does not exist; give the path of an existing" in line


def test_eval_compare_names_the_bad_model_before_evaluating_any(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["eval", "--compare", tiny_model_dir, str(tmp_path / "empty")]) == 2
    line = _one_error_line(capsys)
    assert "directory without config.json; point at a transformers model directory" in line
    assert "evaluating" not in capsys.readouterr().out


def test_eval_missing_dataset_is_a_data_error(tiny_model_dir, capsys):
    args = ["eval", tiny_model_dir, "--task", "gsm8k", "--dataset_name", "/no/such.jsonl"]
    assert main(args) == 2
    line = _one_error_line(capsys)
    assert line.startswith("data error: dataset path '/no/such.jsonl' does not exist; give")


def test_train_missing_model_path(tmp_path, capsys):
    args = ["--model_name_or_path", "/no/such/path", "--output_dir", str(tmp_path / "run")]
    assert main(["train", *args, "--task", "arithmetic", "--max_steps", "1"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("model error: model path '/no/such/path' does not exist")


def test_train_and_plan_unknown_task(capsys):
    for cmd in (["train", "--dry-run"], ["plan"]):
        assert main([*cmd, "--task", "gsm8"]) == 2
        line = _one_error_line(capsys)
        assert line.startswith("config error: unknown task 'gsm8'; did you mean 'gsm8k'?")


def test_the_command_line_prints_only_the_one_line(tmp_path):
    """The real entry point (python -m grpokit), logging set-up included."""
    root = str(Path(grpokit.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "grpokit", "eval", "/no/such/path"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "model error: model path '/no/such/path' does not exist; give a transformers model "
        "directory (with config.json), a .gguf file or a hub id"
    ]
