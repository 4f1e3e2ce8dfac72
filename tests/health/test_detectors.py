"""The detectors of grpokit.health on synthetic metric sequences: each fires when its
condition has held long enough, not otherwise, once per episode, and clears."""

import json
import math

import pytest

from grpokit.health import HEALTH_DEFAULTS, HealthMonitor, check_params, health_mode


def feed(rows, settings=None, params=None, monitor=None):
    """Feed ``rows`` (step i+1 each) and return [(step, key, fired)] and the monitor."""
    h = monitor or HealthMonitor(settings or {"num_generations": 8}, params)
    events = []
    for i, m in enumerate(rows):
        if "eval" in m:
            events += h.observe_eval(m["step"], m["eval"])
            continue
        events += h.observe(m.get("step", i + 1), m)
    return [(e.step, e.key, e.fired) for e in events], h


def only(events, key):
    return [(s, f) for s, k, f in events if k == key]


# ------------------------------------------------------------------ no_signal
def test_no_signal_fires_after_five_steps_once_and_clears():
    fracs = [0.25] * 3 + [1.0] * 7 + [0.25] * 2
    ev, h = feed([{"frac_reward_zero_std": f} for f in fracs])
    assert only(ev, "no_signal") == [(8, True), (12, False)]  # 5 in a row: steps 4-8
    assert h.metrics() == {"health/no_signal": 0.0}


def test_no_signal_needs_five_in_a_row():
    fracs = [1.0] * 4 + [0.5] + [1.0] * 4 + [0.74]
    ev, h = feed([{"frac_reward_zero_std": f} for f in fracs])
    assert ev == [] and h.metrics() == {}


def test_no_signal_line_quotes_the_metric_and_the_fixes():
    ev, h = feed([{"frac_reward_zero_std": 0.75, "accuracy": 0.0, "reward": 0.1}] * 5)
    line = h.active["no_signal"]
    assert line.startswith("health no_signal at step 5: frac_reward_zero_std >= 0.75")
    for word in ("num_generations", "dynamic_sampling: true", "train accuracy 0%"):
        assert word in line


# ------------------------------------------------------------------ truncated
def test_truncated_more_than_half_for_three_steps():
    ev, h = feed([{"completions/clipped_ratio": c} for c in [0.6, 0.6, 0.6, 0.2, 0.3]])
    assert only(ev, "truncated") == [(3, True), (5, False)]
    ev, _ = feed([{"completions/clipped_ratio": c} for c in [0.6, 0.6, 0.5, 0.6, 0.6]])
    assert ev == []  # exactly half is not more than half


def test_truncated_line_names_max_completion_length():
    _, h = feed([{"completions/clipped_ratio": 1.0}] * 3, {"max_completion_length": 64})
    assert "max_completion_length (64)" in h.active["truncated"]
    assert "100% of completions" in h.active["truncated"]


# ------------------------------------------------------------------ entropy
def test_entropy_collapse_relative_to_its_start_with_hysteresis():
    ent = [2.0, 2.0, 2.0] + [0.19] * 3 + [0.3] * 3 + [0.5, 0.5]
    ev, _ = feed([{"entropy": e} for e in ent])
    # threshold 2.0 / 10 = 0.2: fires after 3 steps below it; 0.3 is between the threshold
    # and twice it (undecided); 0.5 twice clears
    assert only(ev, "entropy_collapse") == [(6, True), (11, False)]


def test_low_entropy_is_collapse_only_where_the_unsolved_groups_agree():
    # the default recipe's healthy run: entropy 0.05 from step 4, yet of the groups not all
    # correct few have equal rewards (measured on its checkpoints: 5-14%)
    ent = [0.8] * 3 + [0.05] * 6
    healthy = {"sampled/solved_groups": 0.48, "sampled/stuck_groups": 0.023}
    ev, _ = feed([{"entropy": e, **healthy} for e in ent])
    assert only(ev, "entropy_collapse") == []
    # the same entropy with 60% of the unsolved groups agreeing: collapse, and the line says so
    stuck = {"sampled/solved_groups": 0.5, "sampled/stuck_groups": 0.3, "sampled/accuracy": 0.6}
    ev, h = feed([{"entropy": e, **stuck} for e in ent])
    assert only(ev, "entropy_collapse") == [(6, True)]
    assert (
        "60% of the sampled groups not yet solved have equal rewards"
        in h.active["entropy_collapse"]
    )
    # it clears once the unsolved groups differ again (two good steps)
    ev, _ = feed([{"entropy": e, **stuck} for e in ent] + [{"entropy": 0.05, **healthy}] * 2)
    assert only(ev, "entropy_collapse") == [(6, True), (11, False)]
    _, h = feed([{"entropy": e, **stuck} for e in ent], params={"stuck_share": 0.7})
    assert "entropy_collapse" not in h.active
    # dynamic sampling trains without the solved groups: "solved" is judged on what it sampled
    solved = {"accuracy": 0.5, "sampled/accuracy": 0.97, "sampled/solved_groups": 0.9,
              "sampled/stuck_groups": 0.1}  # fmt: skip
    _, h = feed([{"entropy": e, **solved} for e in ent])
    assert "train accuracy 97%" in h.active["entropy_collapse"]


