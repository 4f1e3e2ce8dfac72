"""The common token prefix of a batch of left-padded prompts (issue 23): the system prompt,
the worked problems of ``task_params.demonstrations``, a tool schema. The decode loop
(``rollout/sampler.py``) runs the prefix through the model once, copies its keys and values
to every row, and prefills only each row's own suffix after it.

Cache layout with a shared prefix of L tokens and suffixes of at most S tokens (row i's
prompt has n_i real tokens, its suffix s_i = n_i - L):

    slot   0 .. L-1          L .. L+S-1                        L+S ..
    row i  prefix (mask 1)   S - s_i masked slots, then suffix  completion

Positions are what they were without sharing (0 .. n_i - 1, the count of real tokens
before), so every query sees the same keys at the same rotary positions as before, in the
same order; only the masked slots moved (from before the prefix to between prefix and
suffix). The logits agree to float rounding (the reductions run over differently laid out
blocks), checked in float32 by ``tests/rollout/test_prefix_sharing.py``.

The prefix is cut one token short of the shortest prompt, so every row keeps at least one
token of its own and its next-token logits come from the suffix pass (a prompt that is
exactly the prefix then shares all but its last token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Below this many common tokens a separate prefix pass saves too little to pay for its
# extra forward call (one per layer stack) and the copy of its keys and values; the
# demonstrations and tool schemas the feature is for are hundreds of tokens.
MIN_SHARED_PREFIX = 16

# The gradient forwards (the policy's and the reference's log-probs, ``forward.py``) run a
# shared prefix once only when that saves this many token positions or more: (distinct
# prompts - 1) x prefix length. There the prefix pass is a third segment a micro-batch
# (prefix, suffixes, completions): each layer runs once more and each weight's gradient
# arrives once more (a cast and an add of every weight). Measured on SmolLM2-135M, bf16, one
# process alternating by step on one rollout (Intel Xeon family 6 model 167): saving 44
# positions (bench/speed.py config (a)) the pass cost training 6.22 vs 5.89 s and reference
# 1.61 vs 1.50 s; saving 105 (recipes/default.yaml, two micro-batches) training 3.26 vs
# 2.90 s; saving 293 (recipes/mini_countdown.yaml) it paid, 3.70 vs 4.00 s.
MIN_PREFIX_SAVING = 192


def prefix_pays(distinct: int, length: int) -> bool:
    """Whether the gradient forwards run a ``length``-token prefix common to ``distinct``
    prompts once (see MIN_PREFIX_SAVING)."""
    return (distinct - 1) * length >= MIN_PREFIX_SAVING


def left_padded_lengths(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """(B,) real-token count of each row when every row is left-padded (its ones form one
    block ending at the last column), else None."""
    P = attention_mask.shape[1]
    lengths = attention_mask.long().sum(-1)
    cols = torch.arange(P, device=attention_mask.device)
    want = cols[None, :] >= (P - lengths)[:, None]
    return lengths if torch.equal(attention_mask.bool(), want) else None


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading real tokens every row's prompt has in common, at most the shortest
    prompt's length minus one (each row keeps a token of its own). 0 for one row, for rows
    that are not left-padded, or when the first tokens already differ."""
    B, P = input_ids.shape
    lengths = left_padded_lengths(attention_mask)
    if B < 2 or lengths is None:
        return 0
    n = int(lengths.min()) - 1
    if n <= 0:
        return 0
    starts = (P - lengths)[:, None]
    heads = input_ids.gather(1, starts + torch.arange(n, device=input_ids.device))  # (B, n)
    differs = (heads != heads[:1]).any(0)  # (n,)
    return int(differs.int().argmax()) if bool(differs.any()) else n


@dataclass(frozen=True)
class PrefixSplit:
    """Left-padded prompts split into the shared prefix and each row's suffix."""

    prefix_ids: torch.Tensor  # (1, L)
    suffix_ids: torch.Tensor  # (B, S) the suffixes, left-padded (masked slots hold anything)
    suffix_mask: torch.Tensor  # (B, S) 1 on each row's suffix tokens
    suffix_pos: torch.Tensor  # (B, S) rotary positions: L + tokens of the suffix before
    lengths: torch.Tensor  # (B,) real tokens per prompt (the next position)

    @property
    def length(self) -> int:
        return self.prefix_ids.shape[1]

    @property
    def width(self) -> int:
        """Cache slots the prompts take: L + S."""
        return self.length + self.suffix_ids.shape[1]


def split_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, L: int) -> PrefixSplit:
    """Split left-padded prompts whose first ``L`` real tokens are common
    (``shared_prefix_length``) into that prefix and the suffixes."""
    B, P = input_ids.shape
    lengths = left_padded_lengths(attention_mask)
    if lengths is None or not 0 < L < int(lengths.min()):
        raise ValueError(f"no shared prefix of {L} tokens with a token of each row after it")
    S = int(lengths.max()) - L
    start = int(P - lengths[0])
    cols = torch.arange(P - S, P, device=input_ids.device)
    suffix_mask = (cols[None, :] >= (P - lengths + L)[:, None]).to(attention_mask.dtype)
    suffix_pos = (suffix_mask.long().cumsum(-1) - 1).clamp(min=0) + L
    return PrefixSplit(
        prefix_ids=input_ids[:1, start : start + L],
        suffix_ids=input_ids[:, P - S :],
        suffix_mask=suffix_mask,
        suffix_pos=suffix_pos,
        lengths=lengths,
    )


def window_allows(config, total_len: int) -> bool:
    """False when the model attends through a sliding window shorter than ``total_len``:
    windows count cache slots, and moving the masked slots between prefix and suffix
    would change which keys fall inside one."""
    if getattr(config, "attention_chunk_size", None):
        return False  # chunked attention also counts slots
    window = getattr(config, "sliding_window", None)
    if window is None or not getattr(config, "use_sliding_window", True):
        return True
    return window >= total_len
