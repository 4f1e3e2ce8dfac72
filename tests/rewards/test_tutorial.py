"""correctness, xml_format (GRPO from scratch), length_target (smoltldr), countdown (ms-swift)."""

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.rewards.countdown import MAX_EQUATION_CHARS, arith_eval


def msg(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize(
    "text,gold,expected",
    [
        ("<reasoning>x</reasoning><answer>72</answer>", "72", 2.0),
        ("<answer>\n 72 \n</answer>", "72", 2.0),  # stripped
        ("<answer>72</answer>", 72, 2.0),  # an int gold column
        ("<answer>72.0</answer>", "72", 1.5),  # the same single number
        ("<answer>1,000</answer>", "1000", 1.5),
        ("<answer>1000</answer>", "1,000", 1.5),
        ("<answer>-0.50</answer>", "-.5", 1.5),
        ("<answer>72 apples</answer>", "72", 1.5),  # one number in each
        ("<answer>72 or 73</answer>", "72", 0.0),  # two numbers: not a single number
        ("<answer>7</answer> then <answer>72</answer>", "72", 2.0),  # the last answer counts
        ("<answer>72</answer> then <answer>7</answer>", "72", 0.0),
        ("<answer>72</answer> then <answer>7", "72", 0.0),  # last <answer> never closed
        ("<answer>a<answer>72</answer>", "72", 2.0),  # after the LAST <answer>
        ("72", "72", 0.0),  # no tags
        ("</answer>72<answer>", "72", 0.0),  # wrong order
        ("", "72", 0.0),
        ("<answer></answer>", "", 2.0),  # empty equals empty, exactly
        ("<answer>seventy-two</answer>", "72", 0.0),
        ("<answer>" + "9" * 400 + "</answer>", "9" * 401, 0.0),  # huge, compared exactly
        ("<answer>" + "9" * 400 + ".0</answer>", "9" * 400, 1.5),
        ("<answer>1e400</answer>", "1e401", 0.0),  # no float overflow to inf == inf
        ("<answer>٧٢</answer>", "72", 1.5),  # Arabic-Indic digits are the same number
        ("<answer>72</answer>", None, 0.0),
    ],
)
def test_correctness(call, text, gold, expected):
    assert call("correctness", [text], answer=[gold]) == [expected]
    assert call("correctness", [msg(text)], answer=[gold]) == [expected]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<reasoning>\nr\n</reasoning>\n<answer>\n1\n</answer>", 0.8),
        ("</answer><answer></reasoning><reasoning>", 0.8),  # any order: each tag present
        ("<reasoning>a</reasoning>" * 3, 0.4),  # repeats count once
        ("<reasoning>r</reasoning><answer>", 0.6),
        ("<answer>1</answer>", 0.4),
        ("<REASONING>", 0.0),  # case-sensitive
        ("", 0.0),
        ("<reasoning>", 0.2),
    ],
)
def test_xml_format(call, text, expected):
    assert call("xml_format", [text]) == [expected]  # exact: 0.6, not 0.6000000000000001


def test_length_target(call):
    assert call({"length_target": {"target_length": 5}}, ["abc", "abcdefg", "abcde", ""]) == [
        -2.0,
        -2.0,
        -0.0,
        -5.0,
    ]
    assert call("length_target", ["x" * 50, "é" * 60]) == [0.0, -10.0]  # default 50 characters
    # a row's target_length column overrides the parameter; None rows keep it
    got = call("length_target", ["abc", "abc"], target_length=[3, None])
    assert got == [0.0, -47.0]
    with pytest.raises(ValueError, match="target_length"):
        get_reward_funcs([{"length_target": {"target_length": -1}}])


