"""Golden runs (torchtune's recipe tests, for GRPO): every logged number of 5-step runs of the
tiny model, per loss type and variant, against the files in tests/trainer/golden/ (written
before the trainer was split into rooms; ``python tests/trainer/golden_runs.py check --exact``
compares bit for bit on the machine that wrote them). Here: float32 tolerance, so a CPU with
other kernels passes while a change of behaviour fails."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from golden_runs import TINY_RUNS, diff, golden_path, run_tiny  # noqa: E402


@pytest.mark.parametrize("name", list(TINY_RUNS))
def test_golden_run(name, tmp_path, tiny_model_dir):
    want = json.loads(golden_path(name).read_text())
    got = run_tiny(name, tiny_model_dir, tmp_path / name)
    assert len(got["metrics"]) == 5 + (name == "full_sync_ref")
    problems = diff(want, got, exact=False)
    assert not problems, "\n".join(problems[:20])


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
