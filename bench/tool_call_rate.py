"""How often a model calls a tool before any training (docs/tools.md): the arithmetic task
(3-digit), ``tools: [calculator]``, ``chat_template: chatml_tools``, sampled completions
through grpokit's multi-turn loop; prints the fraction that made a call.

    OMP_NUM_THREADS=1 python bench/tool_call_rate.py [--model M] [--prompts 8] [--G 4]
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

SYSTEM_PROMPTS = {
    "example": (
        'Use the calculator tool for arithmetic. Call it like this: <tool_call>{"name": '
        '"calculator", "arguments": {"expression": "12 * 34"}}</tool_call> Then give the final '
        "number inside <answer></answer> tags."
    ),
    "must": "You must call the calculator tool before answering. Start your reply with <tool_call>",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--G", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    model, tok, _ = load_model_and_tokenizer(
        args.model, chat_template=named_chat_template("chatml_tools")
    )
    model.eval()
    engine = HFRolloutEngine(model, tok)
    agent = Agent(
        tok, load_tools(["calculator"]), max_iterations=2, vocab_size=model.config.vocab_size
    )
    params = SamplingParams(max_new_tokens=64, temperature=args.temperature)
    for name, system in SYSTEM_PROMPTS.items():
        task = get_task(
            "arithmetic", system_prompt=system, seed=0, digits=3, train_size=64, test_size=16
        )
        rows = list(task.build("train", limit=args.prompts))
        t0 = time.time()
        ro = agent.rollout(engine, rows, args.G, params)
        calls = sum(e.calls > 0 for e in ro.episodes)
        print(
            f"{name}: {calls}/{len(ro.episodes)} completions called a tool ({time.time() - t0:.0f} s)"
        )


if __name__ == "__main__":
    main()
