"""Every recipe in recipes/ plans without loading weights and trains 2 steps on CPU with the
tiny test model swapped in (tiny batches; local or generated data instead of the hub); the
seed documents' recipes carry the documents' numbers; open-r1's config_demo.yaml trains with
only its model and dataset paths changed."""

import json
import warnings
from pathlib import Path

import pytest
import yaml

from grpokit.cli import main
from grpokit.config import IGNORED_KEYS, GRPOConfig, load_config, load_recipe

RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipes"
RECIPES = sorted(RECIPE_DIR.glob("*.yaml"))

# Names landing in parallel (issue 18). Until they are merged, the smoke run leaves them out
# of its copy of a recipe (with a warning naming them); once the config knows a key or the
# registry a reward, nothing is left out. Delete these entries after the merge.
PENDING_KEYS: set[str] = set()
PENDING_REWARDS: set[str] = set()


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


def _runnable_now(raw: dict) -> tuple[dict, list[str]]:
    """The recipe without the pending names this branch does not know yet, and those names."""
    from grpokit.rewards.registry import registered_rewards

    known = set(GRPOConfig.__dataclass_fields__) | set(IGNORED_KEYS)
    left_out = [k for k in raw if k in PENDING_KEYS and k not in known]
    out = {k: v for k, v in raw.items() if k not in left_out}
    if out.get("reward_funcs"):
        gone = [n for n in _reward_names(out["reward_funcs"]) if n in PENDING_REWARDS]
        gone = [n for n in gone if n not in registered_rewards()]
        if gone:
            keep = [f for f in out["reward_funcs"] if not (isinstance(f, str) and f in gone)]
            out["reward_funcs"], left_out = keep, left_out + [f"reward {n}" for n in gone]
    return out, left_out


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _data_overrides(task: str, tmp: Path) -> list[str]:
    """Local stand-ins for the hub datasets (the rows have the hub layout)."""
    if task == "math":
        rows = [
            {"problem": f"What is {i} + {i}?", "answer": str(2 * i), "solution": ""}
            for i in range(8)
        ]
        f = _write_rows(tmp / "math.jsonl", rows)
        return ["--dataset_name", str(f), "--task_params", "{test_size: 2}"]
    if task == "tldr":
        rows = [{"prompt": f"SUBREDDIT: r/test POST: story number {i}. TL;DR:"} for i in range(8)]
        f = _write_rows(tmp / "tldr.jsonl", rows)
        return ["--dataset_name", str(f), "--task_params", "{test_size: 2}"]
    if task == "countdown":  # the Countdown-Tasks-3to4 layout: nums, target
        rows = [{"nums": [i + 1, i + 2, 3], "target": 2 * i + 6} for i in range(12)]
        f = _write_rows(tmp / "countdown.jsonl", rows)
        return ["--dataset_name", str(f), "--task_params", "{test_size: 2}"]
    return []


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_plans_and_trains_two_steps(recipe, tiny_model_dir, tmp_path, monkeypatch, capsys):
    from grpokit.rewards.registry import registered_rewards

    text = recipe.read_text()
    assert text.startswith("#") and "Run:" in text and "Result:" in text, "header comment block"
    raw, left_out = _runnable_now(load_recipe(recipe))
    if left_out:
        warnings.warn(f"{recipe.name}: left out until merged: {left_out}", stacklevel=1)
    missing = [n for n in _reward_names(raw.get("reward_funcs")) if n not in registered_rewards()]
    assert not missing, f"the recipe names reward(s) grpokit does not have: {missing}"
    recipe = tmp_path / recipe.name
    recipe.write_text(yaml.safe_dump(raw, allow_unicode=True))

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
    name = str(raw.get("dataset_name") or "")
    local = name.startswith((".", "/"))  # a recipe's own local data, e.g. ../shared/data/gsm8k
    if local and not Path(name).exists():
        pytest.skip(f"{name} is not here (the repository's ../shared/data)")
    data = [] if local else _data_overrides(task, tmp_path)
    if data and "task" not in raw:
        data += ["--task", task]  # a local stand-in file does not name the dataset
    if task == "gsm8k":
        from grpokit.tasks import get_task

        if not Path(get_task("gsm8k").source).exists():
            pytest.skip("no local GSM8K copy (../shared/data/gsm8k) and the hub is offline")
    if task == "math":
        pytest.importorskip("math_verify")
    out = tmp_path / "run"
    args = ["--config", str(recipe), "--model_name_or_path", tiny_model_dir, *SHRINK, *data]
    args += ["--use_vllm", "false", "--output_dir", str(out)]  # vLLM: tests/vllm
    assert main(["train", *args]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert (out / "final" / "config.json").is_file()


# What each seed document states, transcribed from /work/shared/seeds (in the documents'
# own words: TRL / ms-swift / open-r1 names), and the recipe key that carries it.
DOCUMENT_VALUES = {
    "grpo_from_scratch_gsm8k": {  # 001: num_steps=500, num_generations=4, mu=3, ...
        "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct",
        "num_generations": 4,
        "max_completion_length": 400,
        "num_iterations": 3,  # mu
        "epsilon": 0.2,
        "max_steps": 500 * 3,  # num_steps=500 batches, mu=3 updates each
        "sync_ref_model": True,  # num_iterations=1 outer loop: reference = policy at its start
        "ref_model_mixup_alpha": 1.0,
        "ref_model_sync_steps": 500 * 3,
        "reward_funcs": ["correctness", "xml_format"],
    },
    "smoltldr_lora": {  # 003: the demo's LoraConfig and GRPOConfig
        "model_name_or_path": "HuggingFaceTB/SmolLM-135M-Instruct",
        "use_peft": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_target_modules": "all-linear",
        "learning_rate": 2e-5,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "max_prompt_length": 512,
        "max_completion_length": 96,
        "num_generations": 4,
        "optim": "adamw_8bit",
        "num_train_epochs": 1,
        "bf16": True,
        "logging_steps": 1,
        "report_to": ["wandb"],
        "reward_funcs": [{"length_target": {"target_length": 50}}],
    },
    "countdown_swift": {  # 004: the swift rlhf command
        "model_name_or_path": "Qwen/Qwen2.5-3B-Instruct",
        "dataset_name": "zouxuhong/Countdown-Tasks-3to4#50000",
        "reward_funcs": ["countdown", "swift_format"],
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_host": "127.0.0.1",
        "vllm_server_port": 8000,
        "max_completion_length": 1024,
        "num_train_epochs": 1,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "learning_rate": 5e-7,
        "gradient_accumulation_steps": 8,
        "eval_steps": 500,
        "save_steps": 100,
        "save_total_limit": 20,
        "logging_steps": 1,
        "output_dir": "output/GRPO_COUNTDOWN",
        "warmup_ratio": 0.01,
        "num_generations": 8,
        "temperature": 1.0,
        "system_prompt": "You are a helpful assistant. You first thinks about the reasoning "
        "process in the mind and then provides the user with the answer.",
        "log_completions": True,
        "report_to": ["wandb"],
        "beta": 0.001,
        "num_iterations": 1,
    },
    "openr1_math": {  # 002: config_demo.yaml as the document edited it
        "model_name_or_path": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        "dataset_name": "open-r1/OpenR1-Math-220k",
        "use_vllm": True,
        "vllm_gpu_memory_utilization": 0.7,
        "do_eval": False,
        "gradient_accumulation_steps": 32,
        "gradient_checkpointing": True,
        "learning_rate": 1e-6,
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
        "max_prompt_length": 512,
        "max_completion_length": 2048,
        "max_steps": -1,
        "num_generations": 2,
        "num_train_epochs": 1,
        "per_device_eval_batch_size": 2,
        "per_device_train_batch_size": 2,
        "push_to_hub": False,
        "reward_funcs": ["accuracy", "format", "tag_count"],
        "reward_weights": [1.0, 1.0, 1.0],
        "save_strategy": "epoch",
        "save_total_limit": 1,
        "seed": 42,
        "temperature": 0.7,
        "warmup_ratio": 0.1,
        "output_dir": "data/DeepSeek-R1-Distill-Qwen-1.5B-GRPO",
    },
}


@pytest.mark.parametrize("name", sorted(DOCUMENT_VALUES))
def test_seed_recipes_carry_the_documents_numbers(name):
    raw = load_recipe(RECIPE_DIR / f"{name}.yaml")
    wrong = {k: (raw.get(k), v) for k, v in DOCUMENT_VALUES[name].items() if raw.get(k) != v}
    assert not wrong, f"{name}: (recipe, document) differ: {wrong}"
    header = (RECIPE_DIR / f"{name}.yaml").read_text().split("\nmodel_name_or_path")[0]
    assert "Hardware:" in header and "grpokit train --config recipes/" in header
    assert ("rollout-server" in header) == bool(raw.get("vllm_mode") == "server")


def _openr1_math_dir(tmp_path: Path) -> Path:
    """A local copy shaped like open-r1/OpenR1-Math-220k's default config: parquet shards
    under data/, with the dataset's columns."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [
        {
            "problem": f"Compute {i} + {i}.",
            "solution": f"We add: $\\boxed{{{2 * i}}}$",
            "answer": str(2 * i),
            "problem_type": "Algebra",
            "question_type": "math-word-problem",
            "source": "olympiads",
            "uuid": f"00000000-0000-0000-0000-{i:012d}",
            "is_reasoning_complete": [True],
            "generations": [f"<think>{i} plus {i}</think> $\\boxed{{{2 * i}}}$"],
            "correctness_math_verify": [True],
        }
        for i in range(8)
    ]
    data = tmp_path / "OpenR1-Math-220k"
    (data / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), data / "data" / "train-00000-of-00001.parquet")
    return data


def test_openr1_config_demo_runs_with_only_its_two_paths_changed(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """What the seed document did to open-r1's config_demo.yaml, minus its batch edits: the
    model and dataset lines point at local copies; nothing else in the file changes. The task
    comes from dataset_name, the prompt from `problem`, do_eval: false needs no test split;
    the relative output_dir lands in the working directory."""
    pytest.importorskip("math_verify")
    pytest.importorskip("wandb")  # the recipe reports to wandb (offline without credentials)
    data = _openr1_math_dir(tmp_path)
    src = (RECIPE_DIR / "openr1_config_demo.yaml").read_text()
    new = {"model_name_or_path": tiny_model_dir, "dataset_name": str(data)}
    lines = [
        f"{line.split(':', 1)[0]}: {new[line.split(':', 1)[0]]}"
        if line.split(":", 1)[0] in new
        else line
        for line in src.splitlines()
    ]
    changed = [(a, b) for a, b in zip(src.splitlines(), lines) if a != b]
    assert len(changed) == 2, changed
    recipe = tmp_path / "config_demo.yaml"
    recipe.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")

    cfg = load_config(recipe)
    assert (cfg.task, cfg.do_eval, cfg.num_generations) == ("math", False, 16)
    args = ["train", "--config", str(recipe)]
    if not _have_vllm():  # use_vllm: true needs vllm: the run stops at start, naming it
        assert main(args) == 2
        args += ["--use_vllm", "false"]  # then grpokit's own decode loop
    # push_to_hub: true: no hub here (or no token), so the run stops at start, before any
    # model loads, naming the fix
    assert main(args) == 2
    assert "hub error" in capsys.readouterr().err
    assert not (tmp_path / "data" / "DeepSeek-R1-Distill-Qwen-1.5B-GRPO" / "metrics.jsonl").exists()
    args += ["--push_to_hub", "false"]
    assert main(args) == 0
    out = tmp_path / "data" / "DeepSeek-R1-Distill-Qwen-1.5B-GRPO"
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # one epoch of 8 prompts at 16 completions x 4 accumulation / G=16 = 4 prompts a step
    assert [r["step"] for r in steps] == [1, 2]
    names = {"rewards/accuracy/mean", "rewards/format/mean", "rewards/tag_count/mean"}
    assert names <= set(steps[0])
    assert not list(out.glob("eval_*.json"))  # do_eval: false
    assert (out / "final" / "config.json").is_file()
