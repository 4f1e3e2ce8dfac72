"""open-r1's rewards: the same names and numbers as src/open_r1/rewards.py.

Expected values are computed by hand from open-r1's formulas. (While writing these functions
they were also compared with open-r1's own code on 300 random completions: no difference.)
"""

import math

import pytest

from grpokit.rewards import get_reward_funcs


def msg(text):
    return [{"role": "assistant", "content": text}]


GOOD = "<think>\nreason\n</think>\n<answer>\n42\n</answer>"


@pytest.mark.parametrize(
    "text,expected",
    [
        (GOOD, 1.0),
        # open-r1 matches with re.MULTILINE, so "$" also matches before a later newline:
        ("<think>\nr\n</think>\n<answer>\n42\n</answer>\nmore", 1.0),
        ("<think>\nr\n</think>\n<answer>\n42\n</answer> more", 0.0),
        ("<think>\n\n</think>\n<answer>\n\n</answer>", 1.0),  # empty bodies
        ("<think>r</think><answer>42</answer>", 0.0),  # newlines required
        ("<answer>\n42\n</answer>\n<think>\nr\n</think>", 0.0),  # wrong order
        (" " + GOOD, 0.0),  # must start the text
        ("<think>\nпочему 🤔\n</think>\n<answer>\n四十二\n</answer>", 1.0),
        ("", 0.0),
    ],
)
def test_format(call, text, expected):
    assert call("format", [text]) == [expected]
    assert call("format", [msg(text)]) == [expected]


@pytest.mark.parametrize(
    "text,expected",
    [
        (GOOD, 1.0),
        ("<think>\nr\n</think>\n", 0.5),
        ("<think>\n<think>\n", 0.0),  # twice is not once
        ("\n<answer>\n42\n</answer>", 0.5),
        ("<answer>\n42</answer>", 0.0),  # "\n<answer>\n" needs the newline before it
        (GOOD + GOOD, 0.0),  # every mark twice
        ("<think>\n</think>\n", 0.5),  # the two marks may share a newline
        ("<think>x</think>\n", 0.0),
        ("", 0.0),
    ],
)
def test_tag_count(call, text, expected):
    assert call("tag_count", [text]) == [expected]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Step 1: a\nStep 2: b\nStep 3: c", 1.0),
        ("Step 1: a Step 22: b Step 3: c Step 4: d", 1.0),  # capped at 1
        ("First, a. Next, b.", 2 / 3),
        ("1. a\n2. b", 1 / 3),  # ^ without MULTILINE: only the very start of the text counts
        ("\n- a\n- b\n* c\n* d", 1.0),
        ("first, a", 0.0),  # case-sensitive
        ("Step one: a", 0.0),
        ("plain", 0.0),
        ("", 0.0),
    ],
)
def test_reasoning_steps(call, text, expected):
    assert call("reasoning_steps", [text]) == [expected]


def test_accuracy(call):
    comps = [
        msg(r"The answer is $\frac{1}{2}$"),
        msg(r"so \boxed{3}"),
        msg("no math here"),
        msg("$5$"),
        msg("$3$"),  # a bare $...$ is not extracted (try_extract_without_anchor=False)
        msg(r"\boxed{72}"),
        msg(r"\boxed{1000}"),
        "Final answer: $3$",
    ]
    sols = [r"$0.5$", r"$3$", r"$3$", "no gold at all", "$3$", "72", "1,000", "3"]
    assert call("accuracy", comps, solution=sols) == [1.0, 1.0, 0.0, None, 0.0, 1.0, 1.0, 1.0]
    # the answer column is used when there is no solution column
    assert call("accuracy", [r"\boxed{4}"], answer=[4]) == [1.0]
    assert call("accuracy", [], solution=[]) == []
    with pytest.raises(KeyError, match="solution"):
        call("accuracy", ["x"], nums=[[1]])


def test_length_kimi(call):
    texts = [r"$\boxed{1}$", r"long wrong answer $\boxed{2}$ .....", r"mid $\boxed{1}$"]
    # lengths 11, 35, 15 -> lambda = 0.5 - (len - 11) / 24
    r = call("length", [msg(t) for t in texts], solution=["$1$"] * 3)
    assert r == [0.5, min(0.0, 0.5 - 1.0), 0.5 - 4 / 24]
    # a wrong answer with positive lambda gets 0, not lambda
    r = call("length", [r"$\boxed{2}$", r"$\boxed{1}$ and more"], solution=["$1$"] * 2)
    assert r == [0.0, -0.5]
    # an unparseable gold counts as correct
    assert call("length", ["a", "bbb"], solution=["no gold", "no gold"]) == [0.5, -0.5]
    assert call("length", ["a", "b"], solution=["$1$"] * 2) == [0.0, 0.0]  # equal lengths
    assert call("length", [], solution=[]) == []


