"""Bad input gets a clear error that names the problem (and usually the fix) before any
expensive work. One row per case: what is wrong, how to trigger it, what the message says."""

import json

import pytest

from grpokit.config import ConfigError, build_config, load_config


def cfg(**kw):
    return lambda tmp: build_config(kw)


def recipe(text):
    def run(tmp):
        p = tmp / "r.yaml"
        p.write_text(text)
        return load_config(p)

    return run


def task(name, **kw):
    def run(tmp):
        from grpokit.tasks import get_task

        return get_task(name, **kw).build("train")

    return run


def task_file(name, rows, raw=None, **kw):
    def run(tmp):
        from grpokit.tasks import get_task

        p = tmp / "data.jsonl"
        p.write_text(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in rows))
        return get_task(name, dataset_name=str(p), **kw).build("train")

    return run


def rewards(specs):
    def run(tmp):
        from grpokit.rewards import get_reward_funcs

        return get_reward_funcs(specs)

    return run


def plugin(src, func):
    def run(tmp):
        from grpokit.rewards import get_reward_funcs

        p = tmp / "plug.py"
        p.write_text(src)
        return get_reward_funcs([f"{p}:{func}"])

    return run


def scoring(fn):
    def run(tmp):
        from grpokit.scoring import score

        return score([fn], ["p", "p"], ["fine", "bad one"], {})

    return run


def _raises_on_bad(prompts, completions, **kw):
    return [len(c) if c != "bad one" else int("x") for c in completions]


def model_dir_without_config(tmp):
    from grpokit.models import resolve_model

    (tmp / "m").mkdir()
    return resolve_model(str(tmp / "m"))


def no_chat_template(tmp):
    from grpokit.models import require_chat_template
    from grpokit.testing import make_tokenizer

    tok = make_tokenizer()
    tok.chat_template = None
    return require_chat_template(tok, "my/model")


def long_prompt(tmp):
    from grpokit.prompts import tokenize_prompts
    from grpokit.testing import make_tokenizer

    return tokenize_prompts(make_tokenizer(), ["word " * 50], max_prompt_length=8, on_long="error")


def too_little_data(tmp):
    from grpokit.prompts import PromptSampler

    return PromptSampler(3, 4, seed=0)


