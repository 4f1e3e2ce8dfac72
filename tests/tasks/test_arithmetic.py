"""arithmetic: seeded generation, held-out test, rewards and graders."""

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.rewards.arithmetic import (
    arithmetic_closeness,
    arithmetic_correct,
    arithmetic_format,
    arithmetic_tagged_closeness,
    final_answer,
)
from grpokit.tasks import TaskDataError, get_task


def test_deterministic_under_a_seed():
    a = get_task("arithmetic", seed=3, digits=2, train_size=50, test_size=10)
    b = get_task("arithmetic", seed=3, digits=2, train_size=50, test_size=10)
    c = get_task("arithmetic", seed=4, digits=2, train_size=50, test_size=10)
    assert a.build("train") == b.build("train") and a.build("test") == b.build("test")
    assert a.build("train") != c.build("train")


def test_test_is_distinct_and_never_trained_on():
    t = get_task("arithmetic", digits=1, train_size=500)  # 100 problems: 20 held out
    test, train = t.build("test"), t.build("train")
    assert len(test) == 20 and len({r["expression"] for r in test}) == 20
    assert len(train) == 500
    assert {r["expression"] for r in test}.isdisjoint(r["expression"] for r in train)


def test_rows_are_right():
    t = get_task(
        "arithmetic",
        ops=["+", "-", "*"],
        digits=[1, 3],
        num_operands=3,
        train_size=300,
        test_size=20,
    )
    rows = t.build("train")
    for r in rows:
        assert r["question"] == f"What is {r['expression']}?"
        assert r["answer"] == str(eval(r["expression"]))  # noqa: S307 (our own digits/ops)
        nums = [int(x) for x in r["expression"].split()[::2]]
        assert len(nums) == 3 and all(0 <= n <= 999 for n in nums)
    ops = {o for r in rows for o in r["expression"].split()[1::2]}
    assert ops == {"+", "-", "*"}
    one = get_task("arithmetic", digits=2, train_size=200, test_size=5).build("train")
    assert all(10 <= int(x) <= 99 for r in one for x in r["expression"].split()[::2])


@pytest.mark.parametrize(
    "params, match",
    [
        ({"ops": ["/"]}, "ops"),
        ({"digits": 0}, "digits"),
        ({"digits": [3, 2]}, "digits"),
        ({"num_operands": 1}, "num_operands"),
        ({"test_size": 60}, "only 100 distinct"),
        ({"question_template": "Solve it."}, "has no {question}"),
        ({"question_template": "{question} {answer}"}, "does not format"),
        ({"question_template": "{question} {"}, "does not format"),
    ],
)
def test_bad_params(params, match):
    with pytest.raises(TaskDataError, match=match):
        get_task("arithmetic", **params)


def test_question_template_shapes_the_user_message_only():
    plain = get_task("arithmetic", seed=1, digits=2, train_size=20, test_size=5)
    t = get_task(
        "arithmetic",
        seed=1,
        digits=2,
        train_size=20,
        test_size=5,
        question_template="{question} Put the number in <answer></answer>.",
    )
    for a, b in zip(plain.build("test"), t.build("test")):
        user = [m["content"] for m in b["prompt"] if m["role"] == "user"]
        assert user == [a["question"] + " Put the number in <answer></answer>."]
        assert b["prompt"][0] == a["prompt"][0]  # the system prompt is untouched
        assert {k: v for k, v in a.items() if k != "prompt"} == {
            k: v for k, v in b.items() if k != "prompt"
        }


def test_dataset_name_is_refused():
    with pytest.raises(TaskDataError, match="generates"):
        get_task("arithmetic", dataset_name="some/data")


@pytest.mark.parametrize(
    "text, value",
    [
        ("12 + 7 = 19", 19.0),
        ("<answer>19</answer> and then 3", 19.0),
        ("<answer> $1,019. </answer>", 1019.0),
        ("<answer>the sum is 19</answer>", None),  # a tag must hold just a number
        ("<answer>1</answer> no, <answer>-4</answer>", -4.0),
        ("<answer>none</answer> 5", None),  # a tag without a number: no fallback
        ("1,234", 1234.0),
        ("nothing", None),
        ("<answer>5", 5.0),  # unclosed: the last number
        ("<answer>\n7\n</answer>", 7.0),
    ],
)
def test_final_answer(text, value):
    assert final_answer(text) == value


