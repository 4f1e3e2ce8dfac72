"""Exact values of every built-in reward, awkward inputs included."""

import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpokit.rewards import get_reward_funcs, registered_rewards


def call(spec, completions, **cols):
    (fn,) = get_reward_funcs([spec])
    return fn(prompts=["p"] * len(completions), completions=completions, **cols)


def msg(text):
    return [{"role": "assistant", "content": text}]


# --------------------------------------------------------------- GRPO-from-scratch tutorial
@pytest.mark.parametrize(
    "text,gold,expected",
    [
        ("<reasoning>x</reasoning><answer>72</answer>", "72", 2.0),
        ("<answer> 72 </answer>", "72", 2.0),  # stripped
        ("<answer>72.0</answer>", "72", 1.5),  # same single number
        ("<answer>1,000</answer>", "1000", 1.5),
        ("<answer>7</answer> then <answer>72</answer>", "72", 2.0),  # the last answer counts
        ("<answer>72</answer> then <answer>7</answer>", "72", 0.0),
        ("72", "72", 0.0),  # no tags
        ("", "72", 0.0),
        ("<answer>seventy-two</answer>", "72", 0.0),
        ("<answer>" + "9" * 400 + "</answer>", "72", 0.0),  # huge number
        ("<answer>٧٢</answer>", "72", 1.5),  # Arabic-Indic digits: the same number
    ],
)
def test_correctness(text, gold, expected):
    assert call("correctness", [text], answer=[gold]) == [expected]
    assert call("correctness", [msg(text)], answer=[gold]) == [expected]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<reasoning>\nr\n</reasoning>\n<answer>\n1\n</answer>", 0.8),
        ("</answer><answer></reasoning><reasoning>", 0.8),  # any order: each tag present
        ("<answer>1</answer>", 0.4),
        ("", 0.0),
        ("<reasoning>", 0.2),
    ],
)
def test_xml_format(text, expected):
    assert call("xml_format", [text]) == [pytest.approx(expected)]


# --------------------------------------------------------------- open-r1
GOOD = "<think>\nreason\n</think>\n<answer>\n42\n</answer>"


@pytest.mark.parametrize(
    "text,expected",
    [
        (GOOD, 1.0),
        # open-r1 matches with re.MULTILINE, so "$" also matches before a later newline:
        ("<think>\nr\n</think>\n<answer>\n42\n</answer>\nmore", 1.0),
        ("<think>\nr\n</think>\n<answer>\n42\n</answer> more", 0.0),
        ("<think>r</think><answer>42</answer>", 0.0),  # newlines required
        ("<answer>\n42\n</answer>\n<think>\nr\n</think>", 0.0),  # wrong order
        ("", 0.0),
    ],
)
def test_format(text, expected):
    assert call("format", [text]) == [expected]


@pytest.mark.parametrize(
    "text,expected",
    [
        (GOOD, 1.0),
        ("<think>\nr\n</think>\n", 0.5),
        ("<think>\n<think>\n", 0.0),  # twice is not once
        ("\n<answer>\n42\n</answer>", 0.5),
        ("", 0.0),
    ],
)
def test_tag_count(text, expected):
    assert call("tag_count", [text]) == [expected]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Step 1: a\nStep 2: b\nStep 3: c", 1.0),
        ("First, a. Next, b.", 2 / 3),
        ("1. a\n2. b", 1 / 3),  # ^ without MULTILINE: only the very first line start counts
        ("\n- a\n- b\n* c\n* d", 1.0),
        ("plain", 0.0),
    ],
)
def test_reasoning_steps(text, expected):
    assert call("reasoning_steps", [text]) == [pytest.approx(expected)]


def test_accuracy_values_and_unparseable_gold():
    comps = [
        msg(r"The answer is $\frac{1}{2}$"),
        msg(r"so \boxed{3}"),
        msg("no math here"),
        msg("$5$"),
    ]
    sols = [r"$0.5$", r"$3$", r"$3$", "no gold at all"]
    assert call("accuracy", comps, solution=sols) == [1.0, 1.0, 0.0, None]


def test_accuracy_from_a_thread_is_correct_and_bounded():
    out = []
    t = threading.Thread(
        target=lambda: out.append(call("accuracy", [msg(r"$\boxed{7}$")], solution=["$7$"]))
    )
    t.start()
    t.join(timeout=120)
    assert out == [[1.0]]


def test_length_kimi():
    comps = [
        msg(r"$\boxed{1}$"),
        msg(r"long wrong answer $\boxed{2}$ ....."),
        msg(r"mid $\boxed{1}$"),
    ]
    r = call("length", comps, solution=["$1$"] * 3)
    lens = [len(c[0]["content"]) for c in comps]
    lo, hi = min(lens), max(lens)
    lam = [0.5 - (n - lo) / (hi - lo) for n in lens]
    assert r == pytest.approx([lam[0], min(0.0, lam[1]), lam[2]])
    assert call("length", [msg("a"), msg("b")], solution=["$1$"] * 2) == [0.0, 0.0]


