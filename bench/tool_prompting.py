"""Screening prompts for the calculator task (docs/tools.md, "The measured task"): how often
SmolLM2-135M-Instruct calls the calculator before any training, for several ways of asking:
the instruction in the system prompt, the instruction and an example call after the question
in the user message, and a worked demonstration (a different problem solved with the tool) as
earlier chat turns of the prompt. 3-4 digit + and * problems, ``tools: [calculator]``,
``chat_template: chatml_tools``, sampled through grpokit's multi-turn loop.

    OMP_NUM_THREADS=1 python bench/tool_prompting.py [--variants a,b] [--prompts 8] [--G 4]
        [--temperature 1.0]
"""

import argparse
import time

import torch

from grpokit.models import load_model_and_tokenizer
from grpokit.rollout.agent import Agent
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.tasks import get_task
from grpokit.tools import load_tools, named_chat_template

EXAMPLE = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>'
INSTRUCTION = (
    f" Use the calculator tool: {EXAMPLE} Then give the final number in <answer></answer>."
)


def call(expr: str) -> dict:
    fn = {"name": "calculator", "arguments": {"expression": expr}}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": fn}],
    }


def demo(question: str, expr: str, value: str) -> list[dict]:
    """One worked problem as chat turns: the question, the call, the result, the answer."""
    return [
        {"role": "user", "content": question},
        call(expr),
        {"role": "tool", "name": "calculator", "content": value},
        {"role": "assistant", "content": f"<answer>{value}</answer>"},
    ]


DEMO_ADD = demo("What is 4821 + 937?", "4821 + 937", "5758")
DEMO_MUL = demo("What is 612 * 48?", "612 * 48", "29376")
DEMO_ADD2 = demo("What is 356 + 7194?", "356 + 7194", "7550")
DEMO_MUL2 = demo("What is 2307 * 61?", "2307 * 61", "140727")
SYS_EXAMPLE = f"Use the calculator tool for arithmetic. Call it like this: {EXAMPLE}"


def variants(q: str) -> dict[str, list[dict]]:
    user = {"role": "user", "content": q}
    return {
        "sys": [{"role": "system", "content": SYS_EXAMPLE}, user],
        "user": [{"role": "user", "content": q + INSTRUCTION}],
        "demo1": [*DEMO_MUL, user],
        "demo2": [*DEMO_ADD, *DEMO_MUL, user],
        "demo4": [*DEMO_ADD, *DEMO_MUL, *DEMO_ADD2, *DEMO_MUL2, user],
        "demo2_user": [*DEMO_ADD, *DEMO_MUL, {"role": "user", "content": q + INSTRUCTION}],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--variants", default="sys,user,demo1,demo2,demo2_user")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--G", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--show", type=int, default=1)
    args = ap.parse_args()
    model, tok, _ = load_model_and_tokenizer(
        args.model, chat_template=named_chat_template("chatml_tools")
    )
    model.eval()
    engine = HFRolloutEngine(model, tok)
    agent = Agent(
        tok, load_tools(["calculator"]), max_iterations=2, vocab_size=model.config.vocab_size
    )
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    task = get_task(
        "arithmetic", seed=0, ops=["+", "*"], digits=[3, 4], train_size=256, test_size=100
    )
    rows = list(task.build("train", limit=args.prompts))
    for name in args.variants.split(","):
        torch.manual_seed(0)
        vrows = [{**r, "prompt": variants(r["question"])[name]} for r in rows]
        t0 = time.time()
        with torch.no_grad():
            ro = agent.rollout(engine, vrows, args.G, params)
        eps = ro.episodes
        calls = sum(e.calls > 0 for e in eps)
        ok = sum(task.is_correct(t, vrows[i // args.G]) for i, t in enumerate(ro.texts))
        ok_call = sum(
            task.is_correct(t, vrows[i // args.G]) and eps[i].calls > 0
            for i, t in enumerate(ro.texts)
        )
        groups = sum(any(e.calls for e in eps[g : g + args.G]) for g in range(0, len(eps), args.G))
        print(
            f"{name} T={args.temperature}: called {calls}/{len(eps)}, groups with a call "
            f"{groups}/{len(rows)}, correct {ok}/{len(eps)} (with a call {ok_call}), "
            f"{time.time() - t0:.0f} s",
            flush=True,
        )
        shown = sorted(eps, key=lambda e: -e.calls)  # the calling completions first
        print("    questions:", [r["question"] for r in rows])
        for e in shown[: args.show]:
            print("   ", e.ended, len(e.ids), repr(e.transcript[:400]))


if __name__ == "__main__":
    main()
