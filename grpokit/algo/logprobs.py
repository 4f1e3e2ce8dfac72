"""Per-token log-probabilities and entropy without a full (B, T, V) float32 log-softmax."""

from __future__ import annotations

import torch


def selective_log_softmax(
    logits: torch.Tensor, ids: torch.Tensor, chunk_rows: int = 1
) -> torch.Tensor:
    """``log_softmax(logits, -1).gather(-1, ids)`` computed ``chunk_rows`` sequences at a time.

    Args:
        logits: (B, T, V) in any float dtype; each chunk is upcast to float32.
        ids: (B, T) token ids.
    Returns:
        (B, T) float32 log-probabilities.
    At most a (chunk_rows, T, V) float32 temporary exists at once.
    """
    parts = []
    for s in range(0, logits.shape[0], chunk_rows):
        lg = logits[s : s + chunk_rows].float()  # (b, T, V)
        picked = lg.gather(-1, ids[s : s + chunk_rows].unsqueeze(-1)).squeeze(-1)  # (b, T)
        parts.append(picked - torch.logsumexp(lg, dim=-1))
    return torch.cat(parts, dim=0)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = 1) -> torch.Tensor:
    """Entropy of each token's distribution, (B, T, V) -> (B, T) float32, chunked by rows."""
    parts = []
    for s in range(0, logits.shape[0], chunk_rows):
        logp = torch.log_softmax(logits[s : s + chunk_rows].float(), dim=-1)  # (b, T, V)
        parts.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(parts, dim=0)
