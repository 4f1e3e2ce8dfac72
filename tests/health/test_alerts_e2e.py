"""Each training-health alert triggered for real by a tiny-model run: the console line (a
logging warning), the ``health/*`` metric in metrics.jsonl, status.json's ``health`` section;
``health_checks: stop`` through the CLI (checkpoint, exit code 4); and a healthy run that
triggers none."""

import json
import logging
import shutil
from pathlib import Path

import yaml

from grpokit.config import build_config

HERE = Path(__file__).parent

BASE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 64, "test_size": 8},
    num_generations=4,
    per_device_train_batch_size=8,
    max_completion_length=12,
    max_prompt_length=128,
    learning_rate=1e-3,
    save_steps=0,
    max_eval_samples=8,
    per_device_eval_batch_size=8,
    logging_steps=1,
    torch_dtype="float32",
    write_report=False,
    seed=0,
)


def _rewards(tmp_path, *names):
    """``reward_funcs`` entries from a fresh copy of _rewards.py (its call counter at 0)."""
    path = tmp_path / "_rewards.py"
    if not path.exists():
        shutil.copy(HERE / "_rewards.py", path)
    return [n if n.startswith("arithmetic") else f"{path}:{n}" for n in names]


def _train(tmp_path, model_dir, **kw):
    from grpokit.trainer import GRPOTrainer

    out = tmp_path / "run"
    cfg = build_config({**BASE, "model_name_or_path": model_dir, "output_dir": str(out), **kw})
    result = GRPOTrainer(cfg).train()
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    status = json.loads((out / "status.json").read_text())
    return result, [r for r in rows if "loss" in r], status


def _lines(caplog, key):
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith(f"health {key} ")
    ]


def _fired(status, key):
    return [e for e in status["health"]["events"] if e["alert"] == key and e["event"] == "fired"]


def _check_fired(caplog, rows, status, key, text, again=False):
    """The alert fired exactly once (``again``: at least once, and a later firing only after
    it cleared: a chaotic run may spike twice), its line says ``text``, and its metric is 1
    from the step it first fired at (0 before it ever fired: absent)."""
    lines = _lines(caplog, key)
    fired = _fired(status, key)
    events = [e["event"] for e in status["health"]["events"] if e["alert"] == key]
    if again:
        assert fired and all(a != b for a, b in zip(events, events[1:])), events
    else:
        assert len(fired) == 1, (key, status["health"]["events"])
    step = fired[0]["step"]
    assert lines[0] == fired[0]["line"] and lines[0].startswith(f"health {key} at step {step}: ")
    assert text in lines[0], lines[0]
    assert len([ln for ln in lines if ln.startswith(f"health {key} at step ")]) == len(fired)
    assert [r[f"health/{key}"] for r in rows if r["step"] == step + 1] in ([], [1.0])
    for r in rows:
        if r["step"] < step:
            assert f"health/{key}" not in r
        elif r["step"] == step and f"health/{key}" in r:  # an eval's alert: the next step's
            assert r[f"health/{key}"] == 1.0
    return step


def test_reward_that_never_fires(tmp_path, tiny_model_dir, caplog):
    """A reward that always returns 0: no learning signal, the reward never fires, and the
    loss is exactly 0, explained as expected (all advantages 0, beta 0)."""
    caplog.set_level(logging.WARNING, logger="grpokit")
    res, rows, status = _train(
        tmp_path, tiny_model_dir, reward_funcs=_rewards(tmp_path, "zero"), max_steps=12
    )
    assert all(r["frac_reward_zero_std"] == 1.0 and r["loss"] == 0.0 for r in rows)
    s = _check_fired(caplog, rows, status, "no_signal", "set dynamic_sampling: true")
    assert s == 5  # zero_std_steps
    s = _check_fired(caplog, rows, status, "reward_silent/zero", "zero never fired")
    assert s == 10  # reward_silent_steps
    s = _check_fired(caplog, rows, status, "zero_loss", "as expected here")
    assert s == 3
    assert set(status["health"]["active"]) >= {"no_signal", "reward_silent/zero", "zero_loss"}
    assert status["state"] == "finished" and not res["stopped"]  # warn: the run goes on


def test_truncation(tmp_path, ending_model_dir, caplog):
    """max_completion_length 4: the model's completions (~7 tokens on average) are cut off."""
    caplog.set_level(logging.WARNING, logger="grpokit")
    _, rows, status = _train(
        tmp_path, ending_model_dir, reward_funcs=_rewards(tmp_path, "short", "arithmetic_closeness"),
        max_completion_length=4, max_steps=4, do_eval=False,
    )  # fmt: skip
    first = [r["step"] for r in rows if r["completions/clipped_ratio"] > 0.5][:3]
    assert first == [1, 2, 3]  # each of the first 3 steps more than half truncated
    _check_fired(caplog, rows, status, "truncated", "raise max_completion_length")
    assert _fired(status, "truncated")[0]["step"] == 3


