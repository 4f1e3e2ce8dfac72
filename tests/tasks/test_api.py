"""get_task / registered_tasks, parameters, and every task's prompts through a chat template."""

import pytest

from grpokit.prompts import render_prompts
from grpokit.tasks import Task, TaskDataError, get_task, register_task, registered_tasks


def test_registered_tasks():
    assert {"arithmetic", "countdown", "custom", "gsm8k", "math", "tldr"} <= set(registered_tasks())


def test_unknown_task_names_the_closest():
    with pytest.raises(ValueError, match="did you mean 'gsm8k'"):
        get_task("gsm8")
    with pytest.raises(ValueError, match="did you mean 'countdown'"):
        get_task("count_down")


def test_unknown_param_names_the_closest():
    with pytest.raises(TaskDataError, match="did you mean 'train_size'"):
        get_task("arithmetic", train_sise=10)


def test_register_task_twice_is_an_error():
    class Mine(Task):
        pass

    register_task("mine_for_test", Mine)
    register_task("mine_for_test", Mine)  # same class: fine
    with pytest.raises(ValueError, match="twice"):
        register_task("mine_for_test", Task)


def _tasks(tmp_path, write_jsonl):
    write_jsonl(
        tmp_path / "math" / "train.jsonl",
        [
            {"problem": f"What is {i} + {i}?", "solution": "...", "answer": str(2 * i)}
            for i in range(6)
        ],
    )
    write_jsonl(
        tmp_path / "tldr" / "train.jsonl",
        [{"prompt": f"POST: text number {i}\nTL;DR:", "completion": "x"} for i in range(6)],
    )
    write_jsonl(
        tmp_path / "qa.jsonl", [{"q": f"{i} + 1 = ?", "a": i + 1, "extra": i} for i in range(6)]
    )
    return [
        get_task("arithmetic", train_size=6, test_size=3),
        get_task("countdown", train_size=6, test_size=3),
        get_task("gsm8k"),
        get_task("math", dataset_name=str(tmp_path / "math"), test_size=2),
        get_task("tldr", dataset_name=str(tmp_path / "tldr"), test_size=2),
        get_task(
            "custom",
            dataset_name=str(tmp_path / "qa.jsonl"),
            prompt_column="q",
            answer_column="a",
            test_size=2,
        ),
    ]


def test_every_task_renders_through_a_chat_template(tmp_path, chat_tokenizer, write_jsonl):
    """Every task's prompts are chat messages through the template, except tldr's plain
    string prompts (TRL's standard format), which are the model input as they are."""
    for task in _tasks(tmp_path, write_jsonl):
        for split in ("train", "test"):
            rows = task.build(split, limit=2)
            assert 1 <= len(rows) <= 2, task.name
            for row in rows:
                msgs = row["prompt"]
                if task.name == "tldr":
                    assert isinstance(msgs, str) and msgs.startswith("POST: text number")
                    assert render_prompts(chat_tokenizer, [msgs]) == [msgs]
                    continue
                assert msgs[-1]["role"] == "user" and msgs[-1]["content"]
                assert all(set(m) == {"role", "content"} for m in msgs)
                text = chat_tokenizer.apply_chat_template(
                    msgs, tokenize=False, add_generation_prompt=True
                )
                assert text.startswith("<|im_start|>")
                assert text.endswith("<|im_start|>assistant\n")
                assert msgs[-1]["content"] in text
                ids = chat_tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
                assert len(ids) > 3
                for c in task.required_columns:
                    assert c in row, (task.name, c)


def test_every_task_has_default_rewards_and_graders(tmp_path, write_jsonl):
    for task in _tasks(tmp_path, write_jsonl):
        assert task.default_reward_funcs, task.name
        row = task.build("test", limit=1)[0]
        assert task.is_correct("", row) is False
        assert isinstance(task.is_formatted(""), bool)


def test_system_prompt_override_and_removal():
    t = get_task("arithmetic", system_prompt="Be terse.", train_size=4, test_size=2)
    assert t.build("train")[0]["prompt"][0] == {"role": "system", "content": "Be terse."}
    t = get_task("arithmetic", system_prompt="", train_size=4, test_size=2)
    assert [m["role"] for m in t.build("train")[0]["prompt"]] == ["user"]


def test_limit_and_unknown_split():
    t = get_task("arithmetic", train_size=20, test_size=5)
    assert len(t.build("train", limit=7)) == 7
    with pytest.raises(TaskDataError, match="splits"):
        t.build("validation")


def test_default_rewards_resolve(tmp_path, write_jsonl):
    """Every task's default reward names resolve in the reward registry, to callables."""
    from grpokit.rewards import get_reward_funcs

    for task in _tasks(tmp_path, write_jsonl):
        funcs = get_reward_funcs(list(task.default_reward_funcs))
        assert len(funcs) == len(task.default_reward_funcs) and all(map(callable, funcs))


def test_dataset_prompt_column_maps_the_prompt(tmp_path, write_jsonl):
    """TRL / open-r1's dataset_prompt_column: the prompt text comes from another column."""
    write_jsonl(
        tmp_path / "m" / "train.jsonl",
        [{"question_text": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)],
    )
    t = get_task("math", dataset_name=str(tmp_path / "m"), dataset_prompt_column="question_text")
    rows = t.build("train")
    assert [r["problem"] for r in rows] == [f"What is {i} + {i}?" for i in range(4)]
    assert rows[0]["prompt"][-1]["content"] == "What is 0 + 0?"
    same = get_task("math", dataset_name=str(tmp_path / "m"), dataset_prompt_column="problem")
    with pytest.raises(TaskDataError, match="'problem'"):  # the task's own column: no mapping
        same.build("train")
    bad = get_task("math", dataset_name=str(tmp_path / "m"), dataset_prompt_column="questoin")
    with pytest.raises(TaskDataError, match="dataset_prompt_column 'questoin'.*question_text"):
        bad.build("train")
    write_jsonl(tmp_path / "c.jsonl", [{"text": "hi", "q": "ask"} for _ in range(3)])
    c = get_task("custom", dataset_name=str(tmp_path / "c.jsonl"), dataset_prompt_column="q")
    assert c.build("train")[0]["prompt"] == "ask"  # a plain string: the model input as is


def test_dataset_prompt_column_is_refused_where_prompts_are_built():
    for name in ("arithmetic", "countdown", "code"):
        with pytest.raises(TaskDataError, match="dataset_prompt_column.*does not apply"):
            get_task(name, dataset_prompt_column="prompt")


def test_task_for_dataset_and_config_inference(tmp_path):
    from grpokit.config import build_config
    from grpokit.tasks import task_for_dataset

    assert task_for_dataset("open-r1/OpenR1-Math-220k") == "math"
    assert task_for_dataset("/data/copies/OpenR1-Math-220k/") == "math"
    assert task_for_dataset("openai/gsm8k") == "gsm8k"
    assert task_for_dataset("mlabonne/smoltldr") == "tldr"
    assert task_for_dataset("someone/unknown") is None
    assert build_config({"dataset_name": "open-r1/OpenR1-Math-220k"}).task == "math"
    # an explicit task always wins
    assert build_config({"dataset_name": "open-r1/OpenR1-Math-220k", "task": "custom"}).task == (
        "custom"
    )
    assert build_config({}).task == "gsm8k"
