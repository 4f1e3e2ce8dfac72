"""Reward models: a sequence-classification model (num_labels=1) as a ``reward_funcs`` entry.

An entry that is not a registered reward or a plugin is a reward model when it names

- a local directory whose ``config.json`` is a sequence classifier (``architectures`` ending
  in ``ForSequenceClassification``, or a ``problem_type``), or
- a hub id ``org/name`` (loaded from the hub cache or the hub; when neither has it, a
  one-line error says why).

Scoring is TRL's (``GRPOTrainer._calculate_rewards`` for an ``nn.Module`` reward): with chat
prompts, the conversation (prompt messages, then the completion as an assistant message) is
rendered by the reward model's own tokenizer and chat template; plain prompts are joined to
the completion text. The texts are tokenized without added special tokens, padded on the
right, run through the model in one batch in inference mode on the training device, and the
reward is ``logits[:, 0]``. As in TRL a tokenizer without a pad token pads with its EOS and
the model's ``config.pad_token_id`` is set to the tokenizer's. Unlike TRL (which never
truncates), an input longer than the model's maximum length (the smaller of the tokenizer's
``model_max_length`` and the model's ``max_position_embeddings``) is cut from the left: the
start of the prompt goes and the completion's end, whose last token the classifier reads,
stays (cut on the right, every long input would be scored on its prompt alone). The count
is logged and, in training, is the metric ``reward_model_truncated``. ``reward_processing_classes`` (TRL's key) overrides the
tokenizer.

Heavy imports (torch, transformers, grpokit.models) happen only when a model is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from grpokit.rewards.text import completion_text

log = logging.getLogger("grpokit")

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TOKENIZER_LIMIT = 10**9  # transformers' "no limit" model_max_length is ~1e30


def _config(path: Path) -> dict | None:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None


def is_classifier_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    return any(str(a).endswith("ForSequenceClassification") for a in archs) or bool(
        config.get("problem_type")
    )


def names_reward_model(spec: str) -> bool:
    """Whether a (non-registered, non-plugin) ``reward_funcs`` entry is meant as a reward
    model: a local directory, or a hub id ``org/name``."""
    if Path(spec).expanduser().is_dir():
        return True
    return bool(HUB_ID.match(spec)) and not spec.endswith(".py")


def _error(message: str) -> Exception:
    from grpokit.models import ModelSourceError

    return ModelSourceError(message)


def _hub_unavailable() -> str | None:
    """Why nothing can come from the hub now, or None when it can."""
    from grpokit.models import hub_reachable

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return "HF_HUB_OFFLINE is set"
    if not hub_reachable(3.0):
        return "the hub is unreachable (no connection within 3s)"
    return None


def resolve(spec: str, kind: str = "reward model") -> str:
    """A local directory, a hub-cache snapshot, or (hub reachable) the hub id itself."""
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file() and kind == "reward model":
            raise _error(
                f"reward_funcs entry {spec!r} is a directory without config.json; a reward "
                "model is a saved AutoModelForSequenceClassification directory"
            )
        return str(p)
    if spec.startswith((".", "/", "~")) or not HUB_ID.match(spec):
        raise _error(f"{kind} {spec!r}: no such directory (and not a hub id org/name)")
    from huggingface_hub import try_to_load_from_cache

    wanted = "config.json" if kind == "reward model" else "tokenizer_config.json"
    cached = try_to_load_from_cache(spec, wanted)
    if isinstance(cached, str):
        return str(Path(cached).parent)
    why = _hub_unavailable()
    if why:
        what = (
            "is not a registered reward, a plugin (module:Name) or a local directory, and"
            if kind == "reward model"
            else "is not a local directory and"
        )
        raise _error(
            f"{kind} {spec!r} {what} cannot come from the hub: {why}; give a local directory "
            "or make the hub reachable"
        )
    return spec


def _check_classifier(spec: str, config) -> None:
    as_dict = {"architectures": config.architectures, "problem_type": config.problem_type}
    if not is_classifier_config(as_dict):
        raise _error(
            f"reward_funcs entry {spec!r} is a {', '.join(config.architectures or ['?'])} "
            "model, not a sequence classifier; a reward model is an "
            "AutoModelForSequenceClassification with num_labels=1"
        )
    if config.num_labels != 1:
        raise _error(
            f"reward model {spec!r} has {config.num_labels} labels; a reward model scores with "
            "one (num_labels=1)"
        )


def load_tokenizer(spec, trust_remote_code: bool = False):
    """A tokenizer object as is; a directory or hub id loaded with AutoTokenizer."""
    if not isinstance(spec, str):
        return spec
    from transformers import AutoTokenizer

    path = resolve(spec, "reward processing class")
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def load_reward_model(
    spec: str,
    *,
    processing_class=None,
    device: Any = "cpu",
    dtype: str = "float32",
    trust_remote_code: bool = False,
) -> RewardModel:
    """The reward callable of the sequence classifier ``spec`` (directory or hub id)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from grpokit.models import _DTYPES

    path = resolve(spec)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:  # not on the hub, no access, unreadable config
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise _error(f"reward model {spec!r} cannot be loaded: {first}") from e
    _check_classifier(spec, config)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code
    )
    tok = load_tokenizer(
        processing_class if processing_class is not None else path, trust_remote_code
    )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.config.pad_token_id = tok.pad_token_id
    model.to(torch.device(device)).eval()
    model.requires_grad_(False)
    return RewardModel(model, tok, name=spec.rstrip("/").split("/")[-1])


def max_length(model, tokenizer) -> int | None:
    """The longest input the model takes: the smaller of the tokenizer's and the model's."""
    limits = [getattr(tokenizer, "model_max_length", None)]
    limits.append(getattr(model.config, "max_position_embeddings", None))
    limits = [n for n in limits if isinstance(n, int) and 0 < n < _TOKENIZER_LIMIT]
    return min(limits) if limits else None


def is_conversational(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


class RewardModel:
    """``f(prompts, completions, **columns) -> list[float]`` scoring with a classifier.

    ``last_truncated`` is how many inputs of the last call were cut to ``max_length``.
    """

    def __init__(self, model, tokenizer, name: str):
        self.model, self.tokenizer = model, tokenizer
        self.__name__ = name
        self.max_length = max_length(model, tokenizer)
        self.last_truncated = 0

    def texts(self, prompts: list, completions: list) -> list[str]:
        if is_conversational(prompts[0]):
            out = []
            for p, c in zip(prompts, completions):
                reply = c if is_conversational(c) else [{"role": "assistant", "content": c}]
                out.append(self.tokenizer.apply_chat_template(list(p) + reply, tokenize=False))
            return out
        return [str(p) + completion_text(c) for p, c in zip(prompts, completions)]

    def encode(self, texts: list[str]):
        """Right-padded input ids and attention mask, each row's last ``max_length`` tokens."""
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        limit, cut = self.max_length, 0
        if limit is not None:
            cut = sum(len(x) > limit for x in ids)
            ids = [x[-limit:] for x in ids]
        self.last_truncated = cut
        if cut:
            log.warning(
                "reward model %s: %d of %d inputs longer than its maximum length %d were cut",
                self.__name__,
                cut,
                len(ids),
                limit,
            )
        return self.tokenizer.pad(
            {"input_ids": ids}, padding=True, padding_side="right", return_tensors="pt"
        )

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        import torch

        enc = self.encode(self.texts(prompts, completions))
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            out = self.model(
                input_ids=enc["input_ids"].to(device),
                attention_mask=enc["attention_mask"].to(device),
            )
        return out.logits[:, 0].float().cpu().tolist()