def test_entropy_collapse(tmp_path, tiny_model_dir, caplog):
    """A reward for one character at learning rate 5e-2: the policy collapses onto it."""
    caplog.set_level(logging.WARNING, logger="grpokit")
    _, rows, status = _train(
        tmp_path, tiny_model_dir, reward_funcs=_rewards(tmp_path, "sevens"),
        learning_rate=5e-2, max_steps=30, do_eval=False,
    )  # fmt: skip
    step = _check_fired(caplog, rows, status, "entropy_collapse", "raise temperature")
    start = sum(r["entropy"] for r in rows[:3]) / 3
    last3 = [r["entropy"] for r in rows if step - 3 < r["step"] <= step]
    assert all(e < start / 10 or e < 0.03 for e in last3), (start, last3)


def test_grad_norm_spike(tmp_path, ending_model_dir, caplog):
    """A reward whose scale jumps 10^4 times at step 7 (scale_rewards none): the gradient
    norm there is far above its running median."""
    caplog.set_level(logging.WARNING, logger="grpokit")
    _, rows, status = _train(
        tmp_path, ending_model_dir, reward_funcs=_rewards(tmp_path, "switch"),
        scale_rewards="none", learning_rate=1e-2, max_completion_length=24, max_steps=9,
        do_eval=False,
    )  # fmt: skip
    step = _check_fired(caplog, rows, status, "grad_norm_spike", "lower learning_rate")
    assert step == 7
    norms = [r["grad_norm"] for r in rows]
    assert norms[6] > 10 * sorted(norms[:6])[3]  # above 10x the median of the 6 before


