"""advantage_estimator's values and the combinations the config refuses, one line each."""

import pytest

from grpokit.config import ConfigError, build_config

RFPP = "reinforce_plus_plus_baseline"


def test_reinforce_plus_plus_baseline_with_batch_scaling():
    c = build_config({"advantage_estimator": RFPP, "scale_rewards": "batch"})
    assert c.advantage_estimator == RFPP and c.scale_rewards_mode == "batch"
    # a group of one is REINFORCE++ without a baseline: allowed with this estimator only
    c = build_config({"advantage_estimator": RFPP, "scale_rewards": "batch", "num_generations": 1})
    assert c.num_generations == 1
    # left unset, scale_rewards is the estimator's own batch whitening (verl's users set only
    # the estimator); set to anything else it is refused below
    assert build_config({"advantage_estimator": RFPP}).scale_rewards_mode == "batch"


@pytest.mark.parametrize(
    "values,match",
    [
        ({"advantage_estimator": "ppo"}, r"advantage_estimator='ppo': use one of .*" + RFPP),
        ({"advantage_estimator": RFPP, "scale_rewards": "group"}, "batch \\(not 'group'\\)"),
        ({"advantage_estimator": RFPP, "scale_rewards": "none"}, "set scale_rewards: batch"),
        ({"advantage_estimator": RFPP, "scale_rewards": False}, "set scale_rewards: batch"),
        (
            {"advantage_estimator": RFPP, "scale_rewards": "batch",
             "multi_objective_aggregation": "normalize_then_sum"},
            f"advantage_estimator {RFPP} needs multi_objective_aggregation: sum_then_normalize",
        ),
        (
            {"advantage_estimator": "rloo", "multi_objective_aggregation": "normalize_then_sum"},
            "advantage_estimator rloo needs multi_objective_aggregation: sum_then_normalize",
        ),
        ({"num_generations": 1}, "use num_generations >= 2"),
        (
            {"advantage_estimator": RFPP, "scale_rewards": "batch", "num_generations": 1,
             "dynamic_sampling": True},
            "dynamic_sampling keeps groups whose rewards differ",
        ),
    ],
)  # fmt: skip
def test_refused_in_one_line(values, match):
    with pytest.raises(ConfigError, match=match) as e:
        build_config(values)
    assert "\n" not in str(e.value)
