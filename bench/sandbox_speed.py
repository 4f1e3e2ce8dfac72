"""Sandbox throughput: completions scored per second through the `code` reward, for a typical
short program (a correct solution to a problem with 3 stdin/stdout test cases, i.e. three
sandbox runs per completion), sequentially (1 worker) and with the pool (the reward's default,
one worker per CPU, and twice that). Not a test.

    python bench/sandbox_speed.py [N] [isolation ...]

N completions per measurement (default 24); isolation levels to measure (default: the one
`auto` picks, plus `uid` when running as root). Prints one line per (level, workers).
"""

from __future__ import annotations

import os
import sys
import time

from grpokit.rewards import get_reward_funcs
from grpokit.sandbox import default_workers, resolve_isolation, run_python, sandbox_info

PROGRAM = """\
import sys
words = sys.stdin.read().split()
counts = {}
for w in words:
    counts[w] = counts.get(w, 0) + 1
best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
print(best[0], best[1])
"""
CASES = [
    {"input": "a b a\n", "output": "a 2"},
    {"input": "x y z y z z\n", "output": "z 3"},
    {"input": "q\n", "output": "q 1"},
]


def measure(n: int, isolation: str, workers: int) -> tuple[float, float]:
    fn = get_reward_funcs([{"code": {"workers": workers, "isolation": isolation}}])[0]
    text = [{"role": "assistant", "content": f"```python\n{PROGRAM}```"}]
    info = {"language": "python", "test_cases": CASES}
    t = time.perf_counter()
    scores = fn(prompts=["p"] * n, completions=[text] * n, verification_info=[info] * n)
    dt = time.perf_counter() - t
    assert scores == [1.0] * n, scores
    return n / dt, dt * 1000 / (n * len(CASES))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    levels = sys.argv[2:] or [resolve_isolation()] + (["uid"] if os.geteuid() == 0 else [])
    print(f"{os.cpu_count()} CPUs; {n} completions x {len(CASES)} test cases each")
    for level in dict.fromkeys(levels):
        info = sandbox_info(level)
        run_python("print(1)", isolation=level)  # warm caches
        print(f"isolation={level} seccomp={info['seccomp']}")
        for workers in dict.fromkeys([1, default_workers(), 2 * default_workers()]):
            per_s, ms_run = measure(n, level, workers)
            print(
                f"  workers={workers}: {per_s:6.1f} completions/s  "
                f"({ms_run:5.1f} ms per sandbox run, amortised)"
            )


if __name__ == "__main__":
    main()
