"""Three small IOI-style problems in open-r1/ioi's row format (one row per subtask), built
here: grader files (a header with the function to write, a grader.cpp with main), tests
generated with a seeded RNG and their expected outputs computed in Python.

- ``sumarr``: the sum of an array. Subtasks: n <= 10 and |a| <= 10 (10 points); n <= 1000
  and |a| <= 1000 (30); n <= 2e5 and |a| <= 1e9 (60: the sum needs 64 bits).
- ``maxpair``: max a[i] + a[j] over i < j. Subtasks: n <= 100 (40); n <= 2e5 (60: needs
  better than n^2).
- ``evens``: how many a[i] are even. One subtask (100).
"""

from __future__ import annotations

import random

HEADERS = {
    "sumarr": "#include <vector>\nlong long sum_array(std::vector<int> a);\n",
    "maxpair": "#include <vector>\nlong long max_pair(std::vector<int> a);\n",
    "evens": "#include <vector>\nint count_evens(std::vector<int> a);\n",
}
CALLS = {"sumarr": "sum_array", "maxpair": "max_pair", "evens": "count_evens"}


def grader(pid: str) -> str:
    """main(): n, then n ints on stdin; prints the function's answer."""
    return (
        f'#include "{pid}.h"\n#include <cstdio>\n#include <vector>\n'
        'int main() {\n  int n;\n  if (scanf("%d", &n) != 1) return 1;\n'
        '  std::vector<int> a(n);\n  for (int &x : a) scanf("%d", &x);\n'
        f'  printf("%lld\\n", (long long){CALLS[pid]}(a));\n  return 0;\n}}\n'
    )


def answer(pid: str, a: list[int]) -> int:
    if pid == "sumarr":
        return sum(a)
    if pid == "maxpair":
        s = sorted(a)
        return s[-1] + s[-2]
    return sum(x % 2 == 0 for x in a)


# (subtask name, points, [(n, bound), ...] one per test)
SUBTASKS = {
    "sumarr": [("small", 10, [(1, 10), (7, 10), (10, 10)]),
               ("medium", 30, [(500, 1000), (1000, 1000)]),
               ("full", 60, [(1000, 10**9), (200_000, 10**9), (10, 10**9)])],
    "maxpair": [("small", 40, [(2, 100), (50, 10**9), (100, 10**9)]),
                ("full", 60, [(1000, 10**9), (200_000, 10**9)])],
    "evens": [("all", 100, [(1, 5), (20, 100), (1000, 10**9)])],
}  # fmt: skip


def make_test(rng: random.Random, n: int, bound: int, full: bool) -> list[int]:
    a = [rng.randint(-bound, bound) for _ in range(n)]
    if full and n >= 1000:  # make the 64-bit sum matter: mostly large positives
        a = [rng.randint(bound // 2, bound) for _ in range(n)]
    return a


def problem_rows(pid: str, seed: int = 0) -> list[dict]:
    """The subtask rows of one problem, open-r1/ioi's columns."""
    rng = random.Random(f"{pid}-{seed}")
    graders = [[f"graders/{pid}.h", HEADERS[pid]], ["graders/grader.cpp", grader(pid)]]
    rows = []
    for sub, points, specs in SUBTASKS[pid]:
        names, cases, arrays = [], [], []
        for k, (n, bound) in enumerate(specs):
            a = make_test(rng, n, bound, sub == "full")
            names.append(f"{sub}-{k}")
            arrays.append(a)
            inp = f"{n}\n{' '.join(map(str, a))}\n"
            cases.append([inp, f"{answer(pid, a)}\n"])
        rows.append({
            "id": pid, "name": pid, "year": 2099, "subtask": sub, "score": points,
            "score_precision": 2, "test_names": names, "test_cases": cases,
            "grader_files": graders, "time_limit": 1.0, "memory_limit": 256,
            "problem": f"Problem {pid}", "arrays": arrays,
        })  # fmt: skip
    return rows


SOLUTIONS = {
    "sumarr_good": "long long sum_array(std::vector<int> a) {\n"
    "  long long s = 0;\n  for (int x : a) s += x;\n  return s;\n}\n",
    # 32-bit accumulator: right while every prefix sum fits in an int
    "sumarr_int": "long long sum_array(vector<int> a) {\n"
    "  int s = 0;\n  for (int x : a) s = (int)((unsigned)s + (unsigned)x);\n  return s;\n}\n",
    "sumarr_zero": "long long sum_array(vector<int> a) { return 0; }\n",
    "sumarr_ce": "long long sum_array(vector<int> a) { return a.summ(); }\n",
    # n^2: fine for n <= 100, ~2e10 steps for n = 2e5 (time limit 1 s)
    "maxpair_brute": "long long max_pair(vector<int> a) {\n"
    "  long long best = LLONG_MIN; int n = a.size();\n"
    "  for (int i = 0; i < n; i++) for (int j = i + 1; j < n; j++)\n"
    "    best = max(best, (long long)a[i] + a[j]);\n  return best;\n}\n",
    "evens_good": "int count_evens(vector<int> a) {\n"
    "  int c = 0;\n  for (int x : a) c += (x % 2 == 0);\n  return c;\n}\n",
    # crashes: reads far out of bounds
    "evens_crash": "int count_evens(vector<int> a) {\n"
    "  volatile int *p = nullptr; return p[a.size()];\n}\n",
}


def completion(code: str) -> str:
    return f"I will implement the function.\n```cpp\n{code}```\n"
