"""One training round's multi-turn rollout of a tool recipe (its per_device_train_batch_size /
num_generations prompts x num_generations completions, sampled at its temperature, seeded),
timed with and without the common-prefix prefill (issue 23, docs/speed.md "Common prompt
prefix"); ``digest`` hashes every completion and is equal when the outputs are.

    OMP_NUM_THREADS=1 python bench/prefix_share.py recipes/calculator_tools.yaml [--rounds 2]
"""

import argparse
import hashlib
import json
import time

import torch

from grpokit.config import load_config
from grpokit.models import load_model_and_tokenizer
from grpokit.rollout.agent import Agent
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.setup import build_task
from grpokit.tools import load_tools, named_chat_template


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe")
    ap.add_argument("--rounds", type=int, default=2, help="rounds timed each way, alternating")
    args = ap.parse_args()
    cfg = load_config(args.recipe)
    G = cfg.num_generations
    rows = list(build_task(cfg).build("train", limit=cfg.per_device_train_batch_size // G))
    model, tok, _ = load_model_and_tokenizer(
        cfg.model_name_or_path, chat_template=named_chat_template(cfg.chat_template)
    )
    model.eval()
    agent = Agent(
        tok, load_tools(list(cfg.tools)), max_iterations=cfg.max_tool_calling_iterations,
        max_prompt_length=cfg.max_prompt_length, vocab_size=model.config.vocab_size,
    )  # fmt: skip
    params = SamplingParams(max_new_tokens=cfg.max_completion_length, temperature=cfg.temperature)
    for r in range(args.rounds):
        for share in (False, True):
            engine = HFRolloutEngine(model, tok, share_prefix=share)
            torch.manual_seed(r)
            t0 = time.time()
            ro = agent.rollout(engine, rows, G, params)
            seconds = time.time() - t0
            ids = [e.ids for e in ro.episodes]
            digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
            calls = sum(e.calls for e in ro.episodes)
            print(json.dumps({"round": r, "share_prompt_prefix": share, "completions": len(ids),
                              "tool_calls": calls, "digest": digest, "seconds": round(seconds, 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
