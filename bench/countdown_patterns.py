"""Does a Countdown model choose its operators, or write one template? Not a test.

    python bench/countdown_patterns.py RECIPE MODEL [MODEL ...] [--limit N] [--data_seed S]

Generates greedy completions for RECIPE's held-out problems (its task, task_params, system
prompt and data seed, as training evaluates them; pass ``--data_seed`` when the run got one
on its command line, as ``bench/learning.py --data_seed 42`` does) with each MODEL (a run's
``final`` directory, a checkpoint, or a hub id), and prints, per model:

- success and format rate (the task's own grader, as ``grpokit eval``);
- the answers' shapes (numbers replaced by ``n``: ``n + n``, ``n - n * n``) and how many of
  each were correct, as a share next to the share of ALL these problems that shape solves
  when written blindly (numbers in whatever order works): a shape right more often than
  that is chosen per problem, not by habit;
- the **fixed-pattern ceiling**: the share of these problems that the best single
  left-to-right pattern of operators (the numbers in the given order) solves. A model that
  writes one pattern cannot score above it; success above it, or successes on problems that
  pattern cannot solve, is a choice of operators made per problem.

A reward can rise from 0 only because one template happens to be right on a share of the
targets (README, "Countdown in miniature"); this is how to tell.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpokit.config import build_config  # noqa: E402
from grpokit.evaluation import evaluate  # noqa: E402
from grpokit.models import load_model_and_tokenizer  # noqa: E402
from grpokit.rewards import get_reward_funcs  # noqa: E402
from grpokit.rewards.countdown import arith_eval, first_answer  # noqa: E402
from grpokit.rollout.hf import HFRolloutEngine  # noqa: E402
from grpokit.setup import build_task  # noqa: E402


def shape(equation: str | None) -> str:
    """``13*2`` and ``13 * 2`` alike: ``n * n``."""
    if equation is None:
        return "(no answer)"
    flat = re.sub(r"\d+", "n", "".join(equation.split()))
    return re.sub(r"([-+*/])", r" \1 ", flat)


def solving_patterns(nums: list[int], target: int) -> set[tuple[str, ...]]:
    """The left-to-right operator sequences that make ``target`` from ``nums`` in order."""
    found = set()
    for ops in itertools.product("+-*/", repeat=len(nums) - 1):
        expr = str(nums[0]) + "".join(f" {o} {x}" for o, x in zip(ops, nums[1:]))
        try:
            if abs(arith_eval(expr) - target) < 1e-5:
                found.add(ops)
        except ZeroDivisionError:
            pass
    return found


def base_rate(rows: list[dict], shape_: str) -> float | None:
    """The share of ``rows`` that writing ``shape_`` blindly would solve (numbers in whatever
    order works), or None for a shape with brackets or no operators. A model whose answers of
    this shape are right more often than this chooses it per problem, not by habit."""
    flat = shape_.replace(" ", "")
    if not re.fullmatch(r"n(?:[-+*/]n)+", flat):
        return None
    ops = tuple(re.findall(r"[-+*/]", flat))
    fits = [r for r in rows if len(r["nums"]) == len(ops) + 1]
    hit = sum(
        any(
            ops in solving_patterns(list(p), r["target"]) for p in itertools.permutations(r["nums"])
        )
        for r in fits
    )
    return hit / len(fits) if fits else None


def ceiling(rows: list[dict]) -> tuple[tuple[str, ...], float, list[bool]]:
    """The best fixed pattern, the share of ``rows`` it solves, and which rows it solves."""
    hits = [solving_patterns(r["nums"], r["target"]) for r in rows]
    counts = Counter(p for h in hits for p in h)
    if not counts:
        return (), 0.0, [False] * len(rows)
    best, n = counts.most_common(1)[0]
    return best, n / len(rows), [best in h for h in hits]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--limit", type=int, default=None, help="held-out problems (recipe's)")
    ap.add_argument(
        "--data_seed",
        type=int,
        default=None,
        help="the run's data_seed, if given on its command line (default: recipe's)",
    )
    args = ap.parse_args()
    raw = yaml.safe_load(Path(args.recipe).read_text())
    if args.data_seed is not None:
        raw["data_seed"] = args.data_seed
    keep = ("task", "task_params", "system_prompt", "seed", "data_seed")
    cfg = build_config({k: raw[k] for k in keep if k in raw}, source=args.recipe)
    if cfg.task != "countdown":
        raise SystemExit(f"{args.recipe}: task {cfg.task!r}; this bench reads countdown answers")
    task = build_task(cfg)
    rows = task.build("test", limit=args.limit or raw.get("max_eval_samples"))
    best, share, solved_by_best = ceiling(rows)
    print(
        f"{len(rows)} held-out problems; best fixed pattern "
        f"{' '.join(('n',) + tuple(f'{o} n' for o in best))}: solves {share:.0%} of them"
    )
    for spec in args.models:
        model, tok, _ = load_model_and_tokenizer(spec, dtype="float32")
        res = evaluate(
            HFRolloutEngine(model, tok),
            task,
            rows,
            get_reward_funcs(list(task.default_reward_funcs)),
            batch_size=50,
            max_new_tokens=int(raw.get("max_completion_length", 256)),
            keep_examples=len(rows),
        )
        shapes, right = Counter(), Counter()
        beyond = 0
        for ex, by_best in zip(res["examples"], solved_by_best):
            s = shape(first_answer(ex["completion"]))
            shapes[s] += 1
            right[s] += ex["correct"]
            beyond += ex["correct"] and not by_best
        print(
            f"\n{spec}: success {res['accuracy']:.0%} (ceiling of one pattern {share:.0%}), "
            f"format {res['format_rate']:.0%}; correct where the best pattern fails: "
            f"{beyond} of {solved_by_best.count(False)}"
        )
        for s, n in shapes.most_common(8):
            base = base_rate(rows, s)
            blind = "" if base is None else f" ({right[s] / n:.0%}; written blindly: {base:.0%})"
            print(f"  {n:4d} x {s[:50]:<50} correct {right[s]}{blind}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
