"""countdown: the generator's problems are solvable as stated; the grader follows ms-swift."""

import ast
import random
import re
import warnings
from collections import Counter
from fractions import Fraction

import pytest

from grpokit.tasks import get_task
from grpokit.tasks.countdown import (
    countdown_score,
    generate_problem,
    is_think_answer_format,
    reachable,
    safe_eval,
    solve,
)


def _check_steps(node):
    """Evaluate with Fractions, asserting every intermediate is a non-negative integer."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    a, b = _check_steps(node.left), _check_steps(node.right)
    ops = {ast.Add: a + b, ast.Mult: a * b}
    if isinstance(node.op, ast.Sub):
        v = a - b
    elif isinstance(node.op, ast.Div):
        v = a / b
    else:
        v = ops[type(node.op)]
    assert v >= 0 and v.denominator == 1, ast.unparse(node)
    return v


@pytest.fixture(scope="module")
def problems():
    rng = random.Random(123)
    return [generate_problem(rng) for _ in range(1000)]


def test_every_stored_solution_is_right(problems):
    for p in problems:
        sol, nums = p["solution"], p["nums"]
        assert sorted(int(x) for x in re.findall(r"\d+", sol)) == sorted(nums), p
        assert _check_steps(ast.parse(sol, mode="eval").body) == p["target"], p
        assert countdown_score(f"<answer>{sol}</answer>", nums, p["target"]) == 1.0


def test_generator_statistics(problems):
    sizes = Counter(len(p["nums"]) for p in problems)
    assert set(sizes) == {3, 4}
    assert abs(sizes[3] / len(problems) - 0.5) < 0.06
    nums = [n for p in problems for n in p["nums"]]
    assert min(nums) == 1 and max(nums) == 99
    assert 40 < sum(nums) / len(nums) < 60
    assert any(len(set(p["nums"])) < len(p["nums"]) for p in problems)  # repeats happen
    targets = [p["target"] for p in problems]
    assert min(targets) == 10 and max(targets) == 100
    assert len(set(targets)) == 91


def test_task_is_deterministic_and_holds_out_test():
    a = get_task("countdown", seed=5, train_size=200, test_size=50)
    b = get_task("countdown", seed=5, train_size=200, test_size=50)
    assert a.build("train") == b.build("train") and a.build("test") == b.build("test")
    assert a.build("test") != get_task("countdown", seed=6, test_size=50).build("test")
    key = lambda r: (tuple(sorted(r["nums"])), r["target"])  # noqa: E731
    assert {key(r) for r in a.build("test")}.isdisjoint(key(r) for r in a.build("train"))
    row = a.build("test")[0]
    msg = row["prompt"][-1]["content"]
    assert str(row["nums"]) in msg and str(row["target"]) in msg and "<answer>" in msg


def test_solver_small_cases():
    assert solve([3, 5, 7], 22) is not None
    assert safe_eval(solve([3, 5, 7], 22)) == 22
    assert solve([1, 1, 1], 50) is None
    assert reachable((2, 3)) == {5, 6, 1}  # 2/3 and 3/2 are not integers
    assert reachable((4, 2)) == frozenset({6, 8, 2})  # 4-2 and 4/2 are both 2
    assert 0 in reachable((5, 5))  # 5 - 5: non-negative is fine


NUMS, TARGET = [3, 5, 7], 22
CASES = [
    ("<answer>3 * 5 + 7</answer>", 1.0),
    ("<think>..</think>\n<answer> (3*5)+7 = 22 </answer>", 1.0),  # '=' and after ignored
    ("<answer>7 + 5 * 3</answer>", 1.0),  # any order
    ("<answer>3 * 5 + 7 = 21</answer>", 1.0),  # the claim after '=' is not checked
    ("<answer>3*5+7</answer> <answer>1+1</answer>", 1.0),  # the FIRST answer counts
    ("<answer>1+1</answer> <answer>3*5+7</answer>", 0.0),
    ("<answer>\n3 * 5 + 7\n</answer>", 0.0),  # ms-swift's regex does not cross lines
    ("<answer>\n1\n</answer><answer>3*5+7</answer>", 1.0),  # ... so it finds the next one
    ("<answer>3 * 5 + 7 + 0</answer>", 0.0),  # an extra number
    ("<answer>3 * 5 * 1 + 7</answer>", 0.0),
    ("<answer>15 + 7</answer>", 0.0),  # numbers not as given
    ("<answer>3 × 5 + 7</answer>", 0.0),  # only + - * / ( ) . digits spaces
    ("<answer>x = 3 * 5 + 7</answer>", 0.0),  # the part before '=' has no numbers
    ("<answer>(3 + 5) * 7 / 2 - 6</answer>", 0.0),
    ("<answer>3 * (5 + 7)</answer>", 0.0),  # 36
    ("<answer>3 * 5 + 7.0</answer>", 0.0),  # '7.0' writes the numbers 7 and 0
    ("<answer>3 5 7</answer>", 0.0),  # syntax error
    ("<answer>3 * 5 + 7)</answer>", 0.0),
    ("<answer>(3)(5)+7</answer>", 0.0),  # a call, not multiplication
    ("<answer>7 / (5 - 5) + 3</answer>", 0.0),
    ("3 * 5 + 7", 0.0),  # no tag
    ("<answer></answer>", 0.0),
    ("<answer>3 * 5 + +7</answer>", 1.0),  # unary plus is Python arithmetic
    ("<answer>-3 * -5 + 7</answer>", 1.0),  # so is unary minus
]


@pytest.mark.parametrize("text, score", CASES)
def test_grader(text, score):
    assert countdown_score(text, NUMS, TARGET) == score
    assert get_task("countdown").is_correct(text, {"nums": NUMS, "target": TARGET}) is (score == 1)


def test_grader_division_and_tolerance():
    assert countdown_score("<answer>(7 - 3) / 5</answer>", NUMS, 0.8) == 1.0
    assert countdown_score("<answer>7 / 3 * 5</answer>", NUMS, 35 / 3 + 5e-6) == 1.0
    assert countdown_score("<answer>7 / 3 * 5</answer>", NUMS, 35 / 3 + 2e-5) == 0.0
    assert countdown_score("<answer>7 // 3 + 5</answer>", NUMS, 7) == 1.0  # eval would agree


def test_powers_are_evaluated_but_bounded():
    assert countdown_score("<answer>3 ** 2 - 5</answer>", [2, 3, 5], 4) == 1.0
    # 99 ** 99 ** 99 would hang eval(); here it is simply wrong, quickly
    assert countdown_score("<answer>99 ** 99 ** 99</answer>", [99, 99, 99], 10) == 0.0
    with pytest.raises(OverflowError):
        safe_eval("9 ** 9 ** 9")


@pytest.mark.parametrize("bad", ["__import__('os')", "a + 1", "(1).real", "[1]", "1 if 1 else 2"])
def test_safe_eval_refuses_non_arithmetic(bad):
    with pytest.raises((ValueError, SyntaxError)):
        safe_eval(bad)


def test_format():
    assert is_think_answer_format("<think>a\nb</think>\n<answer>1+2</answer>")
    assert not is_think_answer_format("<think>a</think><answer>1</answer> trailing")
    assert not is_think_answer_format("x<think>a</think><answer>1</answer>")


def test_agrees_with_the_countdown_reward_if_registered():
    from grpokit.rewards import get_reward_funcs
    from grpokit.rewards.registry import registered_rewards

    if "countdown" not in registered_rewards():
        pytest.skip("the reward library has no 'countdown' reward yet")
    (fn,) = get_reward_funcs(["countdown"])
    texts = [t for t, _ in CASES]
    got = fn(
        prompts=[None] * len(texts),
        completions=texts,
        nums=[NUMS] * len(texts),
        target=[TARGET] * len(texts),
    )
    assert [float(g or 0.0) for g in got] == [s for _, s in CASES]


def test_dataset_rows(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "train.jsonl", [{"nums": [3, 5, 7], "target": 22}] * 3)
    (tmp_path / "test.csv").write_text('nums,target\n"[1, 2, 3]",6\n')
    t = get_task("countdown", dataset_name=str(tmp_path))
    assert t.build("train")[0]["nums"] == [3, 5, 7]
    row = t.build("test")[0]
    assert row["nums"] == [1, 2, 3] and row["target"] == 6
    assert t.is_correct("<answer>1+2+3</answer>", row)


def _ms_swift_reference(completion, target, numbers):
    """ms-swift's CountdownORM for one completion, eval and all (test-only, vetted input)."""
    try:
        match = re.search(r"<answer>(.*?)<\/answer>", completion)
        if match is None:
            return 0.0
        equation = match.group(1).strip()
        if "=" in equation:
            equation = equation.split("=")[0]
        used_numbers = [int(n) for n in re.findall(r"\d+", equation)]
        if sorted(used_numbers) != sorted(numbers):
            return 0.0
        if not re.match(r"^[\d+\-*/().\s]+$", equation):
            return 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            result = eval(equation, {"__builtins__": None}, {})  # noqa: S307
        return 1.0 if abs(float(result) - float(target)) < 1e-5 else 0.0
    except Exception:
        return 0.0


