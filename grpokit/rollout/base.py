"""The value that crosses from a rollout engine to the trainer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None  # keep tokens with p >= min_p * max p (None or 0: off)
    repetition_penalty: float = 1.0
    greedy: bool = False
    min_new_tokens: int = 0  # EOS is masked out before this many tokens (benchmarks)


@dataclass
class Rollout:
    """N = B*G completions, the G of one prompt contiguous.

    prompt_ids:      (N, P) left-padded prompt token ids
    prompt_mask:     (N, P) 1 on real prompt tokens
    completion_ids:  (N, C) sampled ids, C <= max_new_tokens, right-padded
    completion_mask: (N, C) 1 up to and including the first EOS (all 1 if truncated)
    truncated:       (N,) bool, no EOS within max_new_tokens
    texts:           N decoded completions (special tokens removed)
    sampling_logps:  (N, C) log-prob of each sampled token under the engine that sampled it
                     (temperature applied), 0 past the mask; None when the engine does not
                     report them (the HF engine samples from the training model itself)
    tool_mask:       (N, C) multi-turn rollouts (``rollout/agent.py``): 1 on tokens the model
                     generated, 0 on tool results and the template tokens around them (in the
                     context, never trained on); None for one-turn rollouts
    episodes:        multi-turn rollouts: each completion's ``agent.Episode`` (its messages,
                     tool calls and failures, environment); None otherwise
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]
    sampling_logps: torch.Tensor | None = None
    tool_mask: torch.Tensor | None = None
    episodes: list | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """(N,) completion lengths in tokens (EOS included; tool results included)."""
        return self.completion_mask.sum(-1)

    @property
    def generated_lengths(self) -> torch.Tensor:
        """(N,) tokens the model generated (tool results left out, as TRL counts them)."""
        if self.tool_mask is None:
            return self.lengths
        return (self.completion_mask * self.tool_mask).sum(-1)

    @property
    def shown_texts(self) -> list[str]:
        """What logs show of each completion: its text, or the whole conversation."""
        if self.episodes is None:
            return self.texts
        return [e.transcript for e in self.episodes]


def completion_mask_from_eos(
    completion_ids: torch.Tensor, eos_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask (N, C) that stops at and includes the first EOS of each row, and (N,) truncated.

    Computed from the position of the first EOS, never from pad ids: for many chat
    models pad == eos, and a mask "ids != pad" would drop the real EOS token.
    """
    N, C = completion_ids.shape
    is_eos = torch.zeros_like(completion_ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= completion_ids == e
    has_eos = is_eos.any(-1)  # (N,)
    first = torch.where(
        has_eos,
        is_eos.int().argmax(-1),
        torch.full((N,), C, dtype=torch.long, device=completion_ids.device),
    )
    mask = (torch.arange(C, device=completion_ids.device)[None] <= first[:, None]).long()
    return mask, ~has_eos