def test_entropy_absolute_floor_and_no_alert_above():
    ev, _ = feed([{"entropy": e} for e in [0.1] * 3 + [0.02] * 3])
    assert only(ev, "entropy_collapse") == [(6, True)]
    ev, _ = feed([{"entropy": e} for e in [2.0] * 3 + [0.25] * 10])
    assert ev == []


def test_a_solved_task_is_called_solved_not_collapsed():
    # the calculator run: every training prompt right from step 6, entropy ~0.005
    rows = [{"entropy": e, "accuracy": a, "frac_reward_zero_std": f}
            for e, a, f in [(0.9, 0.44, 0.0), (0.3, 0.88, 0.0), (0.2, 0.81, 0.0)]
            + [(0.005, 1.0, 1.0)] * 5]  # fmt: skip
    ev, h = feed(rows)
    assert only(ev, "entropy_collapse") == [(6, True)] and only(ev, "no_signal") == [(8, True)]
    for key in ("entropy_collapse", "no_signal"):
        line = h.active[key]
        assert "solves the training prompts" in line and "train accuracy 100%" in line
        assert "stop here (max_steps) or draw harder problems" in line
        assert "temperature" not in line and "raise num_generations" not in line
    # below solved_accuracy the advice is the exploring one
    rows = [{**r, "accuracy": 0.5} for r in rows]
    _, h = feed(rows)
    assert "raise temperature" in h.active["entropy_collapse"]
    assert "raise num_generations" in h.active["no_signal"]
    _, h = feed(rows, params={"solved_accuracy": 0.5})
    assert "solves the training prompts" in h.active["entropy_collapse"]


def test_a_template_right_on_one_steps_prompts_is_not_called_solved():
    # mini Countdown with half its targets sums: a policy that always adds is right on both
    # of a step's 2 prompts on some steps and on one on others; the step it fires at is 100%
    accs = [0.1, 0.3, 0.5, 0.5, 1.0, 0.5, 1.0]
    rows = [
        {"entropy": e, "accuracy": a}
        for e, a in zip([1.0, 0.9, 0.6, 0.1, 0.004, 0.005, 0.004], accs)
    ]
    ev, h = feed(rows)
    assert only(ev, "entropy_collapse") == [(7, True)]
    line = h.active["entropy_collapse"]
    assert "solves the training prompts" not in line and "raise temperature" in line
    # all three steps the alert looked at solved: said so, with the window it averaged
    ev, h = feed([{**r, "accuracy": 1.0} if i >= 4 else r for i, r in enumerate(rows)])
    assert "train accuracy 100% over the last 3 steps" in h.active["entropy_collapse"]


# ------------------------------------------------------------------ spikes
def test_grad_norm_spike_against_running_median():
    ev, h = feed([{"grad_norm": g} for g in [1.0, 1.2, 0.8, 1.0, 1.1, 11.5, 1.0, 1.0]])
    assert only(ev, "grad_norm_spike") == [(6, True), (8, False)]
    assert "11.5 is 11.5x its running median 1" in h.events[0]["line"]
    ev, _ = feed([{"grad_norm": g} for g in [1.0] * 5 + [9.9]])
    assert ev == []
    ev, _ = feed([{"grad_norm": g} for g in [1.0] * 4 + [100.0]])
    assert ev == []  # fewer than 5 earlier values: no median to trust yet


def test_grad_norm_median_is_over_the_window():
    rows = [{"grad_norm": 100.0}] * 5 + [{"grad_norm": 1.0}] * 20 + [{"grad_norm": 11.0}]
    ev, _ = feed(rows)
    assert only(ev, "grad_norm_spike") == [(26, True)]  # the 100s left the 20-step window


def test_kl_spike_only_with_beta_and_above_the_floor():
    kl = [0.01, 0.012, 0.009, 0.011, 0.01, 0.2]
    ev, _ = feed([{"kl": v} for v in kl], {"beta": 0.04})
    assert only(ev, "kl_spike") == [(6, True)]
    ev, _ = feed([{"kl": v} for v in kl], {"beta": 0.0})
    assert ev == []
    ev, _ = feed([{"kl": v / 10} for v in kl], {"beta": 0.04})
    assert ev == []  # 0.02: 20x the median but under kl_floor 0.05


