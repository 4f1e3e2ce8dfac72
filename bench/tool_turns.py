"""A completion with its tool turns (docs/tools.md): SmolLM2-135M-Instruct with
``chat_template: chatml_tools`` and the calculator; the untrained model does not call tools
by itself, so each completion's FIRST turn is given (the call) and the rest is the model's
own, sampled by grpokit's decode loop after the real tool result.

    OMP_NUM_THREADS=1 python bench/tool_turns.py
"""

import torch

from grpokit.models import load_model_and_tokenizer
from grpokit.rollout.agent import Agent
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.tools import load_tools, named_chat_template

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 29"}}\n</tool_call>'


class GivenFirstTurn:
    """The engine, with every completion's first turn ``CALL``."""

    def __init__(self, engine, tok):
        self.engine, self.tok, self.pad_id = engine, tok, engine.pad_id
        self.call = tok(CALL, add_special_tokens=False)["input_ids"]

    def generate_turn(self, contexts, params, *, max_new_tokens, stops=None, num_generations=1):
        if "</tool_response><|im_end|>" in self.tok.decode(contexts[0]):
            return self.engine.generate_turn(
                contexts, params, max_new_tokens=max_new_tokens, stops=stops,
                num_generations=num_generations,
            )  # fmt: skip
        return [(self.call, "stop")] * (len(contexts) * num_generations)


def main() -> None:
    torch.manual_seed(0)
    model, tok, _ = load_model_and_tokenizer(
        "HuggingFaceTB/SmolLM2-135M-Instruct", chat_template=named_chat_template("chatml_tools")
    )
    model.eval()
    engine = GivenFirstTurn(HFRolloutEngine(model, tok), tok)
    agent = Agent(
        tok, load_tools(["calculator"]), max_iterations=2, vocab_size=model.config.vocab_size
    )
    rows = [{"prompt": [{"role": "user", "content": "What is 347 * 29?"}]}]
    ro = agent.rollout(engine, rows, 4, SamplingParams(max_new_tokens=120, temperature=0.7))
    for i, e in enumerate(ro.episodes):
        mask = ro.tool_mask[i, : len(e.ids)].tolist()
        print(f"---- ended {e.ended}, {e.calls} call(s), tool_mask {mask}")
        print(e.transcript)
        print(e.messages)


if __name__ == "__main__":
    main()
