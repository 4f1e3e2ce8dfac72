"""Run by test_tools_colocate.py in its own process (one vLLM engine per process): a
multi-turn run with vLLM colocated. Prints one JSON line of what the test checks."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


class Strings:  # what generate_turn reads of its stops: the strings
    def __init__(self, strings):
        self.strings = strings


def main(model_dir: str, out: str) -> None:
    from grpokit.rollout.base import SamplingParams
    from grpokit.testing import tiny_run_config
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(
        model_dir, out, use_vllm=True, tools=["calculator"], chat_template="chatml_tools",
        max_prompt_length=None, max_completion_length=24, max_steps=2, write_report=False,
        learning_rate=1e-2, vllm_importance_sampling_clip_max=3.0,
    )  # fmt: skip
    tr = GRPOTrainer(cfg)
    tok = tr.tokenizer
    ctx = tok("What is 2 + 3? The answer", add_special_tokens=False)["input_ids"]
    greedy = SamplingParams(max_new_tokens=16, greedy=True)
    free = tr.eval_engine.generate_turn([ctx], greedy, max_new_tokens=16)[0][0]
    stop = tok.decode(free[5:7])
    vl = tr.engine.generate_turn([ctx], greedy, max_new_tokens=16, stops=Strings([stop]))[0]
    first = next(t for t in range(len(free)) if stop in tok.decode(free[: t + 1])) + 1
    # vLLM's log-probs of its turn against the trainer's
    ids = torch.tensor([ctx + vl[0]])
    with torch.no_grad():
        lp = torch.log_softmax(tr.model(ids).logits[0, len(ctx) - 1 : -1], -1)
    ours = lp.gather(-1, ids[0, len(ctx) :, None])[:, 0].tolist()
    result = {
        "free": free, "stop": stop, "vllm_ids": vl[0], "vllm_how": vl[1], "first": first,
        "logp_diff": max(abs(a - b) for a, b in zip(ours, vl[2])), "n_logps": len(vl[2]),
    }  # fmt: skip
    tr.train()
    rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    result["metrics"] = [r for r in rows if "loss" in r]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