def test_cosine_bounds():
    spec = {"cosine": {"max_len": 100}}
    right_short = call(spec, [msg(r"$\boxed{1}$")], solution=["$1$"])[0]
    n = len(r"$\boxed{1}$")
    assert right_short == pytest.approx(0.5 + 0.5 * 0.5 * (1 + math.cos(n / 100 * math.pi)))
    wrong_long = call(spec, [msg(r"$\boxed{2}$" + "x" * 89)], solution=["$1$"])[0]
    assert wrong_long == pytest.approx(-0.5 + 0.5 * (-1.0 + 0.5) * (1 + math.cos(1.0 * math.pi)))
    assert call(spec, [msg("x")], solution=["not math"]) == [1.0]


def test_repetition_penalty():
    spec = {"repetition_penalty": {"ngram_size": 2, "max_penalty": -1.0}}
    # 4 bigrams, 2 distinct ("a b", "b a") -> (1 - 2/4) * -1
    assert call(spec, ["a b a b a"]) == [pytest.approx(-0.5)]
    assert call(spec, ["A b a B"]) == [pytest.approx(-1 / 3)]  # lower-cased
    assert call(spec, ["one"]) == [0.0]
    assert call(spec, [""]) == [0.0]
    with pytest.raises(ValueError, match="max_penalty"):
        get_reward_funcs([{"repetition_penalty": {"max_penalty": 0.5}}])


def test_soft_overlong():
    spec = {"soft_overlong": {"max_completion_len": 10, "soft_punish_cache": 4}}
    ids = [[0] * n for n in (6, 7, 8, 10, 11)]
    assert call(spec, ["x"] * 5, completion_ids=ids) == [0.0, -0.25, -0.5, -1.0, -1.0]


def test_code_format():
    ok = "<think>\nplan\n</think>\n<answer>\n```python\nprint(1)\n```\n</answer>"
    assert call({"code_format": {"language": "python"}}, [ok, ok.replace("python", "rust")]) == [
        1.0,
        0.0,
    ]


@pytest.mark.parametrize(
    "text,nums,target,expected",
    [
        ("<answer>(1 + 2) * 4</answer>", [1, 2, 4], 12, 1.0),
        ("<answer>4 * (2 + 1) = 12</answer>", [1, 2, 4], 12, 1.0),  # after '=' ignored
        ("<answer>1 + 2 + 4</answer>", [1, 2, 4], 12, 0.0),  # wrong value
        ("<answer>2 * 6</answer>", [1, 2, 4], 12, 0.0),  # wrong numbers
        ("<answer>9**9**9</answer>", [9, 9, 9], 12, 0.0),  # not allowed arithmetic, no hang
        ("<answer>__import__('os')</answer>", [1], 1, 0.0),
        ("<answer>4 / (2 - 2) + 1</answer>", [4, 2, 2, 1], 1, 0.0),  # division by zero
        ("no answer", [1, 2], 3, 0.0),
    ],
)
def test_countdown(text, nums, target, expected):
    assert call("countdown", [text], nums=[nums], target=[target]) == [expected]


def test_length_target():
    assert call({"length_target": {"target_length": 5}}, ["abc", "abcdefg", "abcde"]) == [
        -2.0,
        -2.0,
        -0.0,
    ]


def test_unknown_and_bad_params():
    with pytest.raises(KeyError, match="did you mean 'accuracy'"):
        get_reward_funcs(["acuracy"])
    with pytest.raises(TypeError, match="no parameter"):
        get_reward_funcs([{"cosine": {"maxlen": 3}}])


def test_plugin_from_file(tmp_path):
    f = tmp_path / "my_rewards.py"
    f.write_text(
        "def shout(prompts, completions, **kw):\n    return [float(c.isupper()) for c in completions]\n"
    )
    (fn,) = get_reward_funcs([f"{f}:shout"])
    assert fn(prompts=["p", "p"], completions=["HI", "hi"]) == [1.0, 0.0]


CHEAP = [n for n in registered_rewards() if n not in ("accuracy", "length", "cosine")]
COLS = dict(
    answer=["12"], solution=["$12$"], nums=[[1, 2, 4]], target=[12], completion_ids=[[1, 2, 3]]
)


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=300), as_msg=st.booleans())
def test_no_builtin_raises_or_returns_nonfinite(text, as_msg):
    comp = msg(text) if as_msg else text
    for name in CHEAP:
        (fn,) = get_reward_funcs([name])
        (v,) = fn(prompts=["p"], completions=[comp], **COLS)
        assert v is None or math.isfinite(v), (name, text)
