"""Golden runs (torchtune's recipe tests, for GRPO): every logged number of 5-step runs of the
tiny model, per loss type and variant, against the files in tests/trainer/golden/ (written
before the trainer was split into rooms; ``python tests/trainer/golden_runs.py check --exact``
compares bit for bit on the machine that wrote them). Here: float32 tolerance (bf16 runs: a
bf16 one), so a CPU with other kernels passes while a change of behaviour fails."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from golden_runs import (  # noqa: E402
    ISA_ENV,
    TINY_RUNS,
    diff,
    golden_path,
    near_tie,
    rtol_for,
    run_tiny,
)


@pytest.mark.parametrize("name", [n for n in TINY_RUNS if not TINY_RUNS[n].get("bf16")])
def test_golden_run(name, tmp_path, tiny_model_dir):
    want = json.loads(golden_path(name).read_text())
    got = run_tiny(name, tiny_model_dir, tmp_path / name)
    assert len(got["metrics"]) == 5 + (name == "full_sync_ref")
    problems = diff(want, got, exact=False, rtol=rtol_for(name))
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("name", [n for n in TINY_RUNS if TINY_RUNS[n].get("bf16")])
def test_golden_bf16_run(name):
    """In a child process with oneDNN capped below AMX (golden_runs' docstring says why), so
    the same file holds on AMX, AVX512-BF16 and AVX2 CPUs."""
    script = Path(__file__).parent / "golden_runs.py"
    env = {**os.environ, **ISA_ENV}
    r = subprocess.run(
        [sys.executable, str(script), "check", "--runs", name],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert f"{name}: within tolerance" in r.stdout, r.stdout[-4000:]


def test_a_bf16_golden_tolerates_one_near_tie_and_nothing_more():
    """Across CPUs a bf16 run may draw one token differently (near_tie's docstring); a second
    differing completion, a number out of tolerance or a float32 run still fail."""
    want = json.loads(golden_path("bf16_speed_paths").read_text())
    got = json.loads(json.dumps(want))
    got["completions"][24]["completion"] += "x"
    one = diff(want, got, exact=False, rtol=rtol_for("bf16_speed_paths"))
    assert len(one) == 1 and near_tie("bf16_speed_paths", one) == one[0]
    assert near_tie("grpo", one) is None
    got["completions"][3]["completion"] += "y"
    two = diff(want, got, exact=False, rtol=rtol_for("bf16_speed_paths"))
    assert len(two) == 2 and near_tie("bf16_speed_paths", two) is None
    got = json.loads(json.dumps(want))
    got["metrics"][2]["grad_norm"] *= 1.01
    num = diff(want, got, exact=False, rtol=rtol_for("bf16_speed_paths"))
    assert len(num) == 1 and near_tie("bf16_speed_paths", num) is None


@pytest.mark.parametrize("micro,accumulation", [(8, 1), (1, 8)])
def test_golden_curve_does_not_depend_on_micro_batching(
    micro, accumulation, tmp_path, tiny_model_dir
):
    """The grpo golden run was written with 4 x 2 (micro-batch x accumulation); 8 x 1 and
    1 x 8 give the same curve. Only the token positions the forwards computed differ."""
    want = json.loads(golden_path("grpo").read_text())
    got = run_tiny(
        "grpo",
        tiny_model_dir,
        tmp_path / "run",
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
    )
    for rows in (want["metrics"], got["metrics"]):
        for r in rows:
            r.pop("tokens_forward")
    problems = diff(want, got, exact=False)
    assert not problems, "\n".join(problems[:20])
