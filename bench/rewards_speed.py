"""Reward speed: milliseconds per completion for every built-in, on N realistic completions
(default 1,000; math-verify rewards on min(N, 200)). Not a test.

    python bench/rewards_speed.py [N]

math-verify rewards are reported apart, with the worker process's cost measured against
grading the same samples in this process's main thread (the peer), in the same run.
"""

from __future__ import annotations

import random
import sys
import time

from grpokit.rewards import get_reward_funcs, registered_rewards
from grpokit.rewards.mathgrade import GRADER, grade_one
from grpokit.rewards.registry import lookup

MATH_VERIFY = {"accuracy", "length", "cosine"}
ALIASES = {"soft_overlong_punishment"}


def completions(n: int, rng: random.Random) -> tuple[list, dict]:
    comps, cols = [], {"answer": [], "solution": [], "nums": [], "target": [], "completion_ids": []}
    for i in range(n):
        a, b, c = rng.randint(1, 99), rng.randint(1, 99), rng.randint(1, 9)
        gold = (a + b) * c
        said = gold if i % 3 else gold + 1
        steps = "\n".join(
            [
                f"Step 1: add {a} and {b} to get {a + b}.",
                f"Step 2: multiply {a + b} by {c}.",
                f"Step 3: so the result is {said}.",
            ]
        )
        if i % 2:
            text = f"<think>\n{steps}\n</think>\n<answer>\n({a} + {b}) * {c} = {said}\n</answer>"
        else:
            text = f"{steps}\nThe final answer is $\\boxed{{{said}}}$."
        comps.append([{"role": "assistant", "content": text}])
        cols["answer"].append(str(gold))
        cols["solution"].append(f"${gold}$")
        cols["nums"].append([a, b, c])
        cols["target"].append(gold)
        cols["completion_ids"].append(list(range(len(text) // 4)))
    return comps, cols


def timed(fn, m: int, comps, cols) -> float:
    sub = {k: v[:m] for k, v in cols.items()}
    t = time.perf_counter()
    fn(prompts=["p"] * m, completions=comps[:m], **sub)
    return (time.perf_counter() - t) * 1000 / m


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    m = min(n, 200)
    comps, cols = completions(n, random.Random(0))
    names = [
        x
        for x in registered_rewards()
        if x not in ALIASES and lookup(x)[0].__module__.startswith("grpokit.rewards")
    ]
    GRADER.grade([("accuracy", "$1$", "$1$")])  # start the worker outside the timings

    print(f"{'reward':<22}{'ms / completion':>16}")
    cheap = 0.0
    for name in names:
        if name in MATH_VERIFY:
            continue
        (fn,) = get_reward_funcs([name])
        ms = timed(fn, n, comps, cols)
        cheap += ms
        print(f"{name:<22}{ms:>16.4f}")
    print(f"{'all of the above':<22}{cheap:>16.4f}   ({n} completions)")

    print(f"\nmath-verify rewards, {m} completions (each grades every completion once):")
    total = 0.0
    for name in sorted(MATH_VERIFY):
        (fn,) = get_reward_funcs([name])
        ms = timed(fn, m, comps, cols)
        total += ms
        print(f"{name:<22}{ms:>16.4f}")
    print(f"{'all three':<22}{total:>16.4f}")

    texts = [c[0]["content"] for c in comps[:m]]
    jobs = [("accuracy", t, g) for t, g in zip(texts, cols["solution"][:m])]
    t = time.perf_counter()
    GRADER.grade(jobs)
    worker = (time.perf_counter() - t) * 1000 / m
    for job in jobs:  # warm this process's gold cache, as the worker's already is
        grade_one(*job)
    t = time.perf_counter()
    for job in jobs:  # the peer: the same work in this process's main thread
        grade_one(*job)
    inproc = (time.perf_counter() - t) * 1000 / m
    print(
        f"\naccuracy grading: worker process {worker:.3f} ms vs in-process {inproc:.3f} ms "
        f"per completion (ratio {worker / inproc:.2f})"
    )


if __name__ == "__main__":
    main()
