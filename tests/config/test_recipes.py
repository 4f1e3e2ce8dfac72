"""Every recipe in recipes/ plans without loading weights and trains 2 steps on CPU with the
tiny test model swapped in (tiny batches; local or generated data instead of the hub)."""

import json
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.config import load_config, load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def _have_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


SHRINK = [
    "--max_steps", "2", "--num_generations", "2", "--per_device_train_batch_size", "2",
    "--gradient_accumulation_steps", "1", "--max_completion_length", "8",
    "--max_prompt_length", "64", "--max_eval_samples", "0", "--save_steps", "0",
    "--report_to", "none", "--torch_num_threads", "1", "--push_to_hub", "false",
]  # fmt: skip


def _reward_names(funcs) -> list[str]:
    names = []
    for f in funcs or []:
        names += list(f) if isinstance(f, dict) else [f]
    return [n for n in names if ":" not in n]


def _data_overrides(task: str, tmp: Path) -> list[str]:
    """Local stand-ins for the hub datasets (the rows have the hub layout)."""
    if task == "math":
        f = tmp / "math.jsonl"
        rows = [
            {"problem": f"What is {i} + {i}?", "answer": str(2 * i), "solution": ""}
            for i in range(8)
        ]
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return ["--dataset_name", str(f), "--task_params", "{test_size: 2}"]
    if task == "tldr":
        f = tmp / "tldr.jsonl"
        rows = [{"prompt": f"SUBREDDIT: r/test POST: story number {i}. TL;DR:"} for i in range(8)]
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return ["--dataset_name", str(f), "--task_params", "{test_size: 2}"]
    if task == "countdown":
        return ["--task_params", "{train_size: 20, test_size: 5}"]
    return []


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_plans_and_trains_two_steps(recipe, tiny_model_dir, tmp_path, monkeypatch, capsys):
    from grpokit.rewards.registry import registered_rewards

    raw = load_recipe(recipe)
    text = recipe.read_text()
    assert text.startswith("#") and "Run:" in text and "Result:" in text, "header comment block"
    missing = [n for n in _reward_names(raw.get("reward_funcs")) if n not in registered_rewards()]
    assert not missing, f"the recipe names reward(s) grpokit does not have: {missing}"

    # plan with the recipe's own model: config.json or built-in shape only, never weights
    import transformers

    def no_weights(*a, **k):
        raise AssertionError("plan loaded weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    assert main(["plan", str(recipe), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["memory"]["peak"] > plan["memory"]["weights"] > 0
    monkeypatch.undo()

    task = load_config(recipe).task  # named, or picked from dataset_name
    data = _data_overrides(task, tmp_path)
    if data and "task" not in raw:
        data += ["--task", task]  # a local stand-in file does not name the dataset
    if task == "gsm8k":
        from grpokit.tasks import get_task

        if not Path(get_task("gsm8k").source).exists():
            pytest.skip("no local GSM8K copy (../shared/data/gsm8k) and the hub is offline")
    if task == "math":
        pytest.importorskip("math_verify")
    out = tmp_path / "run"
    args = [str(recipe), "--model_name_or_path", tiny_model_dir, *SHRINK, *data]
    if raw.get("use_vllm") and not _have_vllm():
        args += ["--use_vllm", "false"]  # vLLM lives in its own env (./run test-vllm)
    args += ["--output_dir", str(out)]
    load_config(recipe, args[1:])  # the shrunk config is valid
    assert main(["train", *args]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert (out / "final" / "config.json").is_file()


def test_openr1_config_demo_runs_with_only_path_changes(tiny_model_dir, tmp_path, capsys):
    """open-r1's config_demo.yaml, with only its model, dataset and output paths changed,
    trains: the task comes from dataset_name (a local copy named like the hub dataset), the
    prompt from dataset_prompt_column, and do_eval: false means no test split is needed."""
    pytest.importorskip("math_verify")
    pytest.importorskip("wandb")  # the recipe reports to wandb (offline without credentials)
    data = tmp_path / "OpenR1-Math-220k"
    data.mkdir()
    rows = [
        {
            "problem": f"Compute {i} + {i}.",
            "solution": f"We add: $\\boxed{{{2 * i}}}$",
            "answer": str(2 * i),
            "problem_type": "Algebra",
            "source": "test",
            "uuid": str(i),
        }
        for i in range(8)
    ]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    src = (RECIPES[0].parent / "openr1_config_demo.yaml").read_text()
    new = {
        "model_name_or_path": tiny_model_dir,
        "dataset_name": str(data),
        "output_dir": str(tmp_path / "out"),
    }
    if not _have_vllm():  # the recipe asks for vLLM rollouts: refused, naming the install
        with pytest.raises(Exception, match="test-vllm"):
            load_config(RECIPES[0].parent / "openr1_config_demo.yaml")
            from grpokit.rollout.vllm_engine import require_vllm

            require_vllm()
        new["use_vllm"] = "false"  # grpokit's own decode loop instead
    lines = []
    for line in src.splitlines():
        key = line.split(":", 1)[0]
        lines.append(f"{key}: {new[key]}" if key in new and not line.startswith(" ") else line)
    recipe = tmp_path / "config_demo.yaml"
    recipe.write_text("\n".join(lines) + "\n")
    changed = [a for a, b in zip(src.splitlines(), lines) if a != b]
    assert len(changed) == (3 if _have_vllm() else 4), changed

    cfg = load_config(recipe)
    assert (cfg.task, cfg.dataset_prompt_column, cfg.do_eval) == ("math", "problem", False)
    # push_to_hub: true, and no hub here: refused at the start, before any model loads
    assert main(["train", str(recipe)]) == 2
    assert "hub error: push_to_hub" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["train", str(recipe), "--push_to_hub", "false"]) == 0
    out = tmp_path / "out"
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # one epoch of 8 prompts at 16 completions x 4 accumulation / G=16 = 4 prompts a step
    assert [r["step"] for r in steps] == [1, 2]
    assert {"rewards/accuracy/mean", "rewards/format/mean", "rewards/tag_count/mean"} <= set(
        steps[0]
    )
    assert not list(out.glob("eval_*.json"))  # do_eval: false
    assert (out / "final" / "config.json").is_file()
