"""Prompt order (seeded, resumable) and prompt tokenisation."""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("grpokit")


class PromptSampler:
    """Yields global batches of row indices: a seeded permutation per epoch (``shuffle``;
    else the rows in order, TRL's ``shuffle_dataset: false``), read in order.

    Its state (epoch, position) is saved in checkpoints so a resumed run continues with
    exactly the prompts the uninterrupted run would have seen.
    """

    def __init__(self, num_rows: int, batch_size: int, seed: int, shuffle: bool = True):
        if num_rows < batch_size:
            raise ValueError(
                f"the training set has {num_rows} prompts but one step needs {batch_size}; "
                "use more data or fewer prompts per step"
            )
        self.n, self.bs, self.seed, self.shuffle = num_rows, batch_size, seed, shuffle
        self.epoch, self.pos = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.bs

    def next(self, count: int | None = None) -> list[int]:
        """The next ``count`` row indices (default: a step's batch); a new epoch starts when
        fewer are left (the rest dropped, like a DataLoader's last partial batch)."""
        count = count or self.bs
        if count > self.n:
            raise ValueError(
                f"one generation call needs {count} prompts but the training set has "
                f"{self.n}; use more data or a smaller gen_batch_size"
            )
        if self.pos + count > self.n:
            self.epoch += 1
            self.pos = 0
            self._perm = self._permutation(self.epoch)
        out = self._perm[self.pos : self.pos + count]
        self.pos += count
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "n": self.n, "bs": self.bs}

    def load_state_dict(self, s: dict[str, int]) -> None:
        if (s["n"], s["bs"]) != (self.n, self.bs):
            raise ValueError(
                f"checkpoint data order was for {s['n']} prompts in batches of {s['bs']}, "
                f"this run has {self.n} in batches of {self.bs}"
            )
        self.seed, self.epoch, self.pos = s["seed"], s["epoch"], s["pos"]
        self._perm = self._permutation(self.epoch)


def bind_chat_template_kwargs(tokenizer, kwargs: dict[str, Any]) -> None:
    """Every ``apply_chat_template`` call on ``tokenizer`` from now on renders with
    ``kwargs`` (TRL's ``chat_template_kwargs``, e.g. ``enable_thinking: false``) unless the
    call names them itself: training prompts, held-out evaluation and tool turns alike."""
    if not kwargs:
        return
    render = tokenizer.apply_chat_template

    def apply_chat_template(*args, **kw):
        return render(*args, **{**kwargs, **kw})

    tokenizer.apply_chat_template = apply_chat_template


def render_prompts(tokenizer, prompts: list[str | list[dict[str, str]]]) -> list[str]:
    """Model inputs as text: chat messages through the tokenizer's chat template (with the
    generation prompt); a plain string (TRL's "standard", non-conversational format) as it is."""
    return [
        p
        if isinstance(p, str)
        else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


def prompt_text(prompt: str | list[dict[str, str]]) -> str:
    """What a person reads as the prompt: the string, or the last message's content."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def tokenize_prompts(
    tokenizer,
    texts: list[str],
    max_prompt_length: int | None,
    on_long: str = "truncate",
    counters: dict[str, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (B, P) ids and mask. Prompts over ``max_prompt_length`` tokens keep their
    last tokens (``on_long="truncate"``, counted) or raise (``"error"``)."""
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    if max_prompt_length is not None:
        long = [i for i, e in enumerate(enc) if len(e) > max_prompt_length]
        if long:
            if on_long == "error":
                raise ValueError(
                    f"{len(long)} prompt(s) exceed max_prompt_length={max_prompt_length} tokens "
                    f"(longest {max(len(enc[i]) for i in long)}); raise max_prompt_length or set "
                    "prompt_truncation: truncate"
                )
            if counters is not None:
                counters["truncated_prompts"] = counters.get("truncated_prompts", 0) + len(long)
            log.warning(
                "truncated %d prompt(s) to their last %d tokens", len(long), max_prompt_length
            )
            enc = [e[-max_prompt_length:] for e in enc]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    P = max(len(e) for e in enc)
    ids = torch.full((len(enc), P), pad, dtype=torch.long)
    mask = torch.zeros((len(enc), P), dtype=torch.long)
    for i, e in enumerate(enc):
        if e:
            ids[i, P - len(e) :] = torch.tensor(e)
            mask[i, P - len(e) :] = 1
    return ids, mask


def columns_for_rewards(rows: list[dict[str, Any]], group_size: int) -> dict[str, list]:
    """Every dataset column except the prompt, each value repeated for the G completions."""
    keys = [k for k in rows[0] if k != "prompt"]
    return {k: [r.get(k) for r in rows for _ in range(group_size)] for k in keys}
