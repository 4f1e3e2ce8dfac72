import dataclasses

import pytest

from grpokit.config import ConfigError, GRPOConfig, build_config, load_config, parse_overrides


def test_recipe_plus_overrides(tmp_path):
    r = tmp_path / "r.yaml"
    r.write_text(
        "learning_rate: 5.0e-6\nbeta: 0.0\nnum_generations: 4\nreward_funcs: [correctness]\n"
    )
    c = load_config(
        r,
        [
            "--learning_rate",
            "1e-6",
            "--beta",
            "0.04",
            "--use_peft",
            "--lr_scheduler_type=cosine",
            "--reward_funcs",
            "[accuracy, format]",
        ],
    )
    assert c.learning_rate == 1e-6 and c.beta == 0.04 and c.use_peft is True
    assert c.lr_scheduler_type == "cosine" and c.reward_funcs == ["accuracy", "format"]
    assert c.num_generations == 4


def test_frozen():
    c = GRPOConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.beta = 1.0


def test_unknown_key_names_closest():
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        build_config({"learnig_rate": 1e-6})
    with pytest.raises(ConfigError, match="did you mean 'num_generations'"):
        build_config({"num_generation": 4})


def test_the_hub_token_is_never_part_of_the_saved_config():
    c = build_config({"push_to_hub": True, "hub_token": "hf_secret"})
    assert c.hub_token == "hf_secret" and c.to_dict()["hub_token"] is None


def test_ignored_trl_key_warns():
    with pytest.warns(UserWarning, match="tf32"):
        c = build_config({"tf32": True})
    assert c.beta == 0.0


@pytest.mark.parametrize(
    "values,match",
    [
        ({"epsilon": 0}, "epsilon"),
        ({"temperature": 0.0}, "temperature"),
        ({"num_generations": 1}, "num_generations"),
        ({"max_steps": "many"}, "expected an integer"),
        ({"use_peft": "maybe"}, "true or false"),
        ({"loss_type": "ppo"}, "loss_type"),
        ({"scale_rewards": "median"}, "scale_rewards"),
        ({"beta": -1}, "beta"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"hub_strategy": "sometimes"}, "hub_strategy.*every_save"),
        ({"run_name": "a/b"}, "run_name"),
        ({"attn_implementation": "flash"}, "attn_implementation.*sdpa"),
        ({"min_p": -0.1}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"reward_funcs": ["a", "b"], "reward_weights": [1.0]}, "one weight per function"),
        ({"sync_ref_model": True, "use_peft": True}, "sync_ref_model"),
        ({"report_to": "neptune"}, "report_to"),
        ({"vespo_lambda_neg": 0}, r"vespo_lambda_neg \(0"),  # each key named (hypothesis)
        ({"num_generations": 0}, "num_generations"),  # not a ZeroDivisionError
        ({"vllm_importance_sampling_clip_max": 0}, "vllm_importance_sampling_clip_max=0"),
        ({"gen_batch_size": 8}, "gen_batch_size=8 .*needs dynamic_sampling: true"),
        ({"gen_batch_size": -1, "dynamic_sampling": True}, "gen_batch_size=-1 .*>= 0"),
        (
            {
                "gen_batch_size": 1,
                "dynamic_sampling": True,
                "per_device_train_batch_size": 8,
                "gradient_accumulation_steps": 2,
                "num_generations": 8,
            },
            "gen_batch_size=1 prompts a generation call is fewer than the 2 prompts of a step",
        ),
    ],
)
def test_bad_values(values, match):
    with pytest.raises(ConfigError, match=match):
        build_config(values)


def test_batch_arithmetic_spelled_out():
    with pytest.raises(ConfigError) as e:
        build_config(
            {
                "per_device_train_batch_size": 6,
                "gradient_accumulation_steps": 2,
                "num_generations": 8,
            }
        )
    msg = str(e.value)
    assert (
        "6" in msg and "x gradient_accumulation_steps (2)" in msg and "= 12" in msg and "(8)" in msg
    )


def test_gen_batch_size_is_shared_by_the_processes():
    from grpokit.config import check_processes

    c = build_config({"dynamic_sampling": True, "gen_batch_size": 6})
    check_processes(c, 2)
    with pytest.raises(ConfigError, match=r"gen_batch_size \(6\) .* shared by 4 processes"):
        check_processes(c, 4)


