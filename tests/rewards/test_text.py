"""The one number reader every grader uses (grpokit.rewards.text), on awkward inputs."""

from fractions import Fraction

import pytest

from grpokit.rewards.text import last_number, last_tag_content, parse_number, single_number


@pytest.mark.parametrize(
    "text, whole, last, single",
    [
        (".5", 0.5, 0.5, Fraction(1, 2)),  # a decimal part alone is a number
        ("-.25", -0.25, -0.25, Fraction(-1, 4)),
        ("so the result is .5", None, 0.5, Fraction(1, 2)),
        ("inf", None, None, None),  # words are not numbers
        ("nan", None, None, None),
        ("-Infinity", None, None, None),
        ("1_000", None, None, None),  # a Python literal, not a number written in text
        ("the answer is 1_000", None, None, None),  # ... and not the number 000 either
        ("1,234", 1234.0, 1234.0, Fraction(1234)),  # thousands separators
        ("1,234,567.5", 1234567.5, 1234567.5, Fraction(2469135, 2)),
        ("1,9", None, 9.0, None),  # not a thousands group: the numbers 1 and 9
        ("1,2,3", None, 3.0, None),  # a list, not 123
        ("$5", 5.0, 5.0, Fraction(5)),
        ("$1,000.", 1000.0, 1000.0, Fraction(1000)),
        ("72.", 72.0, 72.0, Fraction(72)),  # a sentence's full stop
        ("+5", 5.0, 5.0, Fraction(5)),
        ("1e3", 1000.0, 3.0, None),  # an exponent only in a whole answer
        ("1e999", None, 999.0, None),  # not finite: not an answer
        ("3-5", None, -5.0, None),  # "-" before a digit is a sign
        ("x = 5", None, 5.0, Fraction(5)),
        ("5 apples", None, 5.0, Fraction(5)),
        ("٧٢", 72.0, 72.0, Fraction(72)),  # any Unicode digits, as float() reads them
        ("", None, None, None),
    ],
)
def test_number_rules(text, whole, last, single):
    assert parse_number(text) == whole
    assert last_number(text) == last
    assert single_number(text) == single


def test_huge_numbers_are_not_infinite():
    assert parse_number("9" * 400) is None  # float would be inf
    assert single_number("9" * 400) == Fraction(int("9" * 400))  # exact where it can be
    assert single_number("9" * 5000) is None  # int() refuses so many digits


def test_last_tag_content():
    assert last_tag_content("<answer>1</answer> <answer>\n 2 \n</answer>") == "2"
    assert last_tag_content("<answer>1") is None
    assert last_tag_content("<think>a</think>", "think") == "a"