def test_cosine(call):
    right = r"$\boxed{1}$"  # 11 characters
    wrong = r"$\boxed{2}$" + "x" * 89  # 100 characters
    spec = {"cosine": {"max_len": 100, "min_value_wrong": -1.0}}
    c = math.cos(11 / 100 * math.pi)
    assert call(spec, [right], solution=["$1$"]) == [0.5 + 0.5 * 0.5 * (1.0 + c)]
    # wrong at max_len: (lo, hi) = (max_value_wrong, min_value_wrong) = (-0.5, -1.0), cos = -1
    assert call(spec, [wrong], solution=["$1$"]) == [-0.5]
    assert call(spec, [""], solution=["$1$"]) == [-1.0]  # wrong and empty: cos(0) = 1
    assert call(spec, ["x"], solution=["not math"]) == [1.0]
    # open-r1's CLI defaults: min_value_wrong=0.0, max_value_wrong=-0.5, ..., max_len=1000
    assert call("cosine", [""], solution=["$1$"]) == [0.0]
    assert call("cosine", ["x" * 1000], solution=["$1$"]) == [-0.5]
    assert call("cosine", [r"\boxed{1}" + "x" * 991], solution=["$1$"]) == [0.5]


def test_repetition_penalty(call):
    spec = {"repetition_penalty": {"ngram_size": 2, "max_penalty": -1.0}}
    assert call(spec, ["a b a b a"]) == [-0.5]  # 4 bigrams, 2 distinct
    assert call(spec, ["A b a B"]) == [pytest.approx(-1 / 3)]  # lower-cased: ab ba ab
    assert call(spec, ["one"]) == [0.0]
    assert call(spec, [""]) == [0.0]
    assert call("repetition_penalty", ["x x x x x"]) == [(1 - 1 / 3) * -1.0]  # trigrams
    assert call({"repetition_penalty": {"max_penalty": 0.0}}, ["x x x x"]) == [0.0]
    with pytest.raises(ValueError, match="max_penalty"):
        get_reward_funcs([{"repetition_penalty": {"max_penalty": 0.5}}])
    with pytest.raises(ValueError, match="ngram_size"):
        get_reward_funcs([{"repetition_penalty": {"ngram_size": 0}}])
    with pytest.raises(ValueError, match="language"):
        get_reward_funcs([{"repetition_penalty": {"language": "fr"}}])


def test_soft_overlong(call):
    spec = {"soft_overlong": {"max_completion_len": 10, "soft_punish_cache": 4}}
    ids = [[0] * n for n in (0, 6, 7, 8, 10, 11, 1000)]
    assert call(spec, ["x"] * 7, completion_ids=ids) == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    # open-r1's registry name is an alias; its defaults are L = 16384, cache = 4096
    assert call("soft_overlong_punishment", ["x"], completion_ids=[[0] * 14336]) == [-0.5]
    assert call(
        {"soft_overlong": {"soft_punish_cache": 0, "max_completion_len": 3}},
        ["x"] * 2,
        completion_ids=[[1, 2, 3], [1, 2, 3, 4]],
    ) == [0.0, -1.0]
    with pytest.raises(KeyError, match="completion_ids"):
        call("soft_overlong", ["x"])
    with pytest.raises(ValueError, match="soft_punish_cache"):
        get_reward_funcs([{"soft_overlong": {"max_completion_len": 4, "soft_punish_cache": 5}}])


def test_code_format(call):
    ok = "<think>\nplan\n</think>\n<answer>\n```python\nprint(1)\n```\n</answer>"
    rust = ok.replace("python", "rust")
    assert call({"code_format": {"language": "python"}}, [ok, rust, "", GOOD]) == [1.0, 0, 0, 0]
    assert call({"code_format": {"language": "rust"}}, [ok, rust]) == [0.0, 1.0]
    assert call("code_format", [ok]) == [1.0]
    # a language column overrides the parameter, row by row (mixed-language training)
    assert call("code_format", [ok, rust, rust], language=["python", "rust", None]) == [1, 1, 0]
    cpp = ok.replace("python", "c++")  # regex characters in the language are literal
    assert call({"code_format": {"language": "c++"}}, [cpp, ok.replace("python", "cc")]) == [1, 0]
