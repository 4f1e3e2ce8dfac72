"""Reward speed: milliseconds per completion for every built-in, on 1,000 realistic
completions. Not a test.   python bench/rewards_speed.py [N]"""

from __future__ import annotations

import random
import sys
import time

from grpokit.rewards import get_reward_funcs, registered_rewards

MATH_VERIFY = {"accuracy", "length", "cosine"}


def completions(n: int, rng: random.Random) -> tuple[list, dict]:
    comps, cols = [], {"answer": [], "solution": [], "nums": [], "target": [], "completion_ids": []}
    for i in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        gold = a + b if i % 3 else a + b + 1
        body = "\n".join(
            f"Step {k}: add the tens and the units of {a} and {b}." for k in range(1, 4)
        )
        text = (
            f"<think>\n{body}\n</think>\n<answer>\n{gold}\n</answer>"
            if i % 2
            else f"{a} + {b} = {gold}. " * 3
        )
        comps.append([{"role": "assistant", "content": text}])
        cols["answer"].append(str(a + b))
        cols["solution"].append(f"${a + b}$")
        cols["nums"].append([a, b])
        cols["target"].append(a + b)
        cols["completion_ids"].append(list(range(len(text) // 4)))
    return comps, cols


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    comps, cols = completions(n, random.Random(0))
    prompts = ["p"] * n
    total_cheap = 0.0
    print(f"{'reward':<24}{'ms / completion':>16}")
    for name in registered_rewards():
        (fn,) = get_reward_funcs([name])
        m = n if name not in MATH_VERIFY else min(n, 200)
        sub = {k: v[:m] for k, v in cols.items()}
        t = time.perf_counter()
        fn(prompts=prompts[:m], completions=comps[:m], **sub)
        ms = (time.perf_counter() - t) * 1000 / m
        if name not in MATH_VERIFY:
            total_cheap += ms
        print(f"{name:<24}{ms:>16.4f}{'   (math-verify)' if name in MATH_VERIFY else ''}")
    print(f"{'all but math-verify':<24}{total_cheap:>16.4f}")


if __name__ == "__main__":
    main()