@pytest.mark.parametrize(
    "text,nums,target,expected",
    [
        ("<answer>(1 + 2) * 4</answer>", [1, 2, 4], 12, 1.0),
        ("<think>t</think><answer> 4 * (2 + 1) = 12 </answer>", [1, 2, 4], 12, 1.0),  # '=' on
        ("<answer>4 * (2 + 1) = 99 = x</answer>", [4, 2, 1], "12", 1.0),  # str target
        ("<answer>(4 - 1) / 2</answer>", [1, 2, 4], 1.5, 1.0),
        ("<answer>-1 + 2 * 4</answer>", [1, 2, 4], 7, 1.0),  # unary minus
        ("<answer>1 + 2 + 4</answer>", [1, 2, 4], 12, 0.0),  # wrong value
        ("<answer>2 * 6</answer>", [1, 2, 4], 12, 0.0),  # wrong numbers
        ("<answer>(1 + 2) * 4 * 1</answer>", [1, 2, 4], 12, 0.0),  # a number used twice
        ("<answer>3 * 4</answer>", [3, 4, 4], 12, 0.0),  # a number left out
        ("<answer>1.5 * 8</answer>", [1, 5, 8], 12, 1.0),  # "1.5" is the integers 1 and 5
        ("<answer>(1+2)*4</answer> then <answer>1+2+4</answer>", [1, 2, 4], 12, 1.0),  # first
        ("<answer>1+2+4</answer> then <answer>(1+2)*4</answer>", [1, 2, 4], 12, 0.0),
        ("<answer>(1 + 2)\n* 4</answer>", [1, 2, 4], 12, 0.0),  # one line only, as ms-swift
        ("<answer>2**3 + 4</answer>", [2, 3, 4], 12, 0.0),  # ** rejected
        ("<answer>9**9**9**9</answer>", [9, 9, 9, 9], 12, 0.0),  # ... and cannot hang
        ("<answer>25 // 2</answer>", [25, 2], 12, 0.0),  # // rejected
        ("<answer>3 * 5 + +7</answer>", [3, 5, 7], 22, 1.0),  # unary plus, as eval
        ("<answer>3 * 5 + 7)</answer>", [3, 5, 7], 22, 0.0),
        ("<answer>(3)(5)+7</answer>", [3, 5, 7], 22, 0.0),  # a call, not a product
        ("<answer>3 × 5 + 7</answer>", [3, 5, 7], 22, 0.0),
        ("<answer>__import__('os')</answer>", [1], 1, 0.0),
        ("<answer>x + 12</answer>", [12], 12, 0.0),
        ("<answer>4 / (2 - 2) + 1</answer>", [4, 2, 2, 1], 1, 0.0),  # division by zero
        ("<answer>(1 + 2</answer>", [1, 2], 3, 0.0),  # syntax error
        ("<answer>12 </answer>", [12.0], 12, 1.0),  # float nums column
        ("<answer>" + "9" * 300 + " / 1</answer>", [int("9" * 300), 1], 12, 0.0),  # huge
        ("no answer", [1, 2], 3, 0.0),
        ("", [1, 2], 3, 0.0),
    ],
)
def test_countdown(call, text, nums, target, expected):
    assert call("countdown", [text], nums=[nums], target=[target]) == [expected]
    assert call("countdown", [msg(text)], nums=[nums], target=[target]) == [expected]


def test_countdown_bounds_length_and_nesting(call):
    long = " + ".join(["1"] * (MAX_EQUATION_CHARS // 4 + 1))
    assert call("countdown", [f"<answer>{long}</answer>"], nums=[[1] * 200], target=[1]) == [0.0]
    deep = "(" * 250 + "1" + ")" * 250
    assert call("countdown", [f"<answer>{deep}</answer>"], nums=[[1]], target=[1]) == [0.0]


def test_arith_eval():
    assert arith_eval("(1 + 2) * 4 / 8 - -1") == 2.5
    for bad in ("2 ** 3", "7 // 2", "7 % 2", "abs(1)", "a", "1 if 1 else 2", "[1]", "True"):
        with pytest.raises(ValueError):
            arith_eval(bad)
    with pytest.raises(ZeroDivisionError):
        arith_eval("1 / 0")
