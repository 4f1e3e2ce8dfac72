"""bench/speed.py's step limit (the least time a step can take from the measured rates): the
arithmetic by hand, since the bench prints it next to every measured step."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_speed", Path(__file__).resolve().parents[1] / "bench" / "speed.py"
)
speed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(speed)

RES = {"model_gemm_gflops": 1.0, "read_gbps": 1.0, "body_params": 100, "head_params": 10}
# 2 rows (G=2) of 4 prompt tokens each, 6 completion tokens, the longest 4
ROUND = [{"prompt_tokens": 8, "tokens": 6, "max_length": 4}]
SPEC = {"num_generations": 2, "use_peft": False, "beta": 0.04}


def test_full_fine_tuning_step_limit_by_hand():
    lim = speed.step_limit({**RES, "compute_dtype": "fp32"}, ROUND, 1, SPEC)
    fwd = 2 * 100 * (4 + 6) + 2 * 10 * 6  # prompt once, completions, head on completions
    assert lim["training"] == pytest.approx(3 * fwd * 1e-9)
    assert lim["reference"] == pytest.approx(fwd * 1e-9)
    # prefill 2 x 110 x 4; decoding: max(4 tokens x 440 bytes, 2 x 110 x 6 FLOPs)
    assert lim["generation"] == pytest.approx((2 * 110 * 4 + max(4 * 440, 2 * 110 * 6)) * 1e-9)
    assert lim["step"] == pytest.approx(lim["training"] + lim["reference"] + lim["generation"])


def test_lora_bf16_and_several_iterations():
    lim = speed.step_limit(
        {**RES, "compute_dtype": "bf16"}, ROUND, 2, {**SPEC, "use_peft": True, "beta": 0.0}
    )
    fwd = 2 * 100 * (4 + 6) + 2 * 10 * 6
    assert lim["training"] == pytest.approx(2 * fwd * 1e-9)  # no weight gradients
    assert lim["reference"] == 0.0
    # bf16 weights (2 bytes): the products bound the decoding; a round shared by 2 steps
    assert lim["generation"] == pytest.approx((2 * 110 * 4 + 2 * 110 * 6) * 1e-9 / 2)


def test_summary_reports_the_ratio_to_the_limit():
    res = {
        **RES,
        "compute_dtype": "fp32",
        "matmul_gflops": {"fp32": 2.0},
        "steps": [
            {"step": 1.0, "generation": 0.2, "scoring": 0.0, "reference": 0.2, "training": 0.6,
             "other": 0.0, "tokens": 6, "prompt_tokens": 8, "max_length": 4,
             "mean_length": 3.0, "forward_positions": None}
        ] * 2,
    }  # fmt: skip
    sm = speed.summarize(res, 1, spec=SPEC)
    lim = speed.step_limit(res, ROUND, 1, SPEC)
    assert sm["limit_step"] == pytest.approx(lim["step"])
    assert sm["of_limit"] == pytest.approx(1.0 / lim["step"])
    assert sm["read_gbps"] == 1.0


def test_training_rates_count_no_weight_gradients_for_lora():
    """Full fine-tuning runs 6 x params a token (forward, input and weight gradients); LoRA's
    frozen weights get no gradient, so 4 x: counting 6 would overstate LoRA's rate by half."""
    step = {"step": 1.0, "generation": 0.2, "scoring": 0.0, "reference": 0.2, "training": 0.5,
            "other": 0.0, "tokens": 6, "prompt_tokens": 8, "max_length": 4,
            "mean_length": 3.0, "forward_positions": 10}  # fmt: skip
    res = {**RES, "compute_dtype": "bf16", "matmul_gflops": {"bf16": 1.0}, "steps": [step] * 2}
    full = speed.summarize(res, 1, spec=SPEC)
    lora = speed.summarize(res, 1, spec={**SPEC, "use_peft": True})
    flops = 100 * (8 + 6) + 10 * 6  # params x tokens: body on all, head on completions
    assert full["train_gflops"] == pytest.approx(6 * flops / 0.5 / 1e9)
    assert lora["train_gflops"] == pytest.approx(4 * flops / 0.5 / 1e9)
    executed = 100 * 10 + 10 * 6  # body on the positions run, head on completions
    assert full["exec_gflops"] == pytest.approx(6 * executed / 0.5 / 1e9)
    assert lora["exec_gflops"] == pytest.approx(4 * executed / 0.5 / 1e9)


def test_profile_by_shapes_names_each_product_by_its_operands_and_counts_it():
    import torch

    a, b = torch.ones(32, 48), torch.ones(48, 16)
    for calls, want in ((None, "aten::mm"), ({}, "aten::mm [[32, 48], [48, 16]]")):
        store: dict = {}
        fn = speed._profiled(lambda: torch.mm(a, b), "training", store, lambda: True, calls)
        assert fn().shape == (32, 16)
        fn()  # two profiled calls: their times and counts add up
        assert want in store["training"], sorted(store["training"])
        table = speed.profile_table(store, 3, calls)
        assert "matrix products" in table and f"`{want}`" in table
        if calls is not None:
            assert calls["training"][want] == 2
            assert f"`{want}` | " in table and table.split(f"`{want}`")[1].split("\n")[0].endswith(
                " 2 |"
            )
    store = {}
    skipped = speed._profiled(lambda: torch.mm(a, b), "training", store, lambda: False, {})
    skipped()
    assert store == {}  # not due: run as is, nothing recorded
