"""IOI-style scoring (open-r1's ``ioi_code``): a C++ solution against one subtask's test group.

A row is one SUBTASK of a problem, as in open-r1's ``open-r1/ioi`` dataset. The columns read:

- ``id``: the problem id; the submission is compiled with the grader files and gets
  ``#include <bits/stdc++.h>``, ``#include "<id>.h"`` (unless it has it) and ``using
  namespace std;`` (unless it writes ``std::`` or has it) in front, as open-r1 does;
- ``subtask`` (its name), ``score`` (its points), ``score_precision`` (decimals kept);
- ``test_names`` and ``test_cases`` (aligned with the names: ``[input, output]`` pairs or
  ``{"input", "output"}`` dicts; or a mapping name -> pair). Without ``test_cases`` the tests
  come from the hub dataset ``open-r1/ioi-test-cases`` (config ``year``), as in open-r1;
- ``grader_files``: ``[[name, content], ...]`` (``graders/grader.cpp``, ``graders/<id>.h``,
  ...), staged by their base names; every ``.cpp`` among them is compiled with the
  submission. Problems with a checker (``checker/...``) or a communication manager are
  refused with an error: grpokit does not run those yet;
- ``time_limit`` (seconds of CPU per test, enforced in whole seconds, rounded up; the wall
  clock allows twice that plus a second) and ``memory_limit`` (MB of address space).

Each test scores 1.0 when the program exits 0 and prints the expected lines (each stripped,
as the ``code`` reward), else 0.0 with a status (CE, RE, WA, MLE, TLE). A subtask's score
is the minimum over its tests, rounded to ``score_precision``; the reward is that score in
[0, 1] (open-r1's normalisation: the subtask's fraction of its points); its points are
``score * points`` (``SubtaskResult.weighted_score``). Tests run in batches of
``test_batch_size`` and stop after the first batch with a failure (the skipped tests score
0, which cannot change the minimum). ``score_problem`` scores one solution on all subtasks
of a problem (compiled once, each test run once) for a total in points.
"""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from grpokit.rewards.code import extract_code
from grpokit.rewards.registry import register_reward
from grpokit.sandbox import binary_program, compile_program, default_workers, run_program
from grpokit.sandbox.cpp import COMPILE_TIMEOUT
from grpokit.sandbox.run import output_matches

STATUS_ORDER = {"CE": -1, "RE": 0, "WA": 1, "MLE": 2, "TLE": 3, "PA": 4, "AC": 5, "SKIPPED": 999}
COLUMNS = ("id", "subtask", "score", "score_precision", "test_names", "grader_files",
           "time_limit", "memory_limit")  # fmt: skip


@dataclass
class CaseResult:
    name: str
    score: float = 0.0
    status: str = "SKIPPED"
    feedback: str = ""


@dataclass
class SubtaskResult:
    problem: str
    subtask: str
    points: float
    score_precision: int
    tests: list[CaseResult] = field(default_factory=list)

    @property
    def score(self) -> float:
        """min over the tests' scores, rounded; 0 for a subtask without tests."""
        if not self.tests:
            return 0.0
        return round(min(t.score for t in self.tests), self.score_precision)

    @property
    def weighted_score(self) -> float:
        """The subtask's points: its points times the minimum test score, rounded."""
        if not self.tests:
            return 0.0
        return round(min(t.score for t in self.tests) * self.points, self.score_precision)

    @property
    def status(self) -> str:
        """The worst status among the tests (CE < RE < WA < MLE < TLE < AC < SKIPPED)."""
        return min((t.status for t in self.tests), key=STATUS_ORDER.get, default="SKIPPED")


def with_includes(code: str, problem_id: str) -> str:
    """open-r1's header for IOI submissions (see the module docstring)."""
    head = "#include <bits/stdc++.h>\n"
    include = f'#include "{problem_id}.h"'
    if include not in code:
        head += include + "\n"
    if "using namespace std;" not in code and "std::" not in code:
        head += "\nusing namespace std;\n\n"
    return head + code


