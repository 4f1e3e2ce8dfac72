"""Parameter counts from a model's shape: the whole model by part, and what LoRA adds."""

from __future__ import annotations

import re

from grpokit.plan.shape import ModelShape

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def param_counts(m: ModelShape) -> dict[str, int]:
    """Parameters by part. h hidden, a/k query/key-value heads, d head_dim, I intermediate:

    embeddings V*h; attention per layer h*a*d (q) + 2*h*k*d (k, v, GQA) + a*d*h (o) + biases;
    MLP per layer 3*h*I (gate, up, down) + biases; norms (2L + 1)*h (+ 2*d per layer with
    q/k norms); lm_head V*h unless tied to the embeddings.
    """
    h, a, k, d, ffn, L = (
        m.hidden_size,
        m.num_heads,
        m.num_kv_heads,
        m.head_dim,
        m.intermediate_size,
        m.num_layers,
    )
    attn = h * a * d + 2 * h * k * d + a * d * h
    attn += (a * d + 2 * k * d) * m.qkv_bias + h * m.o_bias
    mlp = 3 * h * ffn + (2 * ffn + h) * m.mlp_bias
    norms = (2 * L + 1) * h + 2 * d * L * m.qk_norm
    out = {
        "embeddings": m.vocab_size * h,
        "attention": attn * L,
        "mlp": mlp * L,
        "norms": norms,
        "lm_head": 0 if m.tie_word_embeddings else m.vocab_size * h,
    }
    out["total"] = sum(out.values())
    return out


def linear_shapes(m: ModelShape) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each linear layer of one decoder block."""
    h, a, k, d, ffn = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size
    return {
        "q_proj": (h, a * d),
        "k_proj": (h, k * d),
        "v_proj": (h, k * d),
        "o_proj": (a * d, h),
        "gate_proj": (h, ffn),
        "up_proj": (h, ffn),
        "down_proj": (ffn, h),
    }


def lora_param_count(m: ModelShape, r: int, targets: str | list | None = None) -> int:
    """LoRA adds r*(in + out) per targeted linear per layer (A: r x in, B: out x r).

    ``targets`` None or "all-linear" means every linear of the blocks (peft leaves lm_head
    out); a list names modules (q_proj, ...); a string is a regex on the module name.
    """
    shapes = linear_shapes(m)
    if targets in (None, "all-linear"):
        names = list(shapes)
    elif isinstance(targets, str):
        names = [n for n in shapes if re.search(targets, n)]
    else:
        names = [n for n in shapes if n in set(targets)]
    return m.num_layers * sum(r * (shapes[n][0] + shapes[n][1]) for n in names)
