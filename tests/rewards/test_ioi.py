"""ioi_code (open-r1's IOI scoring) on three small local problems (ioi_problems.py): correct,
partially correct, wrong, crashing, timing-out and non-compiling C++ solutions, scored per
subtask against expectations computed here in Python from the tests' own arrays."""

from __future__ import annotations

import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.rewards.ioi import (
    CaseResult,
    Submission,
    SubtaskResult,
    compile_submission,
    score_problem,
    score_subtask,
    with_includes,
)

_spec = importlib.util.spec_from_file_location(
    "ioi_problems", Path(__file__).with_name("ioi_problems.py")
)
P = importlib.util.module_from_spec(_spec)
sys.modules["ioi_problems"] = P
_spec.loader.exec_module(P)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs C++ in the namespaces sandbox")
ROWS = {pid: P.problem_rows(pid) for pid in P.SUBTASKS}


def wrap32(x: int) -> int:
    return (x + 2**31) % 2**32 - 2**31


def expected(solution: str, row: dict) -> float:
    """What each solution scores on a subtask, from the arrays (not from running it)."""
    arrays = row["arrays"]
    if solution.endswith("_good"):
        return 1.0
    if solution == "sumarr_int":  # right iff the 32-bit wrapped sum is the sum
        return float(all(wrap32(sum(a)) == sum(a) for a in arrays))
    if solution == "sumarr_zero":
        return float(all(sum(a) == 0 for a in arrays))
    if solution == "maxpair_brute":  # n^2 pairs: within 1 s up to n = 1000, not at 2e5
        return float(all(len(a) <= 1000 for a in arrays))
    return 0.0  # crashes, compile errors


@pytest.fixture(scope="module")
def results():
    def one(name):
        rows = ROWS[name.split("_")[0]]
        return score_problem(P.completion(P.SOLUTIONS[name]), rows, compile_timeout=60)

    with ThreadPoolExecutor(max_workers=2) as ex:  # each compile is ~3 s of CPU
        return dict(zip(P.SOLUTIONS, ex.map(one, P.SOLUTIONS)))


def test_subtask_scores_and_points(results):
    for name, res in results.items():
        pid = name.split("_")[0]
        want = [expected(name, row) for row in ROWS[pid]]
        assert [r.score for r in res] == want, name
        points = sum(w * row["score"] for w, row in zip(want, ROWS[pid]))
        assert sum(r.weighted_score for r in res) == points, name
    # the interesting ones are really partial: some subtasks pass, some do not
    assert 0 < sum(r.weighted_score for r in results["sumarr_int"]) < 100
    assert 0 < sum(r.weighted_score for r in results["maxpair_brute"]) < 100


def test_statuses(results):
    assert {r.status for r in results["sumarr_good"]} == {"AC"}
    assert [r.status for r in results["sumarr_ce"]] == ["CE"] * 3
    assert "summ" in results["sumarr_ce"][0].tests[0].feedback
    full = results["maxpair_brute"][1]
    assert full.status == "TLE" and [t.status for t in full.tests] == ["AC", "TLE"]
    crash = results["evens_crash"][0]
    assert crash.status == "RE" and crash.tests[0].status == "RE"
    # test_batch_size 1: a subtask stops at its first failure, the rest stays SKIPPED
    assert [t.status for t in crash.tests] == ["RE", "SKIPPED", "SKIPPED"]
    overflow = results["sumarr_int"][2]
    assert overflow.status == "WA" and overflow.tests[0].status == "WA"


def test_batch_size_runs_whole_batches():
    row = ROWS["sumarr"][2]
    sub = compile_submission(P.SOLUTIONS["sumarr_int"], row, compile_timeout=60, isolation=None)
    every = score_subtask(row, sub, test_batch_size=-1)
    want = ["AC" if wrap32(sum(a)) == sum(a) else "WA" for a in row["arrays"]]
    assert [t.status for t in every.tests] == want
    two = score_subtask(row, sub, test_batch_size=2)
    assert [t.status for t in two.tests] == want[:2] + ["SKIPPED"]
    assert every.score == two.score == 0.0


def test_reward_through_the_registry():
    fn = get_reward_funcs([{"ioi_code": {"test_batch_size": 2, "compile_timeout": 60}}])[0]
    assert fn.__name__ == "ioi_code"
    rows = [ROWS["sumarr"][0], ROWS["sumarr"][2], ROWS["sumarr"][1], ROWS["evens"][0]]
    comps = [
        P.completion(P.SOLUTIONS["sumarr_int"]),  # small: passes
        P.completion(P.SOLUTIONS["sumarr_int"]),  # full: overflows
        "I do not know.",  # no ```cpp block
        [{"role": "assistant", "content": P.completion(P.SOLUTIONS["evens_good"])}],
    ]
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    got = fn(prompts=["p"] * 4, completions=comps, **cols)
    assert got == [expected("sumarr_int", rows[0]), expected("sumarr_int", rows[1]), 0.0, 1.0]


def test_includes_as_open_r1():
    assert with_includes("int f();", "nile") == (
        '#include <bits/stdc++.h>\n#include "nile.h"\n\nusing namespace std;\n\nint f();'
    )
    code = '#include "nile.h"\nstd::vector<int> f();'
    assert with_includes(code, "nile") == "#include <bits/stdc++.h>\n" + code


def test_clear_errors():
    with pytest.raises(ValueError, match="test_batch_size=0 must be at least 1"):
        get_reward_funcs([{"ioi_code": {"test_batch_size": 0}}])
    fn = get_reward_funcs(["ioi_code"])[0]
    row = dict(ROWS["evens"][0])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['time_limit'\]"):
        cols = {k: [v] for k, v in row.items() if k != "time_limit"}
        fn(prompts=["p"], completions=["x"], **cols)
    row["grader_files"] = row["grader_files"] + [["checker/checker.cpp", "int main(){}"]]
    with pytest.raises(ValueError, match="needs 'checker/checker.cpp'.*does not run"):
        fn(prompts=["p"], completions=["x"], **{k: [v] for k, v in row.items()})
    bad = dict(ROWS["evens"][0], test_cases=[["1\n2\n", "1\n"]])
    with pytest.raises(ValueError, match="1 test_cases for 3 test_names"):
        fn(prompts=["p"], completions=[P.completion("int count_evens(vector<int> a){return 0;}")],
           **{k: [v] for k, v in bad.items()})  # fmt: skip


def test_rounding_and_no_code():
    row = dict(ROWS["evens"][0], score_precision=0, score=7)
    res = score_subtask(row, Submission(None, "no code"))  # nothing runs
    assert res.score_precision == 0 and res.status == "SKIPPED" and res.score == 0.0
    part = SubtaskResult("p", "s", 7.0, 0, [CaseResult("a", 0.6, "PA"), CaseResult("b", 1.0)])
    assert (part.score, part.weighted_score) == (round(0.6), round(0.6 * 7))
    part.score_precision = 2
    assert (part.score, part.weighted_score) == (0.6, 4.2)
