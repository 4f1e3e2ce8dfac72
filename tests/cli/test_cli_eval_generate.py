import json

from grpokit.cli import main
from grpokit.evaluation import prompt_text

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


def test_eval_of_a_trained_model_repeats_the_runs_own_evaluation(tmp_path, tiny_model_dir):
    """With no options, ``grpokit eval RUN/final`` evaluates the problems the run held out
    (its data_seed, not its training seed) with the run's evaluation settings, and a
    positional model with --compare is a column of the comparison, not dropped."""
    import shutil

    import yaml

    from grpokit.tasks import get_task

    model = tmp_path / "final"
    shutil.copytree(tiny_model_dir, model)
    params = {"digits": 2, "test_size": 50, "train_size": 16}
    run = {"task": "arithmetic", "task_params": params, "seed": 3, "data_seed": 7,
           "max_eval_samples": 5, "max_completion_length": 2}  # fmt: skip
    (model / "grpokit_config.yaml").write_text(yaml.safe_dump(run))
    out = tmp_path / "e.json"
    assert main(["eval", str(model), "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["num_prompts"] == 5 and r["max_length"] <= 2
    held_out = get_task("arithmetic", seed=7, **params).build("test", limit=5)
    wrong_draw = get_task("arithmetic", seed=3, **params).build("test", limit=5)
    shown = [e["prompt"] for e in r["examples"]]
    assert shown == [prompt_text(row["prompt"]) for row in held_out]
    assert shown != [prompt_text(row["prompt"]) for row in wrong_draw]
    # the base model first: the task and draw still come from the trained one's config
    assert main(["eval", tiny_model_dir, "--compare", str(model), "--output", str(out)]) == 0
    both = json.loads(out.read_text())
    assert [both[k]["model"] for k in sorted(both)] == [tiny_model_dir, str(model)]
    assert [e["prompt"] for e in both["[A]"]["examples"]] == shown


def test_generate_asks_a_trained_model_as_its_run_did(tmp_path, tiny_model_dir, monkeypatch):
    """The run's system prompt and worked problems precede each question unless --plain or
    --task (then that task's default system prompt) is given."""
    import shutil

    import yaml

    import grpokit.prompts

    model = tmp_path / "final"
    shutil.copytree(tiny_model_dir, model)
    demos = [{"role": "user", "content": "What is 1 + 2?"},
             {"role": "assistant", "content": "<answer>3</answer>"}]  # fmt: skip
    run = {"task": "arithmetic", "system_prompt": "Be brief.",
           "task_params": {"demonstrations": demos},
           "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    (model / "grpokit_config.yaml").write_text(yaml.safe_dump(run))
    seen, bound = [], []
    bind = grpokit.prompts.bind_chat_template_kwargs
    monkeypatch.setattr(
        grpokit.prompts, "bind_chat_template_kwargs", lambda t, kw: bound.append(kw) or bind(t, kw)
    )
    render = grpokit.prompts.render_prompts
    monkeypatch.setattr(
        grpokit.prompts, "render_prompts", lambda t, m: seen.append(m) or render(t, m)
    )
    base = ["generate", str(model), "What is 4 + 4?", "--max_new_tokens", "2"]
    question = {"role": "user", "content": "What is 4 + 4?"}
    assert main(base) == 0
    assert seen[-1] == [[{"role": "system", "content": "Be brief."}, *demos, question]]
    assert bound == [{"enable_thinking": False}]  # the run's chat_template_kwargs, as it rendered
    assert main([*base, "--plain"]) == 0
    assert seen[-1] == [[question]]
    assert main([*base, "--task", "arithmetic", "--system_prompt", "S"]) == 0
    assert seen[-1] == [[{"role": "system", "content": "S"}, question]]


def test_eval_and_generate_of_a_tool_run_call_its_tools(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    """A model trained with tools is evaluated through the run's tool loop and chat
    template, as the run's own evaluation did (without them every answer of a model that
    learned to call the calculator is an unanswered <tool_call>)."""
    import shutil

    import yaml

    model = tmp_path / "final"
    shutil.copytree(tiny_model_dir, model)
    run = {"task": "arithmetic", "task_params": {"digits": 1, "test_size": 8, "train_size": 16},
           "tools": ["calculator"], "chat_template": "chatml_tools",
           "max_tool_calling_iterations": 1, "max_completion_length": 4}  # fmt: skip
    (model / "grpokit_config.yaml").write_text(yaml.safe_dump(run))
    out = tmp_path / "e.json"
    assert main(["eval", str(model), "--max_eval_samples", "2", "--output", str(out)]) == 0
    assert "in the run's tool loop (calculator)" in capsys.readouterr().out
    assert "tool_call_rate" in json.loads(out.read_text())
    calls = []  # generate runs the same loop: the agent's rollout, not a single generation
    import grpokit.rollout.agent as agent_mod

    rollout = agent_mod.Agent.rollout
    monkeypatch.setattr(
        agent_mod.Agent, "rollout", lambda self, *a, **k: calls.append(1) or rollout(self, *a, **k)
    )
    assert main(["generate", str(model), "What is 1 + 1?", "--max_new_tokens", "3"]) == 0
    assert calls == [1] and "=== prompt 1, sample 1" in capsys.readouterr().out
    run["tools"] = ["no_such_tool"]
    (model / "grpokit_config.yaml").write_text(yaml.safe_dump(run))
    assert main(["eval", str(model), "--max_eval_samples", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no_such_tool" in err and "Traceback" not in err
    assert main(["generate", str(model), "What is 1 + 1?", "--max_new_tokens", "3"]) == 2
    assert "no_such_tool" in capsys.readouterr().err