CASES = [
    # config
    ("unknown key", cfg(learnig_rate=1e-6), ConfigError, "did you mean 'learning_rate'"),
    ("wrong type (int)", cfg(max_steps="ten"), ConfigError, "max_steps='ten': expected an integer"),
    ("wrong type (bool)", cfg(use_peft="maybe"), ConfigError, "use_peft.*true or false"),
    (
        "wrong type (list)",
        cfg(reward_funcs="accuracy"),
        ConfigError,
        "reward_funcs.*expected a list",
    ),
    ("epsilon <= 0", cfg(epsilon=0.0), ConfigError, "epsilon=0.0 must be > 0"),
    ("epsilon_high <= 0", cfg(epsilon_high=-0.1), ConfigError, "epsilon_high"),
    ("temperature <= 0", cfg(temperature=0.0), ConfigError, "temperature=0.0 must be > 0"),
    ("group of one", cfg(num_generations=1), ConfigError, "group of one has no spread"),
    (
        "batch geometry",
        cfg(per_device_train_batch_size=6, num_generations=4),
        ConfigError,
        r"= 6, which is not divisible by num_generations \(4\)",
    ),
    ("negative beta", cfg(beta=-0.1), ConfigError, "beta=-0.1 must be >= 0"),
    ("top_p out of range", cfg(top_p=0.0), ConfigError, "top_p"),
    ("unknown loss_type", cfg(loss_type="ppo"), ConfigError, "loss_type='ppo'.*grpo"),
    ("unknown scale_rewards", cfg(scale_rewards="median"), ConfigError, "scale_rewards"),
    ("unknown scheduler", cfg(lr_scheduler_type="step"), ConfigError, "lr_scheduler_type='step'"),
    ("warmup_ratio >= 1", cfg(warmup_ratio=1.5), ConfigError, "warmup_ratio=1.5"),
    (
        "weights vs funcs",
        cfg(reward_funcs=["a", "b"], reward_weights=[1.0]),
        ConfigError,
        "one weight per function",
    ),
    ("non-finite weight", cfg(reward_weights=[float("nan")]), ConfigError, "finite"),
    (
        "sync_ref_model with LoRA",
        cfg(sync_ref_model=True, use_peft=True),
        ConfigError,
        "sync_ref_model",
    ),
    ("no completion tokens", cfg(max_completion_length=0), ConfigError, "max_completion_length"),
    ("unknown tracker", cfg(report_to="neptune"), ConfigError, "report_to='neptune'"),
    (
        "no run length",
        cfg(max_steps=-1, num_train_epochs=0.0),
        ConfigError,
        "max_steps > 0 or num_train_epochs",
    ),
    ("recipe not a mapping", recipe("- a\n- b\n"), ConfigError, "must be a mapping"),
    ("recipe not YAML", recipe("a: [1, 2\n"), ConfigError, "not valid YAML"),
    ("recipe missing", lambda tmp: load_config(tmp / "nope.yaml"), ConfigError, "does not exist"),
    # tasks and data
    ("unknown task", task("gsm8", dataset_name=None), ValueError, "did you mean 'gsm8k'"),
    ("unknown task param", task("arithmetic", digitz=2), ValueError, "digitz"),
    (
        "dataset path missing",
        task("gsm8k", dataset_name="/no/such/file.jsonl"),
        ValueError,
        "does not exist",
    ),
    (
        "dataset lacks columns",
        task_file("gsm8k", [{"question": "q", "solution": "1"}]),
        ValueError,
        "answer",
    ),
    ("empty dataset", task_file("gsm8k", [], raw=""), ValueError, "empty|no rows"),
    (
        "bad JSON line",
        task_file("gsm8k", [], raw='{"question": "q", "answer": "#### 1"}\n{oops\n'),
        ValueError,
        "JSON|json",
    ),
    (
        "gsm8k gold marker",
        task_file("gsm8k", [{"question": "q", "answer": "42"}]),
        ValueError,
        "####",
    ),
    ("too little data", too_little_data, ValueError, "3 prompts but one step needs 4"),
    ("prompt too long", long_prompt, ValueError, "exceed max_prompt_length=8"),
    # rewards
    ("unknown reward", rewards(["acuracy"]), KeyError, "did you mean 'accuracy'"),
    ("bad reward param", rewards([{"cosine": {"maxlen": 1}}]), TypeError, "cosine.*no parameter"),
    (
        "positive max_penalty",
        rewards([{"repetition_penalty": {"max_penalty": 1.0}}]),
        ValueError,
        "max_penalty",
    ),
    ("plugin file missing", rewards(["/no/such.py:f"]), FileNotFoundError, "does not exist"),
    ("plugin function missing", plugin("x = 1\n", "f"), AttributeError, "has no function 'f'"),
    (
        "reward raises",
        scoring(_raises_on_bad),
        RuntimeError,
        "_raises_on_bad.*ValueError.*'bad one'.*reward_errors: skip",
    ),
    (
        "reward wrong length",
        scoring(lambda prompts, completions, **k: [1.0]),
        RuntimeError,
        "one float or None per completion",
    ),
    (
        "reward non-finite",
        scoring(lambda prompts, completions, **k: [float("nan")] * 2),
        RuntimeError,
        "finite",
    ),
    # models
    ("model dir without config", model_dir_without_config, RuntimeError, "config.json"),
    ("no chat template", no_chat_template, RuntimeError, "no chat template.*chat_template"),
]


@pytest.mark.parametrize("what,trigger,exc,match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_named(tmp_path, what, trigger, exc, match):
    with pytest.raises(exc, match=match):
        trigger(tmp_path)


def test_table_is_broad():
    assert len(CASES) >= 25
