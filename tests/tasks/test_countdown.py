"""countdown: the generator's problems are solvable as stated; the grader follows ms-swift."""

import ast
import random
import re
import warnings
from collections import Counter
from fractions import Fraction

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.rewards.countdown import (
    MAX_EQUATION_CHARS,
    arith_eval,
    countdown_score,
    is_think_answer_format,
)
from grpokit.tasks import get_task
from grpokit.tasks.countdown import (
    OPERATIONS,
    generate_problem,
    reachable,
    reachable_by_last_operation,
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
    assert arith_eval(solve([3, 5, 7], 22)) == 22
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
    assert countdown_score("<answer>7 // 3 + 5</answer>", NUMS, 7) == 0.0  # not a game operator


@pytest.mark.parametrize(
    "bad",
    ["__import__('os')", "a + 1", "(1).real", "[1]", "1 if 1 else 2", "2 ** 3", "7 // 2", "7 % 2"],
)
def test_arith_eval_refuses_what_the_game_does_not_allow(bad):
    with pytest.raises((ValueError, SyntaxError)):
        arith_eval(bad)


def _sum_of_ones(n):
    return " + ".join(["1"] * n)  # 4n - 3 characters


# (answer content, nums, target): inputs where a grader could go wrong, slow or large
AWKWARD = [
    ("2**3*1", [2, 3, 1], 8, False),  # the game has no powers ...
    ("3 ** 2 - 5", [2, 3, 5], 4, False),
    ("9**9**9", [9, 9, 9], 1, False),  # ... and this one must not hang or fill memory
    ("99 ** 99 ** 99", [99, 99, 99], 10, False),
    ("25 // 2 + 0", [25, 2, 0], 12, False),  # no floor division
    ("2*3+1", [2, 3, 1], 7, True),
    (_sum_of_ones(300), [1] * 300, 300, False),  # 1,197 characters: over the length bound
    (_sum_of_ones(128), [1] * 128, 128, True),  # 509 characters: within it
    (_sum_of_ones(129), [1] * 129, 129, False),  # 513 characters
]


@pytest.mark.parametrize("equation, nums, target, ok", AWKWARD)
def test_task_and_rewards_agree_on_awkward_inputs(equation, nums, target, ok):
    text = f"<think>t</think><answer>{equation}</answer>"
    row = {"nums": nums, "target": target}
    assert get_task("countdown").is_correct(text, row) is ok
    funcs = get_reward_funcs(["countdown", "countdown_correct"])
    for f in funcs:
        assert f(prompts=[None], completions=[text], nums=[nums], target=[target]) == [float(ok)]
    assert len(_sum_of_ones(128)) <= MAX_EQUATION_CHARS < len(_sum_of_ones(129))


def test_format():
    assert is_think_answer_format("<think>a\nb</think>\n<answer>1+2</answer>")
    assert not is_think_answer_format("<think>a</think><answer>1</answer> trailing")
    assert not is_think_answer_format("x<think>a</think><answer>1</answer>")


def test_task_grader_is_the_reward_on_every_case():
    t = get_task("countdown")
    (fn,) = get_reward_funcs(t.default_reward_funcs[:1])
    assert fn.__name__ == "countdown"
    texts = [t for t, _ in CASES]
    got = fn(
        prompts=[None] * len(texts),
        completions=texts,
        nums=[NUMS] * len(texts),
        target=[TARGET] * len(texts),
    )
    assert got == [s for _, s in CASES]
    row = {"nums": NUMS, "target": TARGET}
    assert [float(t.is_correct(x, row)) for x in texts] == got


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

    # ms-swift's eval computes ** and //, which the game (and grpokit) refuse
    body = st.text(alphabet="3579+-*/(). =x\n", max_size=16).filter(
        lambda s: "**" not in s and "//" not in s
    )

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(body, st.sampled_from([22, 8, 0.6, 105, 1]))
    def check(s, target):
        for text in (f"<answer>{s}</answer>", f"<think>{s}</think><answer>{s}</answer>"):
            assert countdown_score(text, NUMS, target) == _ms_swift_reference(text, target, NUMS)

    check()


def test_arith_eval_equals_python_on_random_equations():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.sampled_from(["+", "-", "*", "/", "- -", "* -"])

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
                arith_eval(expr)
            return
        assert arith_eval(expr) == want, expr
        assert countdown_score(f"<answer>{expr} = ?</answer>", [3, 5, 7, 12], want) == 1.0

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


def test_smaller_problems_for_small_models():
    t = get_task(
        "countdown",
        seed=3,
        train_size=300,
        test_size=60,
        count=3,
        max_number=9,
        target_range=[1, 20],
    )
    rows = t.build("train") + t.build("test")
    assert {len(r["nums"]) for r in rows} == {3}
    assert all(1 <= n <= 9 for r in rows for n in r["nums"])
    assert all(1 <= r["target"] <= 20 for r in rows)
    for r in rows:  # each is solvable, by the generator's own solution, graded as trained
        assert _check_steps(ast.parse(r["solution"], mode="eval").body) == r["target"]
        assert t.is_correct(f"<think>x</think><answer>{r['solution']}</answer>", r)
    mixed = get_task("countdown", seed=3, train_size=200, test_size=10, count=[2, 3])
    assert {len(r["nums"]) for r in mixed.build("train")} == {2, 3}


def _brute(nums):
    """(outermost operation, value) of every equation over ``nums`` (each once), by
    building every expression tree with non-negative integer steps: the slow reference."""
    if len(nums) == 1:
        return {(None, nums[0])}
    out = set()
    n = len(nums)
    for mask in range(1, 2**n - 1):
        left = [nums[i] for i in range(n) if mask >> i & 1]
        right = [nums[i] for i in range(n) if not mask >> i & 1]
        for _, x in _brute(left):
            for _, y in _brute(right):
                out |= {("+", x + y), ("*", x * y)}
                if x >= y:
                    out.add(("-", x - y))
                if y and x % y == 0:
                    out.add(("/", x // y))
    return out


def test_reachable_by_last_operation_matches_brute_force():
    rng = random.Random(5)
    for _ in range(60):
        nums = [rng.randint(0, 9) for _ in range(rng.choice([2, 3, 4]))]
        by = reachable_by_last_operation(tuple(sorted(nums)))
        want = _brute(nums)
        for op in OPERATIONS:
            assert by[op] == {v for o, v in want if o == op}, (nums, op)
        assert set().union(*by.values()) == reachable(tuple(sorted(nums)))


def _share_by_operation(rows):
    """For each operation, the share of ``rows`` an equation ending in it solves."""
    hits = Counter()
    for r in rows:
        by = reachable_by_last_operation(tuple(sorted(r["nums"])))
        hits.update(op for op in OPERATIONS if r["target"] in by[op])
    return {op: hits[op] / len(rows) for op in OPERATIONS}


def test_targets_by_operation_leave_no_operation_answering_most_problems():
    def draw(targets):
        rng = random.Random(0)
        return [generate_problem(rng, (2,), 9, (1, 20), targets) for _ in range(1500)]

    uniform, share = _share_by_operation(draw("uniform")), _share_by_operation(draw("by_operation"))
    # uniform targets from two small numbers: a sum is right on 2 problems in 5
    assert uniform["+"] > 0.38 and uniform["*"] < 0.25, uniform
    # by operation: each drawn a quarter of the time, more where two operations agree
    assert all(0.22 < share[op] < 0.42 for op in OPERATIONS), share
    shape = dict(seed=3, count=[2, 3], max_number=9, target_range=[1, 20], train_size=300)
    t = get_task("countdown", **shape, test_size=50, targets="by_operation")
    rows = t.build("train")
    for r in rows + t.build("test"):  # still solvable as stated, and held out as before
        assert _check_steps(ast.parse(r["solution"], mode="eval").body) == r["target"]
    held = {(tuple(sorted(r["nums"])), r["target"]) for r in t.build("test")}
    assert not held & {(tuple(sorted(r["nums"])), r["target"]) for r in rows}


def test_operations_restrict_the_operation_targets_are_drawn_for():
    rng = random.Random(0)
    rows = [generate_problem(rng, (2,), 9, (1, 20), "by_operation", ("+", "-")) for _ in range(800)]
    sums = sum(r["target"] == sum(r["nums"]) for r in rows)
    diffs = sum(r["target"] == abs(r["nums"][0] - r["nums"][1]) for r in rows)
    # two positive numbers: their sum exceeds both, their difference neither; half each
    assert sums + diffs == len(rows) and 340 < sums < 460, (sums, diffs)
    t = get_task(
        "countdown",
        count=2,
        max_number=9,
        target_range=[1, 20],
        train_size=200,
        test_size=40,
        targets="by_operation",
        operations=["-"],
    )
    for r in t.build("train") + t.build("test"):
        a, b = r["nums"]
        assert r["target"] == abs(a - b) and r["solution"].count("-") == 1, r
    # all four in another order: nothing to restrict, so uniform targets accept it
    get_task("countdown", train_size=5, test_size=5, operations=["/", "*", "-", "+"]).build("test")


@pytest.mark.parametrize(
    "params, says",
    [
        ({"targets": "random"}, "targets='random': use 'uniform'"),
        ({"targets": "by_operation", "operations": ["+", "^"]}, "operations=['+', '^']"),
        ({"targets": "by_operation", "operations": []}, "operations=[]"),
        ({"targets": "by_operation", "operations": ["+", "+"]}, "operations=['+', '+']"),
        ({"operations": ["+", "-"]}, "operations applies with targets: by_operation"),
        ({"count": 1}, "count=1: use 2..6"),
        ({"count": [3, "x"]}, "count=[3, 'x']"),
        ({"max_number": 0}, "max_number=0"),
        ({"target_range": [20, 5]}, "target_range=[20, 5]"),
        ({"target_range": 7}, "target_range=7"),
        ({"count": 2, "max_number": 1, "target_range": [50, 60]}, "no target in [50, 60]"),
    ],
)
def test_bad_problem_shapes_are_named(params, says):
    from grpokit.tasks.base import TaskDataError

    with pytest.raises(TaskDataError, match=re.escape(says)):
        get_task("countdown", train_size=5, test_size=5, **params).build("train")


def test_problem_shape_is_for_generated_problems_only(tmp_path, write_jsonl):
    from grpokit.tasks.base import TaskDataError

    write_jsonl(tmp_path / "train.jsonl", [{"nums": [3, 5, 7], "target": 22}])
    with pytest.raises(TaskDataError, match="max_number applies to generated problems only"):
        get_task("countdown", dataset_name=str(tmp_path), max_number=9)
    with pytest.raises(TaskDataError, match="targets applies to generated problems only"):
        get_task("countdown", dataset_name=str(tmp_path), targets="by_operation")


def test_a_demonstrated_countdown_problem_is_never_drawn():
    from grpokit.tasks import get_task

    shape = dict(seed=1, count=2, max_number=3, target_range=[1, 9], train_size=60, test_size=10)
    plain = get_task("countdown", **shape)
    ask = lambda t, split: [r["prompt"][-1]["content"] for r in t.build(split)]  # noqa: E731
    shown = [ask(plain, "test")[0], ask(plain, "train")[0]]  # one of each split
    demo = []
    for q in shown:
        demo += [{"role": "user", "content": q}, {"role": "assistant", "content": "x"}]
    task = get_task("countdown", **shape, demonstrations=demo)
    for split in ("test", "train"):
        questions = ask(task, split)
        assert len(questions) == shape[f"{split}_size"]
        assert not set(shown) & set(questions), split


@pytest.mark.parametrize(
    "completion, score",
    [
        ("<think>x</think><answer>2 + 5 + 3</answer>", 1.0),  # the right numbers, value 10
        ("<think>x</think><answer>(3 - 5) * 2 = -4</answer>", 1.0),  # any value, '=' dropped
        ("<think>x</think><answer>2 * 5 + 3</answer>", 1.0),  # the target itself
        ("<think>x</think><answer>2 + 5</answer>", 2 / 3),  # a number missing
        ("<think>x</think><answer>2 + 5 + 3 + 3</answer>", 3 / 4),  # a number twice
        ("<think>x</think><answer>2 + 5 + 4</answer>", 2 / 3),  # a number not given
        ("<think>x</think><answer>7 * 8 - 1 * 4</answer>", 0.0),  # none of them
        ("<think>x</think><answer>2 ** 5 + 3</answer>", 0.0),  # not an allowed operation
        ("<think>x</think><answer>2m * 5 + 3</answer>", 0.0),  # not an allowed character
        ("<think>x</think><answer>2 / (5 - 5) + 3</answer>", 0.0),  # no value
        ("<think>2 + 5 + 3</think>", 0.0),  # no answer
        ("<answer>(2 + 5) * 3</answer>", 1.0),  # format is another reward's business
    ],
)
def test_countdown_numbers_credits_keeping_to_the_given_numbers(completion, score):
    (fn,) = get_reward_funcs(["countdown_numbers"])
    assert fn(["p"], [completion], nums=[[2, 5, 3]], target=[13]) == [pytest.approx(score)]
    # it never gives less than the success reward: a right equation uses the numbers
    (success,) = get_reward_funcs(["countdown"])
    assert fn(["p"], [completion], nums=[[2, 5, 3]], target=[13]) >= success(
        ["p"], [completion], nums=[[2, 5, 3]], target=[13]
    )


def test_countdown_numbers_is_the_overlap_on_random_equations():
    """Against a count by removal: each given number crosses out one use."""
    (fn,) = get_reward_funcs(["countdown_numbers"])
    rng = random.Random(5)
    for _ in range(300):
        nums = [rng.randint(1, 9) for _ in range(rng.choice([2, 3, 4]))]
        used = [rng.randint(1, 9) for _ in range(rng.choice([1, 2, 3, 4, 5]))]
        equation = " + ".join(map(str, used))
        left, common = list(used), 0
        for n in nums:
            if n in left:
                left.remove(n)
                common += 1
        want = common / max(len(used), len(nums))
        got = fn(["p"], [f"<answer>{equation}</answer>"], nums=[nums], target=[1])
        assert got == [pytest.approx(want)], (nums, equation)


@pytest.mark.parametrize(
    "completion, score",
    [
        ("<answer>(2 + 5) - 3</answer>", 1.0),  # hits 4
        ("<answer>2 * 5 - 3 = 4</answer>", 1 / (1 + 10 * 3 / 4)),  # 7, off by 3
        ("<answer>2 + 5 + 3</answer>", 1 / (1 + 10 * 6 / 4)),  # 10, off by 6
        ("<answer>2 - 5 - 3</answer>", 1 / (1 + 10 * 10 / 4)),  # -6, off by 10
        ("<answer>2 + 5</answer>", 0.0),  # a number missing: no credit for the value
        ("<answer>4</answer>", 0.0),  # the target written, not made
        ("<answer>2 / (5 - 5) + 3</answer>", 0.0),  # no value
        ("<answer>2 ** 5 - 3</answer>", 0.0),  # not an allowed operation
        ("<think>(2 + 5) - 3</think>", 0.0),  # no answer
    ],
)
def test_countdown_closeness_credits_the_value_once_the_numbers_are_right(completion, score):
    (fn,) = get_reward_funcs(["countdown_closeness"])
    got = fn(["p"], [completion], nums=[[2, 5, 3]], target=[4])
    assert got == [pytest.approx(score)]


def test_countdown_closeness_is_one_exactly_where_countdown_is():
    """On random equations over random problems: 1.0 if and only if the success reward is 1,
    and never above the numbers reward (a value is credited only with the right numbers)."""
    close, success, numbers = get_reward_funcs(
        ["countdown_closeness", "countdown", "countdown_numbers"]
    )
    rng = random.Random(7)
    hits = 0
    for _ in range(400):
        nums = [rng.randint(1, 9) for _ in range(rng.choice([2, 3]))]
        order = rng.sample(nums, len(nums))
        ops = [rng.choice("+-*/") for _ in order[1:]]
        equation = str(order[0]) + "".join(f" {o} {n}" for o, n in zip(ops, order[1:]))
        target = rng.randint(1, 20)
        args = (["p"], [f"<answer>{equation}</answer>"])
        c = close(*args, nums=[nums], target=[target])[0]
        s = success(*args, nums=[nums], target=[target])[0]
        assert (c == 1.0) == (s == 1.0), (nums, equation, target)
        assert 0.0 < c <= numbers(*args, nums=[nums])[0]
        hits += s == 1.0
    assert hits > 0  # the sample includes solved problems


@pytest.mark.parametrize(
    "completion, nums, score",
    [
        ("<think>7 + 3 = 10. 7 - 3 = 4. 7 * 3 = 21.</think> <answer>7 - 3</answer>", [7, 3], 1.0),
        ("<think>7 + 3 = 12. 7 - 3 = 4. 7 * 3 = 21. 7 / 3 = 2.</think>", [7, 3], 0.5),  # 2 of 4
        ("<think>7 + 3 = 10. 10 * 2 = 20.</think>", [7, 3], 0.5),  # 2: not given, not a result
        ("<think>2 * 5 = 10, and 10 + 3 = 13.</think>", [7, 3], 0.0),  # another problem's numbers
        ("<think>3 - 7 = 4.</think>", [7, 3], 0.0),  # negative results are false, not absolute
        ("<think>7 / 0 = 0. 7 + 3 = 10.</think>", [7, 3, 0], 0.5),  # division by zero: false
        ("<think>I would add them.</think> <answer>7 + 3</answer>", [7, 3], 0.0),  # no step
        ("7 + 3 = 10. <answer>7 + 3</answer>", [7, 3], 0.0),  # no <think> block
    ],
)
def test_countdown_steps_scores_true_steps_from_the_given_numbers(completion, nums, score):
    (fn,) = get_reward_funcs(["countdown_steps"])
    assert fn(["p"], [completion], nums=[nums]) == [pytest.approx(score)]


def test_countdown_steps_follows_results_into_later_steps():
    (fn,) = get_reward_funcs(["countdown_steps"])
    chain = "<think>2 * 5 = 10, and 10 + 3 = 13.</think> <answer>2 * 5 + 3</answer>"
    broken = "<think>2 * 5 = 11, and 11 + 3 = 14.</think> <answer>2 * 5 + 3</answer>"
    assert fn(["p", "p"], [chain, broken], nums=[[2, 5, 3]] * 2) == [1.0, 0.0]