# ------------------------------------------------------------------ zero loss
@pytest.mark.parametrize(
    "row,beta,text",
    [
        ({"frac_reward_zero_std": 1.0, "grad_norm": 0.0}, 0.0, "as expected here"),
        ({"frac_reward_zero_std": 1.0, "grad_norm": 0.0, "accuracy": 1.0}, 0.0, "solves every"),
        ({"frac_reward_zero_std": 1.0, "grad_norm": 0.0, "accuracy": 0.0}, 0.0, "see no_signal"),
        ({"frac_reward_zero_std": 0.5, "grad_norm": 0.7}, 0.0, "the update is real"),
        ({"frac_reward_zero_std": 0.5, "grad_norm": 0.0}, 0.0, "not expected"),
        ({"frac_reward_zero_std": 1.0, "grad_norm": 0.0}, 0.04, "not expected"),
    ],
)
def test_zero_loss_says_whether_it_is_expected(row, beta, text):
    ev, h = feed([{"loss": 0.0, **row}] * 3, {"beta": beta})
    assert only(ev, "zero_loss") == [(3, True)]
    assert text in h.active["zero_loss"]


def test_zero_loss_needs_three_exact_zeros():
    ev, _ = feed([{"loss": v} for v in [0.0, 0.0, 1e-9, 0.0, 0.0]])
    assert ev == []


# ------------------------------------------------------------------ silent rewards
def _rew(name, mean, std):
    return {f"rewards/{name}/mean": mean, f"rewards/{name}/std": std}


@pytest.mark.parametrize(
    "mean,std,text",
    [
        (0.0, 0.0, "never fired: it returned 0"),
        (0.5, 0.0, "returned the same value (0.5)"),
        (None, None, "returned None (no score)"),
    ],
)
def test_reward_silent_over_the_first_ten_steps(mean, std, text):
    ev, h = feed([_rew("fmt", mean, std)] * 12)
    assert only(ev, "reward_silent/fmt") == [(10, True)]
    assert text in h.active["reward_silent/fmt"]
    assert "reward function fmt " in h.active["reward_silent/fmt"]


def test_reward_that_varies_never_alerts_and_a_late_one_clears():
    rows = [_rew("a", 0.0, 0.0)] * 3 + [_rew("a", 0.1, 0.3)] + [_rew("a", 0.0, 0.0)] * 10
    ev, _ = feed(rows)
    assert ev == []
    rows = [_rew("b", 0.0, 0.0)] * 10 + [_rew("b", 0.2, 0.4)] * 2
    ev, _ = feed(rows)
    assert only(ev, "reward_silent/b") == [(10, True), (12, False)]


def test_reward_constant_per_step_but_moving_between_steps_is_not_silent():
    ev, _ = feed([_rew("c", float(i % 2), 0.0) for i in range(12)])
    assert ev == []


# ------------------------------------------------------------------ reward hacking
def _interval(start, n, r0, r1, per=None):
    rows = []
    for i in range(n):
        r = r0 + (r1 - r0) * i / (n - 1)
        rows.append({"step": start + i, "reward": r, "rewards/good/mean": 0.5,
                     "rewards/good/std": 0.2, "rewards/cheat/mean": r})  # fmt: skip
    return rows


def _eval(step, acc, n=200):
    return {"step": step, "eval": {"accuracy": acc, "num_prompts": n, "num_samples": 1}}


def test_reward_hacking_fires_naming_the_rising_reward_and_clears_on_recovery():
    rows = [_eval(0, 0.8)] + _interval(1, 10, 0.1, 1.0) + [_eval(10, 0.5)]
    rows += _interval(11, 10, 1.0, 1.0) + [_eval(20, 0.5)]  # no change: stays active
    rows += _interval(21, 10, 1.0, 0.9) + [_eval(30, 0.7)]  # recovered: clears
    ev, h = feed(rows)
    assert only(ev, "reward_hacking") == [(10, True), (30, False)]
    line = h.events[0]["line"]
    assert "held-out accuracy fell 80.0% -> 50.0% (steps 0 -> 10)" in line
    assert "gaming cheat +" in line and "good" not in line


def test_reward_hacking_ignores_noise_and_falling_reward():
    # 0.80 -> 0.78 on 200 prompts: 2 standard errors of the difference are ~0.08
    ev, _ = feed([_eval(0, 0.8)] + _interval(1, 10, 0.1, 1.0) + [_eval(10, 0.78)])
    assert ev == []
    ev, _ = feed([_eval(0, 0.8)] + _interval(1, 10, 1.0, 0.1) + [_eval(10, 0.3)])
    assert ev == []  # the reward fell too: the run is getting worse, not hacking