TEXTS = [
    "<answer>19</answer>",
    "19",
    "<answer>20</answer>",
    "x",
    "<answer>19</answer><answer>19</answer>",
    "<answer>it is 19</answer>",
    "<answer>19",
    "<answer>19</answer>\n",
    "<answer>19</answer> done",
    "3 + 16 = 19.",
    "<answer>-19</answer>",
    "<answer>1,9</answer>",  # not a thousands group: not one number
    [{"role": "assistant", "content": "so 19"}],
]


def _r(fn, texts, gold="19"):
    return fn(prompts=[None] * len(texts), completions=texts, answer=[gold] * len(texts))


def test_rewards_exact_values():
    assert _r(arithmetic_correct, TEXTS) == [1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 0, 0, 1]
    assert _r(arithmetic_format, TEXTS) == [1, 0, 1, 0, 0.5, 0, 0, 1, 0.5, 0, 1, 0, 0]
    close = _r(arithmetic_closeness, TEXTS)
    assert close[0] == 1.0 and close[3] == 0.0 and close[5] == 0.0
    assert close[2] == pytest.approx(1 / (1 + 10 / 19))
    assert close[10] == pytest.approx(1 / 21)
    assert _r(arithmetic_closeness, ["3"], gold="0") == [pytest.approx(1 / 31)]
    assert _r(arithmetic_closeness, ["-1"], gold="1") == [pytest.approx(1 / 21)]


def test_tagged_closeness_is_format_credit_scaled_by_closeness():
    got = _r(arithmetic_tagged_closeness, TEXTS)
    assert got[0] == 1.0 and got[1] == 0.0 and got[4] == 0.5 and got[8] == 0.5
    assert got[2] == pytest.approx(1 / (1 + 10 / 19))
    assert got[10] == pytest.approx(1 / 21)
    # right working, then the prompt's example tag copied: full format credit, but the tag
    # holds 7, not 19, so the product is small
    copied = _r(arithmetic_tagged_closeness, ["3 + 16 = 19 <answer>7</answer>"])[0]
    assert copied == pytest.approx(1 / (1 + 10 * 12 / 19))
    # positive exactly where the format reward (and so the held-out format rate) is
    fmt = _r(arithmetic_format, TEXTS)
    assert [g > 0 for g in got] == [f > 0 for f in fmt]
    assert _r(arithmetic_tagged_closeness, ["<answer>3</answer>"], gold="n/a") == [None]


def test_the_recipe_gets_the_graders_own_functions():
    """One copy: the names a recipe lists resolve to the functions the task grades with."""
    t = get_task("arithmetic")
    funcs = get_reward_funcs(list(t.default_reward_funcs))
    assert len(funcs) == len(t.default_reward_weights) == 3
    assert funcs == [arithmetic_correct, arithmetic_closeness, arithmetic_format]


def test_a_gold_that_is_not_a_number_does_not_apply():
    assert _r(arithmetic_correct, ["19"], gold="nineteen") == [None]
    assert _r(arithmetic_closeness, ["19"], gold="inf") == [None]
    assert not get_task("arithmetic").is_correct("19", {"answer": "nan"})


# (text, gold, correct, formatted): the awkward inputs, read by the one number reader
AWKWARD = [
    ("so the result is .5", "0.5", True, False),
    ("<answer>.5</answer>", "0.5", True, True),
    ("it is -.25", "-0.25", True, False),
    ("<answer>-.25</answer>", "-0.25", True, True),
    ("<answer>inf</answer>", "1", False, False),  # a word is not a number
    ("the answer is inf", "1", False, False),
    ("<answer>nan</answer>", "0", False, False),
    ("<answer>1_000</answer>", "1000", False, False),  # not how numbers are written
    ("the answer is 1_000", "1000", False, False),
    ("the answer is 1_000", "0", False, False),  # ... and not the number 000 either
    ("<answer>1,234</answer>", "1234", True, True),
    ("the answer is 1,234", "1234", True, False),
    ("<answer>1,9</answer>", "19", False, False),  # not a thousands group
    ("<answer>$5</answer>", "5", True, True),
    ("that costs $5", "5", True, False),
]


