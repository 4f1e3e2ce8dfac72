"""What the training forward keeps for the backward, in KiB a token a layer. Not a test.

    python bench/kept_activations.py                     # SmolLM2-135M, float32
    python bench/kept_activations.py --tokens 512 --model DIR

For full fine-tuning and LoRA (r 16, all linear layers, dropout 0 and 0.05), with
transformers' / PEFT's own forward and with grpokit's lean layers (``grpokit.speed.layers``):
the distinct tensors autograd saves during one decoder forward of 2 sequences (seen through
``torch.autograd.graph.saved_tensors_hooks``; the model's weights are not counted).
"""

from __future__ import annotations

import argparse
import os

import torch

DEFAULT_MODEL = os.environ.get("GRPOKIT_BENCH_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")


def kept_kib(model, tokens: int, lean: bool) -> float:
    from grpokit.speed.layers import lean_layers

    saved: dict = {}
    params = {p.data_ptr() for p in model.parameters()}

    def pack(t):
        if t.data_ptr() not in params:
            saved[(t.data_ptr(), t.numel(), t.dtype)] = t.numel() * t.element_size()
        return t.detach()

    ids = torch.randint(0, 1000, (2, tokens), generator=torch.Generator().manual_seed(0))
    decoder = model.get_decoder()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), lean_layers(model, lean):
        decoder(input_ids=ids).last_hidden_state.sum().backward()
    return sum(saved.values()) / (2 * tokens * model.config.num_hidden_layers) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    from grpokit.models import local_model_path

    a.model = local_model_path(a.model)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    print("| model | transformers / PEFT forward | grpokit's lean layers |\n| --- | ---: | ---: |")
    for name, dropout in (
        ("full fine-tuning", None),
        ("LoRA r=16, dropout 0", 0.0),
        ("LoRA r=16, dropout 0.05", 0.05),
    ):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
        if dropout is not None:
            lora = LoraConfig(
                r=16, lora_alpha=32, lora_dropout=dropout, target_modules="all-linear"
            )
            model = get_peft_model(model, lora)
        model.train()
        plain, lean = (kept_kib(model, a.tokens, lean) for lean in (False, True))
        print(f"| {name} | {plain:.1f} | {lean:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