def test_kl_spike(tmp_path, ending_model_dir, caplog):
    """beta 0.04 and a learning rate 100x too large (warming up): the KL to the reference
    leaps above 10x its running median."""
    caplog.set_level(logging.WARNING, logger="grpokit")
    _, rows, status = _train(
        tmp_path, ending_model_dir, reward_funcs=_rewards(tmp_path, "short", "arithmetic_closeness"),
        beta=0.04, learning_rate=0.1, lr_scheduler_type="linear", warmup_ratio=0.5,
        max_completion_length=24, max_steps=20, do_eval=False,
    )  # fmt: skip
    # again: with 2 threads this run spikes twice (steps 6 and 12, cleared at 9 and 14), with
    # 1 thread once: the float sums of the two differ and the learning rate makes it chaotic
    step = _check_fired(caplog, rows, status, "kl_spike", "raise beta", again=True)
    kl = [r["kl"] for r in rows]
    prev = sorted(kl[: step - 1][-20:])
    median = (prev[(len(prev) - 1) // 2] + prev[len(prev) // 2]) / 2
    assert kl[step - 1] > 10 * median and kl[step - 1] > 0.05


def test_zero_loss_not_expected(tmp_path, tiny_model_dir, caplog):
    """mask_truncated_completions with every completion truncated (2 tokens): rewards differ,
    yet no token carries a gradient, so the loss is exactly 0 and that is not expected."""
    caplog.set_level(logging.WARNING, logger="grpokit")
    _, rows, status = _train(
        tmp_path, tiny_model_dir, reward_funcs=_rewards(tmp_path, "short", "arithmetic_closeness"),
        mask_truncated_completions=True, max_completion_length=2, max_steps=4, do_eval=False,
    )  # fmt: skip
    assert all(r["loss"] == 0.0 and r["grad_norm"] == 0.0 for r in rows[:3])
    assert any(r["frac_reward_zero_std"] < 1.0 for r in rows[:3])
    _check_fired(caplog, rows, status, "zero_loss", "not expected")


def test_reward_hacking(tmp_path, tiny_model_dir, caplog):
    """A task graded 'correct' when the completion starts with a newline (the tiny model's
    greedy output) trained on a reward for '7's: the training reward rises while held-out
    accuracy falls from 100%."""
    from grpokit.tasks import register_task
    from grpokit.tasks.arithmetic import ArithmeticTask

    class NewlineFirst(ArithmeticTask):
        def is_correct(self, completion, row):
            return completion.startswith("\n")

    try:
        register_task("health_newline_first", NewlineFirst)
    except ValueError:
        pass  # registered by an earlier run of this test in the same process
    caplog.set_level(logging.WARNING, logger="grpokit")
    _, rows, status = _train(
        tmp_path, tiny_model_dir, task="health_newline_first",
        reward_funcs=_rewards(tmp_path, "sevens"), learning_rate=3e-2, max_steps=16,
        eval_steps=8,
    )  # fmt: skip
    step = _check_fired(caplog, rows, status, "reward_hacking", "may be gaming sevens")
    before = json.loads((tmp_path / "run" / "eval_before.json").read_text())["accuracy"]
    at = json.loads((tmp_path / "run" / f"eval_step-{step}.json").read_text())["accuracy"]
    assert at < before
    rewards = [r["reward"] for r in rows if r["step"] <= step]
    assert sum(rewards[-4:]) > sum(rewards[:4])


def test_stop_mode_through_the_cli(tmp_path, ending_model_dir, caplog, capsys):
    """health_checks: stop ends the run after the alert's round with a checkpoint, the line,
    status 'stopped' naming it, and exit code 4."""
    from grpokit.cli import main

    recipe = tmp_path / "r.yaml"
    out = tmp_path / "run"
    recipe.write_text(yaml.safe_dump({
        **BASE, "model_name_or_path": ending_model_dir, "output_dir": str(out),
        "reward_funcs": _rewards(tmp_path, "zero"), "max_steps": 12, "health_checks": "stop",
    }))  # fmt: skip
    caplog.set_level(logging.WARNING, logger="grpokit")
    assert main(["train", str(recipe)]) == 4
    lines = _lines(caplog, "zero_loss")
    assert (
        lines
        and "[health_checks: stop: saving a checkpoint and ending the run, exit code 4]" in lines[0]
    )
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] == 3
    assert status["health"]["stopped_by"].startswith("health zero_loss at step 3: ")
    assert (out / "checkpoint-3").is_dir()
    assert "stopped at step 3; checkpoint saved" in capsys.readouterr().out


def test_healthy_run_triggers_none(tmp_path, ending_model_dir, caplog):
    """Completions that end on their own, two rewards that vary, beta > 0, a modest learning
    rate, held-out evaluations: 30 steps and not one alert."""
    caplog.set_level(logging.WARNING, logger="grpokit")
    _, rows, status = _train(
        tmp_path, ending_model_dir, reward_funcs=_rewards(tmp_path, "short", "arithmetic_closeness"),
        beta=0.04, learning_rate=1e-4, max_completion_length=24, max_steps=30, eval_steps=10,
    )  # fmt: skip
    assert len(rows) == 30
    assert status["health"] == {"mode": "warn", "active": {}, "events": []}
    assert not [r for r in caplog.records if r.getMessage().startswith("health ")]
    assert not [k for r in rows for k in r if k.startswith("health/")]
    assert max(r["completions/clipped_ratio"] for r in rows) <= 0.5
    assert max(r["frac_reward_zero_std"] for r in rows) < 0.75


def test_off_says_nothing(tmp_path, tiny_model_dir, caplog):
    caplog.set_level(logging.WARNING, logger="grpokit")
    _, rows, status = _train(
        tmp_path, tiny_model_dir, reward_funcs=_rewards(tmp_path, "zero"), max_steps=6,
        health_checks=False, do_eval=False,  # YAML's bare `off`
    )  # fmt: skip
    assert "health" not in status
    assert not [r for r in caplog.records if r.getMessage().startswith("health ")]
    assert not [k for r in rows for k in r if k.startswith("health/")]


def test_resume_neither_repeats_nor_forgets(tmp_path, ending_model_dir, caplog):
    """The detectors' state is in the checkpoint: after --resume an alert that fired before
    does not fire again, and the silent-reward count goes on from where it was."""
    from grpokit.trainer import GRPOTrainer

    caplog.set_level(logging.WARNING, logger="grpokit")
    out = tmp_path / "run"
    values = {**BASE, "model_name_or_path": ending_model_dir, "output_dir": str(out),
              "reward_funcs": _rewards(tmp_path, "zero"), "do_eval": False}  # fmt: skip
    GRPOTrainer(build_config({**values, "max_steps": 6, "save_steps": 6})).train()
    assert [e["alert"] for e in json.loads((out / "status.json").read_text())["health"]["events"]] == [
        "zero_loss", "no_signal"
    ]  # fmt: skip
    caplog.clear()
    GRPOTrainer(build_config({**values, "max_steps": 12, "save_steps": 6}), resume=True).train()
    fired = [r.getMessage() for r in caplog.records if r.getMessage().startswith("health ")]
    assert len(fired) == 1 and fired[0].startswith("health reward_silent/zero at step 10: ")
    status = json.loads((out / "status.json").read_text())
    assert [e["alert"] for e in status["health"]["events"]] == [
        "zero_loss", "no_signal", "reward_silent/zero"
    ]  # fmt: skip
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("health/no_signal") for r in rows if "loss" in r][4:] == [1.0] * 8