def test_batch_arithmetic_ok():
    c = build_config(
        {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_generations": 8}
    )
    assert c.completions_per_step == 16 and c.prompts_per_step == 2


def test_scale_rewards_bool_compat():
    assert build_config({"scale_rewards": False}).scale_rewards_mode == "none"
    assert build_config({"scale_rewards": True}).scale_rewards_mode == "group"


def test_parse_overrides_forms():
    assert parse_overrides(["--a", "1", "--b=x", "--flag", "--c", "[1, 2]"]) == {
        "a": 1,
        "b": "x",
        "flag": True,
        "c": [1, 2],
    }
    with pytest.raises(ConfigError, match="--key value"):
        parse_overrides(["stray"])


def test_missing_recipe(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_config_accepts_exactly_the_variants_the_math_has():
    from grpokit.algo import LOSS_TYPES, SAMPLING_IS_MODES

    for loss_type in LOSS_TYPES:
        assert build_config({"loss_type": loss_type}).loss_type == loss_type
    for mode in SAMPLING_IS_MODES:
        assert build_config({"vllm_importance_sampling_mode": mode})
    with pytest.raises(ConfigError, match=r"loss_type='ppo': use one of \('grpo'"):
        build_config({"loss_type": "ppo"})


def test_importing_the_config_loads_neither_torch_nor_the_tasks():
    import os
    import subprocess
    import sys
    from pathlib import Path

    import grpokit

    root = str(Path(grpokit.__file__).resolve().parents[1])  # the checkout under test
    code = (
        "import sys, grpokit.config; print(sorted({'torch', 'grpokit.tasks'} & set(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"


def test_unknown_task_is_refused_with_the_known_names():
    with pytest.raises(ConfigError, match=r"unknown task 'gsm8'; did you mean 'gsm8k'\? Known: "):
        build_config({"task": "gsm8"})
    with pytest.raises(
        ConfigError, match=r"unknown task 'nothing_like_it'\. Known: .*register_task"
    ):
        build_config({"task": "nothing_like_it"})


def test_a_registered_task_is_known_to_the_config():
    from grpokit.tasks import register_task
    from grpokit.tasks.custom import CustomTask

    register_task("custom_for_config_test", CustomTask)
    assert build_config({"task": "custom_for_config_test"}).task == "custom_for_config_test"


def test_vllm_keys_are_real_and_validated():
    c = build_config({"use_vllm": True, "vllm_mode": "server", "vllm_server_port": 8123})
    assert c.use_vllm and c.vllm_mode == "server" and c.vllm_server_port == 8123
    assert c.vllm_importance_sampling_correction and c.vllm_importance_sampling_clip_max == 2.0
    for bad, match in [
        ({"vllm_mode": "remote"}, "vllm_mode"),
        ({"vllm_server_port": 0}, "vllm_server_port"),
        ({"vllm_server_timeout": 0}, "vllm_server_timeout"),
        ({"vllm_gpu_memory_utilization": 1.5}, "vllm_gpu_memory_utilization"),
        ({"vllm_importance_sampling_mode": "tis"}, "token_truncate"),
        ({"vllm_importance_sampling_clip_max": 0.5}, "ratio 1 .* must lie inside"),
        ({"vllm_importance_sampling_clip_min": 1.5}, "ratio 1 .* must lie inside"),
        ({"vllm_importance_sampling_clip_max": None}, "both null"),
    ]:
        with pytest.raises(ConfigError, match=match):
            build_config(bad)


def test_trl_1_16_keys_are_known():
    """Every key of TRL 1.16's GRPOConfig and transformers 5's TrainingArguments is a grpokit
    key, mapped, ignored with a warning, or refused at a non-default value with the fix: a
    TRL recipe never fails on "unknown config key"."""
    import dataclasses

    from transformers import TrainingArguments

    from grpokit import config as C

    trl_only = [
        "model_init_kwargs", "router_aux_loss_coef", "disable_dropout", "num_generations_eval",
        "ds3_gather_for_generation", "shuffle_dataset", "pad_to_multiple_of",
        "generation_batch_size", "steps_per_generation", "generation_kwargs",
        "chat_template_kwargs", "cache_implementation", "vllm_model_impl",
        "vllm_structured_outputs_regex", "vllm_server_base_url", "vllm_group_port",
        "vllm_max_model_length", "vllm_tensor_parallel_size", "log_multimodal",
        "log_unique_prompts", "log_completions_hub_repo", "use_transformers_continuous_batching",
        "transformers_continuous_batching_config", "use_transformers_paged",
        "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min",
    ]  # fmt: skip
    known = {f.name for f in dataclasses.fields(GRPOConfig)} | set(C.IGNORED_KEYS)
    known |= set(C.DEFAULT_ONLY_KEYS) | set(C.TRL_ALIASES) | set(C.RENAMED_KEYS)
    known |= {"use_cpu", "vllm_server_base_url", "generation_kwargs", "model_init_kwargs"}
    names = trl_only + [f.name for f in dataclasses.fields(TrainingArguments)]
    assert [k for k in names if k not in known] == []


def test_trl_keys_map_onto_grpokit_keys():
    with pytest.warns(UserWarning, match="deprecated name of vllm_importance_sampling_clip_max"):
        assert (
            build_config({"vllm_importance_sampling_cap": 3.0}).vllm_importance_sampling_clip_max
            == 3.0
        )
    c = build_config(
        {"generation_kwargs": {"top_k": 50, "repetition_penalty": 1.1}, "use_cpu": True,
         "model_init_kwargs": {"dtype": "bfloat16", "attn_implementation": "eager"},
         "vllm_server_base_url": "http://10.0.0.2:8001", "vllm_max_model_length": 1024,
         "steps_per_generation": 2, "gradient_accumulation_steps": 2, "warmup_steps": 0.1,
         "deepspeed": None, "torch_compile": False, "fsdp": ""}
    )  # fmt: skip
    assert (c.top_k, c.repetition_penalty, c.device) == (50, 1.1, "cpu")
    assert (c.torch_dtype, c.attn_implementation) == ("bfloat16", "eager")
    assert (c.vllm_server_host, c.vllm_server_port, c.vllm_max_model_len) == (
        "10.0.0.2",
        8001,
        1024,
    )
    assert c.warmup_steps == 0.1
    assert (
        build_config(
            {"use_cpu": True, "device": "cpu", "generation_kwargs": {"top_k": 5}, "top_k": 5}
        ).top_k
        == 5
    )
    for bad, match in [
        ({"generation_kwargs": {"max_new_tokens": 5}}, "it takes temperature"),
        ({"generation_kwargs": {"top_k": 5}, "top_k": 3}, "top_k is set twice"),
        ({"use_cpu": True, "device": "cuda"}, "device is set twice"),
        ({"vllm_server_base_url": "10.0.0.2"}, "http://HOST:PORT"),
        ({"steps_per_generation": 4, "gradient_accumulation_steps": 2}, "generates once per"),
        ({"generation_batch_size": 64}, "generates one optimizer step"),
        ({"deepspeed": "ds.json"}, "accelerate launch --config_file"),
        ({"resume_from_checkpoint": "out/checkpoint-5"}, "--resume"),
        ({"torch_compile": True}, "does not compile"),
        ({"vllm_tensor_parallel_size": 2}, "tensor-parallel 1"),
        ({"warmup_steps": 2.5}, "whole number"),
        ({"num_generations_eval": 0}, "num_generations_eval"),
        (
            {"vllm_importance_sampling_cap": 2.0, "vllm_importance_sampling_clip_max": 3.0},
            "keep only",
        ),
    ]:
        with pytest.raises(ConfigError, match=match):
            build_config(bad)


def test_warmup_steps_count_or_fraction():
    import torch

    from grpokit.optim import build_scheduler

    def warm(**kw):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = build_scheduler(
            opt, build_config({"lr_scheduler_type": "constant_with_warmup", **kw}), 100
        )
        lrs = []
        for _ in range(30):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return next(i for i, lr in enumerate(lrs) if lr == 1.0)

    assert warm(warmup_steps=7) == 7
    assert warm(warmup_steps=0.05) == 5
    assert warm(warmup_ratio=0.05) == 5
    assert warm(warmup_steps=12, warmup_ratio=0.05) == 12  # warmup_steps wins, as transformers


def test_fp16_true_is_refused_not_trained_in_float32():
    """TRL's fp16: true means fp16 mixed precision; grpokit has none, so it says so instead
    of training in float32 behind a warning. false (the default) is accepted quietly."""
    with pytest.raises(ConfigError, match="fp16: true .*bf16: true.*torch_dtype: float16"):
        build_config({"fp16": True})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build_config({"fp16": False}) == GRPOConfig()


def test_eval_strategy_no_turns_periodic_evaluation_off():
    assert build_config({"eval_strategy": "no", "eval_steps": 100}).eval_steps == 0
    assert build_config({"eval_steps": 100, "eval_strategy": "no"}).eval_steps == 0
    assert build_config({"eval_strategy": "steps", "eval_steps": 100}).eval_steps == 100
    with pytest.raises(ConfigError, match="eval_strategy: 'epoch' is not supported"):
        build_config({"eval_strategy": "epoch"})


def test_eval_strategy_no_unquoted_in_yaml_reads_as_no(tmp_path):
    # YAML 1.1 reads an unquoted `no` as false: it still means TRL's "no"
    recipe = tmp_path / "r.yaml"
    recipe.write_text("eval_strategy: no\neval_steps: 100\n")
    assert load_config(str(recipe), []).eval_steps == 0
    assert load_config(None, ["--eval_strategy", "no", "--eval_steps", "5"]).eval_steps == 0


def test_bf16_auto_follows_the_hardware():
    from grpokit.speed.cpu import cpu_flags, has_native_bf16

    native = bool(has_native_bf16(cpu_flags()))  # the tests run on CPU (no GPU in CI)
    assert build_config({"bf16": "auto", "device": "cpu"}).bf16 is native
    assert build_config({"bf16": "Auto", "device": "cpu"}).bf16 is native
    assert build_config({"bf16": True}).bf16 is True
    assert build_config({"bf16": "false"}).bf16 is False
    with pytest.raises(ConfigError, match="bf16='maybe': expected true, false or auto"):
        build_config({"bf16": "maybe"})
