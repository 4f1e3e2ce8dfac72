"""A round's training data and how its rows are cut into micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.rollout.base import Rollout
from grpokit.speed.prefix import MIN_SHARED_PREFIX, prefix_pays, shared_prefix_length

# fixed cost of one more forward pass, in token positions (measured: 64 split too finely)
FORWARD_COST_TOKENS = 256


@dataclass
class Batch:
    """One round's training data. N = B*G rows, completions of a prompt contiguous."""

    rollout: Rollout
    loss_mask: torch.Tensor  # (N, C) completion mask, zeroed for truncated rows if asked
    advantages: torch.Tensor  # (N,)
    old_logp: torch.Tensor | None  # (N, C), num_iterations > 1: set by the round's first step
    ref_logp: torch.Tensor | None  # (N, C), only when beta > 0


def loss_mask(ro: Rollout, mask_truncated: bool) -> torch.Tensor:
    """(N, C) the tokens the loss trains on: the completion (up to and including its EOS),
    without tool results (context, never trained on), nothing of a truncated completion
    when ``mask_truncated`` (``mask_truncated_completions``)."""
    mask = ro.completion_mask.clone()
    if ro.tool_mask is not None:
        mask *= ro.tool_mask
    if mask_truncated:
        mask[ro.truncated] = 0
    return mask


def split_rows(
    order, plen, clen, group, mb: int, share: bool, max_tokens: int | None = None, common: int = 0
):
    """(cost, micro-batches): ``order`` cut into consecutive pieces of at most ``mb`` rows,
    cut points chosen by dynamic programming to minimise the token positions the forward
    passes compute (with ``share``: each distinct group's prompt once, of which the first
    ``common`` tokens, a prefix every prompt starts with, once for all groups; then one
    token more than the longest completion per row) plus FORWARD_COST_TOKENS per piece.
    ``max_tokens``: no piece of two rows or more computes more token positions than that (a
    longer row alone still runs)."""
    o = order.tolist()
    P, C, g = plen[order].tolist(), clen[order].tolist(), group[order].tolist()
    N = len(o)
    best = [0] + [None] * N
    cut = [0] * (N + 1)
    for i in range(1, N + 1):
        pk = ck = 0
        seen: set[int] = set()
        for j in range(i - 1, max(i - mb, 0) - 1, -1):  # piece o[j:i]
            pk, ck = max(pk, P[j]), max(ck, C[j])
            seen.add(g[j])
            n = i - j
            once = common if prefix_pays(len(seen), common) else 0  # as forward.py decides
            prompts = once + len(seen) * (pk - 1 - once)
            tokens = prompts + n * (ck + 1) if share else n * (pk + ck)
            if max_tokens and n > 1 and tokens > max_tokens:
                break  # more rows only add positions
            c = best[j] + tokens + FORWARD_COST_TOKENS
            if best[i] is None or c < best[i]:
                best[i], cut[i] = c, j
    pieces, i = [], N
    while i > 0:
        pieces.append(order[cut[i] : i])
        i = cut[i]
    return best[N], pieces[::-1]


def _by_group(clen: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Rows ordered by completion length inside whole groups, groups by their longest."""
    N = clen.shape[0]
    by_group = torch.argsort(clen, descending=True, stable=True)
    gmax = torch.zeros(int(group.max()) + 1, dtype=clen.dtype, device=clen.device)
    gmax = gmax.scatter_reduce(0, group, clen, "amax")
    key = gmax[group[by_group]] * (N + 1) - group[by_group]
    return by_group[torch.argsort(key, descending=True, stable=True)]


class MicroBatchPlan:
    """Row indices of each micro-batch (at most ``size`` rows) of a rollout.

    The loss sums are the same in any partition except ``bnpo``'s per-micro-batch mean
    (``keep_order``: consecutive rows, full micro-batches). ``fixed``: every process must run
    the same number of forwards and backwards (sharded engines): rows sorted by length, cut
    every ``size``. Otherwise rows are ordered and split to make the forward passes cheap:
    each micro-batch pads to its own longest prompt and completion, and with ``share``
    (the shared-prompt forward) each distinct prompt in it runs once, a prefix common to all
    prompts once for them all. For three orders (by total length, by completion length,
    whole groups by their longest completion) the split points are chosen by dynamic
    programming to minimise the token positions computed plus a fixed cost per forward
    pass, and the cheapest order is used.

    ``max_tokens`` (``max_micro_batch_tokens``) bounds the token positions of one forward in
    those splits: longer completions mean more, smaller micro-batches, so the activations a
    backward holds stay bounded whatever the length. It changes no number (the loss sums do
    not depend on the partition); ``keep_order`` and ``fixed`` plans ignore it (their row
    counts are part of the loss, or must match across processes).

    ``max_rows`` (default ``size``): the most rows one forward of those splits holds. More
    than ``size`` merges micro-batches (``merge_micro_batches``): fewer, larger forwards,
    none of more positions than ``max_tokens`` nor than one micro-batch of ``size`` rows
    padded to the step's longest prompt and longest completion: what each of TRL's forwards
    holds for the same rollout, and a bound no unmerged piece exceeds. So merging needs no
    more activation memory than a micro-batch of the user's size padded as TRL pads it."""

    def __init__(
        self,
        size: int,
        group_size: int,
        *,
        share: bool,
        fixed: bool = False,
        max_tokens: int | None = None,
        max_rows: int | None = None,
        min_shared_prefix: int = MIN_SHARED_PREFIX,
    ):
        self.size, self.group_size, self.share, self.fixed = size, group_size, share, fixed
        self.max_tokens, self.min_shared_prefix = max_tokens, min_shared_prefix
        self.max_rows = max_rows

    def __call__(self, ro: Rollout, keep_order: bool = False) -> list[torch.Tensor]:
        N, mb = ro.completion_ids.shape[0], self.size
        if keep_order:
            order = torch.arange(N, device=ro.completion_ids.device)
            return [order[s : s + mb] for s in range(0, N, mb)]
        plen = ro.prompt_mask.sum(-1)
        clen = ro.completion_mask.sum(-1)
        if self.fixed:
            order = torch.argsort(plen + clen, descending=True, stable=True)
            return [order[s : s + mb] for s in range(0, N, mb)]
        group = torch.arange(N, device=clen.device) // max(1, self.group_size)
        common = 0  # the prefix the shared-prompt forward computes once (forward.py)
        if self.share and self.min_shared_prefix:
            common = shared_prefix_length(ro.prompt_ids[:, :-1], ro.prompt_mask[:, :-1])
            common = common if common >= self.min_shared_prefix else 0
        candidates = [
            torch.argsort(plen + clen, descending=True, stable=True),
            torch.argsort(clen, descending=True, stable=True),
            _by_group(clen, group),
        ]
        mb, bound = min(max(mb, self.max_rows or mb), N), self.max_tokens
        if mb > self.size:  # merged: within one micro-batch at the step's longest lengths
            padded = self.size * int(plen.max() + clen.max())
            bound = min(bound, padded) if bound else padded
        best = min((split_rows(o, plen, clen, group, mb, self.share, bound, common)
                    for o in candidates), key=lambda r: r[0])  # fmt: skip
        return best[1]
