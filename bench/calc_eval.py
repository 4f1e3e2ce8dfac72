"""Held-out accuracy and tool-call rate of a model (a trained run's checkpoint or final
directory, or the untrained model) on a recipe's task, greedy, as the trainer's before/after
evaluation computes them: with the recipe's tools through grpokit's multi-turn loop, or
without tools when the recipe has none (docs/tools.md, "The measured task").

    OMP_NUM_THREADS=1 python bench/calc_eval.py RECIPE [--model PATH] [--max_eval_samples 100]
        [--max_completion_length N] [--share_prompt_prefix false]

``--share_prompt_prefix false`` times the decode loop without the common-prefix prefill
(issue 23; docs/speed.md "Common prompt prefix"); ``digest`` is a hash of every completion,
equal with and without it when the outputs are.
"""

import argparse
import hashlib
import json
import time

import torch

from grpokit.config import load_config
from grpokit.evaluation import evaluate
from grpokit.models import load_model_and_tokenizer
from grpokit.rewards import get_reward_funcs
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.setup import build_task
from grpokit.tools import load_tools, named_chat_template


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe")
    ap.add_argument("--model", default=None, help="default: the recipe's model_name_or_path")
    ap.add_argument("--max_eval_samples", type=int, default=100)
    ap.add_argument("--batch_size", type=int, default=50)
    ap.add_argument("--offset", type=int, default=0, help="evaluate rows offset.. of them")
    ap.add_argument("--max_completion_length", type=int, default=None, help="default: recipe's")
    ap.add_argument("--share_prompt_prefix", default="true", choices=["true", "false"])
    args = ap.parse_args()
    cfg = load_config(args.recipe)
    spec = args.model or cfg.model_name_or_path
    task = build_task(cfg)
    rows = list(task.build("test", limit=args.max_eval_samples))[args.offset :]
    model, tok, _ = load_model_and_tokenizer(
        spec, chat_template=named_chat_template(cfg.chat_template)
    )
    model.eval()
    agent = None
    if cfg.tools:
        from grpokit.rollout.agent import Agent

        agent = Agent(
            tok, load_tools(list(cfg.tools)), max_iterations=cfg.max_tool_calling_iterations,
            max_prompt_length=cfg.max_prompt_length, vocab_size=model.config.vocab_size,
        )  # fmt: skip
    funcs = get_reward_funcs(list(cfg.reward_funcs or task.default_reward_funcs))
    engine = HFRolloutEngine(model, tok, share_prefix=args.share_prompt_prefix == "true")
    texts = _record_texts(engine)
    t0 = time.time()
    with torch.no_grad():
        r = evaluate(
            engine, task, rows, funcs, batch_size=args.batch_size,
            max_new_tokens=args.max_completion_length or cfg.max_completion_length,
            max_prompt_length=cfg.max_prompt_length, agent=agent, keep_examples=0,
        )  # fmt: skip
    keys = ("accuracy", "format_rate", "tool_call_rate", "tool_calls", "mean_length")
    out = {k: r[k] for k in keys if k in r}
    out["num_prompts"] = len(rows)
    out["share_prompt_prefix"] = args.share_prompt_prefix
    out["digest"] = hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]
    print(json.dumps({"model": spec, "recipe": args.recipe, **out, "seconds": time.time() - t0}))


def _record_texts(engine) -> list:
    """Every turn's tokens the engine produces, in order (for ``digest``)."""
    seen: list = []
    turn, gen = engine.generate_turn, engine.generate

    def generate_turn(*a, **k):
        out = turn(*a, **k)
        seen.append([seg for seg, *_ in out])
        return out

    def generate(*a, **k):
        ro = gen(*a, **k)
        seen.append(ro.completion_ids.tolist())
        return ro

    engine.generate_turn, engine.generate = generate_turn, generate
    return seen


if __name__ == "__main__":
    main()