def test_threshold_two_standard_errors():
    p0, p1, n = 0.5, 0.4, 50
    two_se = 2 * math.sqrt(p0 * (1 - p0) / n + p1 * (1 - p1) / n)
    assert p0 - p1 < two_se  # so this drop is noise
    ev, _ = feed([_eval(0, p0, n)] + _interval(1, 6, 0.0, 1.0) + [_eval(6, p1, n)])
    assert ev == []
    ev, _ = feed([_eval(0, p0, 4 * n)] + _interval(1, 6, 0.0, 1.0) + [_eval(6, p1, 4 * n)])
    assert only(ev, "reward_hacking") == [(6, True)]  # the same drop on 200 prompts is not


# ------------------------------------------------------------------ plumbing
def test_state_survives_a_json_checkpoint():
    rows = [{"frac_reward_zero_std": 1.0, "grad_norm": 1.0, "entropy": 2.0,
             **_rew("z", 0.0, 0.0)}] * 14  # fmt: skip
    whole, _ = feed(rows)
    first, h1 = feed(rows[:7])
    h2 = HealthMonitor({"num_generations": 8})
    h2.load_state_dict(json.loads(json.dumps(h1.state_dict())))
    second, _ = feed([{**r, "step": 8 + i} for i, r in enumerate(rows[7:])], monitor=h2)
    assert first + second == whole
    assert [k for _, k, _ in whole] == ["no_signal", "reward_silent/z"]


def test_tensor_values_are_read():
    torch = pytest.importorskip("torch")
    ev, _ = feed([{"completions/clipped_ratio": torch.tensor(0.9)}] * 3)
    assert only(ev, "truncated") == [(3, True)]


def test_params_override_and_are_checked():
    ev, _ = feed([{"completions/clipped_ratio": 0.6}] * 3, params={"clipped_ratio": 0.7})
    assert ev == []
    assert check_params({"clipped_ratio": 0.7}) is None
    assert "unknown key 'clip_ratio'" in check_params({"clip_ratio": 0.7})
    assert "must be a number > 0" in check_params({"spike_factor": "big"})
    assert set(HEALTH_DEFAULTS) >= {"frac_reward_zero_std", "clipped_ratio"}
    assert health_mode(False) == "off" and health_mode(True) == "warn"
    assert health_mode("stop") == "stop"


def test_entropy_bad_steps_must_be_consecutive():
    # the default recipe's seed 0 (candidate recipe, 2026-11-24): entropy hovering around the
    # threshold (0.0573 = 0.573 / 10); the steps between it and twice it end a bad streak
    start = [0.586, 0.849, 0.285]
    ent = start + [0.04, 0.079, 0.083, 0.054, 0.082, 0.069, 0.041, 0.077, 0.05]
    ev, _ = feed([{"entropy": e} for e in ent])
    assert only(ev, "entropy_collapse") == []
    ev, h = feed([{"entropy": e} for e in start + [0.04, 0.05, 0.041, 0.079, 0.2, 0.2]])
    assert only(ev, "entropy_collapse") == [(6, True), (9, False)]  # 0.079: neither


def test_entropy_advice_names_the_bonus_the_run_already_has():
    # the default recipe's seed 0 of 2026-11-25: entropy ~0.05-0.06 with the adaptive bonus
    # at its 0.05 cap, so "add an entropy bonus" would be wrong advice
    rows = [{"entropy": e, "entropy_coef": c, "frac_reward_zero_std": 0.25}
            for e, c in [(0.59, 0), (0.97, 0), (0.6, 0), (0.061, 0.05), (0.052, 0.05), (0.055, 0.05)]]  # fmt: skip
    adaptive = {"use_adaptive_entropy": True, "entropy_coef_max": 0.05}
    _, h = feed(rows, settings=adaptive)
    line = h.active["entropy_collapse"]
    assert "at its cap (entropy_coef 0.05 = entropy_coef_max)" in line
    assert "raise entropy_coef_max or entropy_target" in line
    assert "25% of this step's groups have equal rewards" in line
    below_cap = [{**r, "entropy_coef": 0.02} for r in rows]
    line = feed(below_cap, settings=adaptive)[1].active["entropy_collapse"]
    assert "still rising towards entropy_target" in line and "entropy_coef 0.02" in line
    line = feed(rows, settings={"entropy_coef": 0.01})[1].active["entropy_collapse"]
    assert "raise the entropy bonus (entropy_coef, now 0.01)" in line
    line = feed([{"entropy": r["entropy"]} for r in rows])[1].active["entropy_collapse"]
    assert "add an entropy bonus (entropy_coef, or use_adaptive_entropy: true)" in line
    assert "groups have equal rewards" not in line
    dyn = [{**r, "frac_reward_zero_std": 0.0, "dynamic_sampling/dropped_frac": 0.25} for r in rows]
    line = feed(dyn, settings=adaptive)[1].active["entropy_collapse"]
    assert "25% of the sampled groups had equal rewards and were dropped" in line
