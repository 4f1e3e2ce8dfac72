"""Every problem of the `code` task has a reference solution that passes all its test cases
in the sandbox, so no expected output in grpokit/tasks/data/code_problems.jsonl is wrong; and
a wrong solution fails, so the check can fail."""

from __future__ import annotations

import json

from grpokit.sandbox import score_many
from grpokit.tasks.code import DATA

REFERENCES = {
    "code-00": "a, b = map(int, input().split())\nprint(a + b)",
    "code-01": "print(input()[::-1])",
    "code-02": "print(sum(c in 'aeiou' for c in input().lower()))",
    "code-03": (
        "for i in range(1, int(input()) + 1):\n"
        "    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else"
        " 'Buzz' if i % 5 == 0 else i)"
    ),
    "code-04": "import math\nprint(math.factorial(int(input())))",
    "code-05": "a, b = 0, 1\nfor _ in range(int(input())):\n    a, b = b, a + b\nprint(a)",
    "code-06": (
        "n = int(input())\n"
        "print('YES' if n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1)) else 'NO')"
    ),
    "code-07": "print(max(map(int, input().split())))",
    "code-08": "print(*sorted(map(int, input().split())))",
    "code-09": "s = input()\nprint('YES' if s == s[::-1] else 'NO')",
    "code-10": "print(len(input().split()))",
    "code-11": "n = int(input())\nprint(n * (n + 1) // 2)",
    "code-12": "print(input().upper())",
    "code-13": "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))",
    "code-14": "print('EVEN' if int(input()) % 2 == 0 else 'ODD')",
    "code-15": "n = int(input())\nfor i in range(1, 4):\n    print(f'{n} x {i} = {n * i}')",
    "code-16": "print(sum(map(int, input().strip())))",
    "code-17": "print(bin(int(input()))[2:])",
    "code-18": "print(int(input()) * 9 // 5 + 32)",
    "code-19": "xs = list(map(int, input().split()))\nprint(f'{sum(xs) / len(xs):.2f}')",
    "code-20": "s = input().strip()\nprint(min(set(s), key=lambda c: (-s.count(c), c)))",
    "code-21": "print(''.join(dict.fromkeys(input().strip())))",
    "code-22": "for i in range(1, int(input()) + 1):\n    print('*' * i)",
    "code-23": "print(sum(x > 0 for x in map(int, input().split())))",
    "code-24": "print('YES' if sorted(input().strip()) == sorted(input().strip()) else 'NO')",
    "code-25": (
        "y = int(input())\nprint('YES' if y % 4 == 0 and (y % 100 != 0 or y % 400 == 0) else 'NO')"
    ),
    "code-26": "print(*input().split()[::-1])",
    "code-27": "n = int(input())\nprint(*[d for d in range(1, n + 1) if n % d == 0])",
    "code-28": "print(sorted(set(map(int, input().split())))[-2])",
    "code-29": (
        "from collections import Counter\n"
        "for c, k in sorted(Counter(ch for ch in input() if 'a' <= ch <= 'z').items()):\n"
        "    print(c, k)"
    ),
}


def _problems() -> list[dict]:
    return [json.loads(ln) for ln in DATA.read_text().splitlines() if ln.strip()]


def test_every_problem_has_a_reference_that_passes_all_cases():
    problems = _problems()
    assert [p["id"] for p in problems] == sorted(REFERENCES)
    jobs = [(REFERENCES[p["id"]], p["verification_info"]["test_cases"]) for p in problems]
    scores = score_many(jobs, timeout=5)
    failed = [p["id"] for p, s in zip(problems, scores) if s != 1.0]
    assert failed == []


def test_a_wrong_reference_is_caught():
    """Give ten problems their neighbour's reference: each must then fail a case (some pass others by chance)."""
    problems = _problems()[:11]
    ids = [p["id"] for p in problems]
    jobs = [
        (REFERENCES[ids[(i + 1) % len(ids)]], p["verification_info"]["test_cases"])
        for i, p in enumerate(problems[:10])
    ]
    scores = score_many(jobs, timeout=5)
    assert len(scores) == 10 and all(s < 1.0 for s in scores)
