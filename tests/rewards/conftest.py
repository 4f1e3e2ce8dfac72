import pytest

from grpokit.rewards import get_reward_funcs


@pytest.fixture
def call():
    def _call(spec, completions, **cols):
        (fn,) = get_reward_funcs([spec])
        return fn(prompts=["p"] * len(completions), completions=completions, **cols)

    return _call
