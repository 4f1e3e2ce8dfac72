"""No built-in raises or returns a non-finite number, whatever the text and completion form."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpokit.rewards import get_reward_funcs, registered_rewards
from grpokit.rewards.registry import lookup

BUILTINS = [
    n for n in registered_rewards() if lookup(n)[0].__module__.startswith("grpokit.rewards")
]
MATH_VERIFY = {"accuracy", "length", "cosine"}
SANDBOX = {"code", "binary_code", "ioi_code"}  # run programs: tested in tests/sandbox, test_ioi.py
FUNCS = {n: get_reward_funcs([n])[0] for n in BUILTINS}

TAGGY = st.sampled_from(
    [
        "<think>\n",
        "\n</think>\n",
        "<answer>",
        "</answer>",
        "\n<answer>\n",
        "\n</answer>",
        "<reasoning>",
        "</reasoning>",
        "Step 1:",
        "=",
        "(",
        ")",
        "*",
        "**",
        "/",
        "0",
        "1e999",
        "9" * 50,
        r"\boxed{",
        "}",
        "$",
        "```python",
        "```",
        "\n",
        " ",
        "é",
        "🤔",
        "\x00",
    ]
)
TEXT = st.one_of(st.text(max_size=200), st.lists(TAGGY, max_size=20).map("".join))
PART = st.one_of(
    st.none(),
    TEXT,
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2),
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["assistant", "user", "tool"]), "content": PART}
)
COMPLETION = st.one_of(TEXT, st.lists(MESSAGE, max_size=3), MESSAGE)
GOLD = st.one_of(TEXT, st.integers(), st.none())


def _cols(n, gold, nums, target, n_ids):
    return dict(
        answer=[gold] * n,
        solution=[gold] * n,
        nums=[nums] * n,
        target=[target] * n,
        completion_ids=[[0] * n_ids] * n,
    )


def _check(names, comps, cols):
    for name in names:
        values = FUNCS[name](prompts=["p"] * len(comps), completions=comps, **cols)
        assert len(values) == len(comps), name
        for v in values:
            assert v is None or (isinstance(v, float) and math.isfinite(v)), (name, v)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    comps=st.lists(COMPLETION, min_size=1, max_size=4),
    gold=GOLD,
    nums=st.lists(st.integers(-5, 10**30), max_size=4),
    target=st.one_of(st.integers(), st.floats(allow_nan=True)),
    n_ids=st.integers(0, 20000),
)
def test_cheap_builtins_never_raise_nor_return_nonfinite(comps, gold, nums, target, n_ids):
    _check(
        [n for n in BUILTINS if n not in MATH_VERIFY | SANDBOX],
        comps,
        _cols(len(comps), gold, nums, target, n_ids),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comps=st.lists(COMPLETION, min_size=1, max_size=4), gold=GOLD)
def test_math_verify_builtins_never_raise_nor_return_nonfinite(comps, gold):
    _check(sorted(MATH_VERIFY), comps, _cols(len(comps), gold, [], 0, 0))
