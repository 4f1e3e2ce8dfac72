"""A model's shape from its config.json, without loading weights: what the parameter count
and the memory estimate need."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Shapes of the recipe models, used only when their config.json cannot be read (offline, not
# in the hub cache). Taken from each model's config.json on the hub.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-1.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    ),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    ),
    "Qwen/Qwen2.5-3B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008,
        num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    ),
    "HuggingFaceTB/SmolLM-135M-Instruct": dict(
        model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    ),
    "HuggingFaceTB/SmolLM2-135M-Instruct": dict(
        model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    ),
}  # fmt: skip


class PlanError(ValueError):
    """The model's shape cannot be read; the message says why and what to do."""


# transformers' classes whose MLP is Llama's gated one (``grpokit.speed.layers``)
GATED_SILU_MODEL_TYPES = frozenset(
    ("llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo", "olmo2")
)
# ... and whose RMSNorm is Llama's (OLMo's are not; Gemma's scales by 1 + weight)
LLAMA_NORM_MODEL_TYPES = frozenset(("llama", "mistral", "qwen2", "qwen3", "smollm3"))


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a decoder-only transformer's config.json."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3-style per-head RMSNorm on q and k
    gated_silu: bool = False  # Llama's MLP, down(silu(gate(x)) * up(x)) (speed/layers.py)
    llama_norm: bool = False  # Llama's RMSNorm (speed/layers.py keeps its input only)
    dtype: str = "float32"  # the checkpoint's torch_dtype (used by torch_dtype: auto)
    model_type: str = "llama"
    source: str = ""

    @classmethod
    def from_config(cls, d: dict[str, Any], source: str = "") -> ModelShape:
        text = d.get("text_config")
        if isinstance(text, dict) and "hidden_size" not in d:
            d = {**text, "tie_word_embeddings": d.get("tie_word_embeddings", True)}
        try:
            h, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
            mt = str(d.get("model_type", "llama"))
            shape = cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=h,
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or h // heads),
                intermediate_size=int(d.get("intermediate_size") or 4 * h),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
                qkv_bias=mt == "qwen2" or bool(d.get("attention_bias", False)),
                o_bias=bool(d.get("attention_bias", False)),
                mlp_bias=bool(d.get("mlp_bias", False)),
                qk_norm=mt.startswith("qwen3"),
                gated_silu=mt in GATED_SILU_MODEL_TYPES
                and d.get("hidden_act", "silu") in ("silu", "swish"),
                llama_norm=mt in LLAMA_NORM_MODEL_TYPES,
                dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
                model_type=mt,
                source=source,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"{source}: config.json lacks a decoder field ({e})") from e
        return shape


def read_model_config(spec: str) -> ModelShape:
    """The shape of ``spec`` (hub id, local dir or .gguf) from its config.json, no weights.

    Order: a local directory's config.json; the hub cache's config.json; a GGUF already
    converted by grpokit; ``AutoConfig.from_pretrained`` (network); the built-in shapes of
    the recipe models. Nothing is downloaded except, online, the config itself.
    """
    from grpokit.models import ModelSourceError, resolve_model

    p = Path(spec).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return ModelShape.from_config(_read_json(p / "config.json"), f"{p}/config.json")
    cached = _hub_cached_config(spec)
    if cached:
        return ModelShape.from_config(_read_json(Path(cached)), cached)

    def no_download(requirement: str, dest: Path) -> Path:
        raise ModelSourceError(f"grpokit plan does not download weights ({requirement})")

    why = ""
    try:
        res = resolve_model(spec, downloader=no_download)
        rp = Path(res.path)
        if (rp / "config.json").is_file():
            return ModelShape.from_config(_read_json(rp / "config.json"), f"{rp}/config.json")
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(res.path)
        return ModelShape.from_config(cfg.to_dict(), f"hub {spec} (AutoConfig)")
    except Exception as e:  # offline, unknown repo, gated repo, ...
        why = f"{type(e).__name__}: {e}"
    if spec in KNOWN_CONFIGS:
        return ModelShape.from_config(KNOWN_CONFIGS[spec], f"built-in shape of {spec}")
    raise PlanError(
        f"cannot read the config of {spec!r} without loading it: {why.strip()[:300]}. Give a "
        "local model directory as --model_name_or_path, or make the hub reachable"
    )


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _hub_cached_config(spec: str) -> str | None:
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        got = try_to_load_from_cache(spec, "config.json")
    except Exception:
        return None
    return got if isinstance(got, str) else None