def grader_sources(row: dict) -> dict[str, str]:
    """The row's grader files by base name; a checker or manager is refused (not run here)."""
    files = row.get("grader_files") or []
    pairs = files.items() if isinstance(files, dict) else files
    out = {}
    for name, content in pairs:
        if not content:
            continue
        base = os.path.basename(str(name))
        if str(name).startswith("checker/") or base.startswith(("checker", "manager")):
            raise ValueError(
                f"ioi_code: problem {row.get('id')!r} needs {name!r} (a checker or manager), "
                "which grpokit does not run; drop such problems from the dataset"
            )
        if base in out:
            raise ValueError(f"ioi_code: problem {row.get('id')!r} has two grader files {base!r}")
        out[base] = str(content)
    return out


@functools.cache
def _hub_tests(year: int) -> dict:
    from datasets import load_dataset  # only for rows without test_cases

    tests: dict = {}
    for t in load_dataset("open-r1/ioi-test-cases", name=str(year), split="train"):
        tests.setdefault(t["problem_id"], {})[t["test_name"]] = (t["test_input"], t["test_output"])
    return tests


def subtask_tests(row: dict) -> dict[str, tuple[str, str]]:
    """name -> (input, expected output) for the row's ``test_names``."""
    names, cases = list(row.get("test_names") or []), row.get("test_cases")
    if cases is None:
        if row.get("year") is None:
            raise ValueError(f"ioi_code: row {row.get('id')!r} has neither test_cases nor year")
        cases = _hub_tests(int(row["year"]))[row["id"]]
    if isinstance(cases, list):
        if len(cases) != len(names):
            raise ValueError(
                f"ioi_code: row {row.get('id')!r} subtask {row.get('subtask')!r} has "
                f"{len(cases)} test_cases for {len(names)} test_names"
            )
        cases = dict(zip(names, cases))
    out = {}
    for n in names:
        c = cases[n]
        out[n] = (c["input"], c["output"]) if isinstance(c, dict) else (c[0], c[1])
    return out


def run_limits(row: dict, isolation: str | None) -> dict:
    """Sandbox limits of one test: CPU seconds (rounded up), wall clock, memory."""
    tl = float(row["time_limit"])
    return {
        "timeout": 2 * tl + 1,
        "cpu_seconds": max(1, math.ceil(tl)),
        "memory_mb": int(row["memory_limit"]),
        "isolation": isolation,
    }


def judge(program, test_input: str, expected: str, limits: dict) -> tuple[float, str, str]:
    """(score, status, feedback) of one test."""
    r = run_program(program, test_input, **limits)
    if r.timed_out or r.killed_reason in ("SIGXCPU", "SIGKILL"):
        return 0.0, "TLE", "Time limit exceeded"
    if r.returncode != 0:
        if "bad_alloc" in r.stderr:
            return 0.0, "MLE", "Memory limit exceeded"
        return 0.0, "RE", f"Runtime error (exit {r.returncode}, {r.killed_reason})"
    if output_matches(r, expected):
        return 1.0, "AC", "Output is correct"
    return 0.0, "WA", "Output isn't correct"


@dataclass
class Submission:
    """One completion's program for one problem: its binary, or why it has none."""

    program: object | None  # a sandbox Program
    error: str  # "" when it compiled; "no code" when the completion has no ```cpp block


def compile_submission(
    code: str | None, row: dict, *, compile_timeout: float, isolation: str | None
) -> Submission:
    """Compile a submission with the row's graders inside the sandbox."""
    if code is None:
        return Submission(None, "no code")
    c = compile_program(
        with_includes(code, str(row["id"])),
        extra_files=grader_sources(row),
        flags=("-DEVAL", "-std=gnu++17", "-O2", "-pipe", "-fmax-errors=20"),
        compile_timeout=compile_timeout,
        isolation=isolation,
    )
    return Submission(binary_program(c.binary), "") if c.ok else Submission(None, c.error)


