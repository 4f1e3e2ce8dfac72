"""The hostile suite inside a real GRPO training step (issue 8).

The tiny random model cannot write the hostile programs, so the run's reward function is a
plugin file that swaps each sampled completion's text for one hostile program (one good
solution among them) and hands the batch to the real `code` reward, which runs it in the real
sandbox. The real trainer must finish the step with those rewards, and nothing the programs
did may remain: no process, no file, no connection, no staging directory.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from grpokit.config import build_config

_spec = importlib.util.spec_from_file_location(
    "sandbox_hostile_programs_train", Path(__file__).with_name("test_sandbox_hostile.py")
)
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)
hostile = H.hostile  # the fixture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the namespaces level needs root")

PLUGIN = '''
import json
from grpokit.rewards import get_reward_funcs

PROGRAMS = {programs!r}
NAMES = list(PROGRAMS)
_code = get_reward_funcs([{{"code": {{"timeout": 1.5}}}}])[0]


def hostile_code(prompts, completions, verification_info, **kwargs):
    """Score program NAMES[i] in place of completion i, through the real `code` reward."""
    names = [NAMES[i % len(NAMES)] for i in range(len(completions))]
    swapped = [
        [{{"role": "assistant", "content": "```python\\n" + PROGRAMS[n] + "```"}}] for n in names
    ]
    scores = _code(prompts, swapped, verification_info, **kwargs)
    sampled = [c[0]["content"] for c in completions]
    with open({log!r}, "a") as f:
        f.write(json.dumps({{"names": names, "scores": scores, "sampled": sampled}}) + "\\n")
    return scores
'''


def test_hostile_completions_inside_a_training_step(tmp_path, tiny_model_dir, hostile):
    from grpokit.trainer import GRPOTrainer

    programs = hostile.programs | {"good": H.GOOD}
    assert len(programs) == 20
    log = tmp_path / "rewards.jsonl"
    plugin = tmp_path / "hostile_reward.py"
    plugin.write_text(PLUGIN.format(programs=programs, log=str(log)))
    rows = [
        {
            "id": f"sum-{i}",
            "problem": "Read two integers on one line and print their sum.",
            "verification_info": {"language": "python", "test_cases": [H.CASE]},
        }
        for i in range(14)
    ]
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config(
        dict(
            task="code",
            dataset_name=str(data),
            task_params={"test_size": 2},
            reward_funcs=[f"{plugin}:hostile_code"],
            model_name_or_path=tiny_model_dir,
            output_dir=str(tmp_path / "run"),
            num_generations=2,
            per_device_train_batch_size=20,  # 10 prompts x 2: every program once
            max_completion_length=6,
            max_prompt_length=128,
            learning_rate=1e-3,
            max_steps=1,
            save_steps=0,
            do_eval=False,
            seed=0,
        )
    )
    res = GRPOTrainer(cfg).train()

    assert res["step"] == 1
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(calls) == 1 and sorted(calls[0]["names"]) == sorted(programs)
    assert all(isinstance(s, str) for s in calls[0]["sampled"])  # the model's own texts
    got = dict(zip(calls[0]["names"], calls[0]["scores"]))
    assert got == H.EXPECTED | {"good": 1.0}
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if "rewards/hostile_code/mean" in m]
    assert len(train) == 1
    assert train[0]["rewards/hostile_code/mean"] == pytest.approx(2 / 20)
    assert math.isfinite(train[0]["loss"])
    assert hostile.leftovers() == {}