@pytest.mark.parametrize("text, score", CASES)
def test_cases_match_the_reference(text, score):
    assert _ms_swift_reference(text, TARGET, NUMS) == score


def test_matches_the_reference_on_random_strings():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    body = st.text(alphabet="3579+-*/(). =x\n", max_size=16).filter(lambda s: "**" not in s)

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(body, st.sampled_from([22, 8, 0.6, 105, 1]))
    def check(s, target):
        for text in (f"<answer>{s}</answer>", f"<think>{s}</think><answer>{s}</answer>"):
            assert countdown_score(text, NUMS, target) == _ms_swift_reference(text, target, NUMS)

    check()


def test_safe_eval_equals_python_on_random_equations():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.sampled_from(["+", "-", "*", "/", "//", "%", "- -", "* -"])

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(
        st.permutations(["3", "5", "7", "12"]),
        st.lists(ops, min_size=3, max_size=3),
        st.integers(0, 3),
    )
    def check(nums, o, paren):
        parts = [nums[0], o[0], nums[1], o[1], nums[2], o[2], nums[3]]
        if paren:
            parts.insert(2 * paren, "(")
            parts.append(")")
        expr = " ".join(parts)
        try:
            want = eval(expr, {"__builtins__": None}, {})  # noqa: S307
        except ZeroDivisionError:
            with pytest.raises(ZeroDivisionError):
                safe_eval(expr)
            return
        assert safe_eval(expr) == want, expr
        ok = countdown_score(f"<answer>{expr} = ?</answer>", [3, 5, 7, 12], want)
        assert ok == (0.0 if "%" in expr else 1.0), expr  # '%' is not an allowed character

    check()


def test_task_rewards_are_registered():
    from grpokit.rewards import get_reward_funcs

    correct, fmt = get_reward_funcs(["countdown_correct", "countdown_format"])
    texts = [t for t, _ in CASES] + [[{"role": "assistant", "content": "<answer>3*5+7</answer>"}]]
    n = len(texts)
    got = correct(prompts=[None] * n, completions=texts, nums=[NUMS] * n, target=[TARGET] * n)
    assert got == [s for _, s in CASES] + [1.0]
    assert fmt(prompts=[None] * 2, completions=["<think>a</think><answer>1</answer>", "x"]) == [
        1.0,
        0.0,
    ]