def score_subtask(
    row: dict,
    sub: Submission,
    *,
    test_batch_size: int = 1,
    isolation: str | None = None,
    cache: dict | None = None,
) -> SubtaskResult:
    """One subtask row's result for a compiled (or failed) submission. ``cache`` (test name
    -> CaseResult) shares tests between the subtasks of one problem."""
    names = list(row.get("test_names") or [])
    precision = row.get("score_precision")
    res = SubtaskResult(str(row["id"]), str(row.get("subtask")), float(row.get("score") or 0),
                        2 if precision is None else int(precision))  # fmt: skip
    cache = {} if cache is None else cache
    res.tests = [cache.get(n) or CaseResult(n) for n in names]
    if sub.program is None:
        if sub.error != "no code":  # open-r1 skips rows without code; a failed compile is CE
            res.tests = [CaseResult(n, 0.0, "CE", "Compilation error: " + sub.error) for n in names]
        return res
    if any(t.status != "SKIPPED" and t.score == 0.0 for t in res.tests):
        return res  # a test already failed in another subtask
    tests, limits = subtask_tests(row), run_limits(row, isolation)
    todo = [i for i, t in enumerate(res.tests) if t.status == "SKIPPED"]
    batch = max(1, len(todo) if int(test_batch_size) == -1 else int(test_batch_size))
    with ThreadPoolExecutor(max_workers=batch) as ex:
        for start in range(0, len(todo), batch):
            idx = todo[start : start + batch]
            runs = ex.map(lambda i: judge(sub.program, *tests[names[i]], limits), idx)
            for i, (score, status, feedback) in zip(idx, runs):
                res.tests[i] = cache[names[i]] = CaseResult(names[i], score, status, feedback)
            if any(res.tests[i].score == 0.0 for i in idx):
                break
    return res


def score_problem(
    completion, rows: list[dict], *, compile_timeout: float = COMPILE_TIMEOUT,
    isolation: str | None = None, test_batch_size: int = 1
) -> list[SubtaskResult]:  # fmt: skip
    """Every subtask row of one problem for one completion (or C++ source in a ```cpp
    block): compiled once, each test run at most once. Total points: the sum of the results'
    ``weighted_score``."""
    code = extract_code(completion, "cpp")
    sub = compile_submission(code, rows[0], compile_timeout=compile_timeout, isolation=isolation)
    cache: dict = {}
    kw = {"test_batch_size": test_batch_size, "isolation": isolation, "cache": cache}
    return [score_subtask(r, sub, **kw) for r in rows]


def ioi_scores(completions, rows: list[dict], *, test_batch_size: int = 1,
               workers: int | None = None, compile_timeout: float = COMPILE_TIMEOUT,
               isolation: str | None = None) -> list[SubtaskResult]:  # fmt: skip
    """The result of each completion on its row's subtask, rows in parallel (``workers``
    at once, each running up to ``test_batch_size`` tests at once)."""

    def one(pair) -> SubtaskResult:
        completion, row = pair
        code = extract_code(completion, "cpp")
        sub = compile_submission(code, row, compile_timeout=compile_timeout, isolation=isolation)
        return score_subtask(row, sub, test_batch_size=test_batch_size, isolation=isolation)

    for row in rows:
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise ValueError(f"ioi_code: the dataset lacks column(s) {missing} (open-r1/ioi rows)")
        grader_sources(row)  # refuse checkers and malformed tests before anything runs
        subtask_tests(row)
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as ex:
        return list(ex.map(one, zip(completions, rows)))


@register_reward("ioi_code", factory=True)
def ioi_code(
    test_batch_size: int = 1,
    workers: int | None = None,
    compile_timeout: float = COMPILE_TIMEOUT,
    isolation: str | None = None,
):
    """Score in [0, 1] of the completion's last ```cpp block on its row's IOI subtask (min
    over the subtask's tests; open-r1's ``ioi_code``). ``test_batch_size``: tests run at once
    before checking for a failure (open-r1's ``code_eval_test_batch_size``; -1: all); ``workers``:
    rows scored at once; ``compile_timeout``: seconds for g++; ``isolation``: as ``code``."""
    if int(test_batch_size) < 1 and int(test_batch_size) != -1:
        raise ValueError(
            f"ioi_code: test_batch_size={test_batch_size} must be at least 1 (or -1: all at once)"
        )
    kw = {"test_batch_size": test_batch_size, "workers": workers,
          "compile_timeout": compile_timeout, "isolation": isolation}  # fmt: skip

    def ioi_code(prompts, completions, **columns) -> list[float]:
        n = len(completions)
        rows = [{k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == n}
                for i in range(n)]  # fmt: skip
        return [r.score for r in ioi_scores(completions, rows, **kw)]

    return ioi_code