@pytest.mark.parametrize("text, gold, correct, formatted", AWKWARD)
def test_task_and_rewards_agree_on_awkward_inputs(text, gold, correct, formatted):
    t, row = get_task("arithmetic"), {"answer": gold}
    assert t.is_correct(text, row) is correct
    assert t.is_formatted(text) is formatted
    funcs = get_reward_funcs(list(t.default_reward_funcs))  # what the recipe trains on
    rc, rclose, rfmt = (f(prompts=[None], completions=[text], answer=[gold])[0] for f in funcs)
    assert rc == (1.0 if correct else 0.0)
    assert (rfmt > 0) is formatted
    assert (rclose == 1.0) is correct


def test_graders():
    t = get_task("arithmetic")
    row = {"answer": "19"}
    assert t.is_correct("I think 19", row) and t.is_correct("<answer>19.0</answer>", row)
    assert t.is_correct("<answer>19</answer> wait, 20", row)  # the tag wins
    assert not t.is_correct("19 or 20", row)
    for text in TEXTS[:-1]:
        assert t.is_correct(text, row) is (_r(arithmetic_correct, [text])[0] == 1.0)
        assert t.is_formatted(text) is (_r(arithmetic_format, [text])[0] > 0)
    assert t.is_formatted("<answer> 19 </answer>") and t.is_formatted("<answer>19</answer> x")
    assert not t.is_formatted("<answer>x 3</answer>") and not t.is_formatted("19")


def test_data_seed_fixes_the_held_out_set_across_training_seeds():
    """Runs with different training seeds compare on one held-out set when data_seed is set;
    without it (transformers' default) the data follows seed."""
    from grpokit.config import build_config
    from grpokit.setup import build_task

    def held_out(**kw):
        cfg = build_config({"task": "arithmetic", **kw})
        return [r["question"] for r in build_task(cfg).load_rows("test")]

    assert held_out(seed=0, data_seed=42) == held_out(seed=1, data_seed=42) == held_out(seed=42)
    assert held_out(seed=0) != held_out(seed=1)


def test_demonstrations_go_between_the_system_prompt_and_the_question():
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 * 3"}}}  # fmt: skip
    demo = [
        {"role": "user", "content": "What is 2 * 3?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": "6"},
        {"role": "assistant", "content": "<answer>6</answer>"},
    ]
    task = get_task("arithmetic", seed=0, digits=2, demonstrations=demo, system_prompt="S")
    plain = get_task("arithmetic", seed=0, digits=2, system_prompt="S")
    for row, ref in zip(task.build("test", limit=3), plain.build("test", limit=3)):
        assert row["prompt"][0] == {"role": "system", "content": "S"}
        assert row["prompt"][1:5] == demo
        assert row["prompt"][5] == {"role": "user", "content": ref["question"]}
        assert row["prompt"] == [ref["prompt"][0], *demo, ref["prompt"][1]]
    row["prompt"][1]["content"] = "changed"  # a row's messages are its own
    assert task.build("test", limit=1)[0]["prompt"][1]["content"] == "What is 2 * 3?"


@pytest.mark.parametrize(
    "demo",
    ["What is 2 * 3?", [{"role": "bot", "content": "x"}], [{"role": "user"}],
     [{"role": "tool", "tool_calls": [{}]}], ["hello"]],
)  # fmt: skip
def test_bad_demonstrations_are_refused_in_one_line(demo):
    with pytest.raises(TaskDataError, match="demonstrations"):
        get_task("arithmetic", seed=0, demonstrations=demo)


def test_a_demonstrated_problem_is_never_drawn():
    """Its worked answer is in every prompt, so it is in neither the held-out nor the train split."""
    plain = get_task("arithmetic", seed=3, digits=1, train_size=300, test_size=20)
    test_q = plain.build("test")[0]["question"]
    train_q = next(r["question"] for r in plain.build("train") if r["question"] != test_q)
    demo = []
    for q in (test_q, train_q):
        demo += [{"role": "user", "content": q}, {"role": "assistant", "content": "<answer>0</answer>"}]  # fmt: skip
    task = get_task("arithmetic", seed=3, digits=1, train_size=300, test_size=20, demonstrations=demo)  # fmt: skip
    test, train = [r["question"] for r in task.build("test")], [r["question"] for r in task.build("train")]  # fmt: skip
    assert len(test) == 20 and len(train) == 300
    assert test_q not in test and test_q not in train and train_q not in train
    assert [q for q in (r["question"] for r in plain.build("test")) if q != test_q] == test[:19]
