"""DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, section 3.2).

A group whose completions all got the same reward has zero advantage everywhere: it costs a
forward and backward and teaches nothing. With ``dynamic_sampling`` a round drops such
groups and samples more prompts until the step has its full batch: ``prompts_per_step``
groups over all processes. TRL has no dynamic sampling (huggingface/trl#3708); verl's
``filter_groups`` does the same with ``max_num_gen_batches`` (0: no limit).

Processes: each keeps its own groups whole (a group never crosses processes) and every
process samples again while any of them has fewer than its share, so the batch is full on
every process and therefore globally; groups beyond a process's share are discarded, as
verl discards beyond the batch size. When ``max_num_gen_batches`` generation batches did
not fill it, the round is filled with dropped groups (zero advantage, no gradient signal)
and ``dynamic_sampling/filled_groups`` counts them: the step still runs at its full size
instead of stopping the run (verl raises an error there).

How many prompts a generation call draws (``CallSizes``): ``gen_batch_size`` over all
processes (verl's ``data.gen_batch_size``), or by default (0) as many as the informative
rate of the last steps says will fill the step, so most steps need one call instead of two:
one call's fixed costs (the prefill, the decode tail where a few long completions run alone)
are paid once. Groups are kept in the order their prompts were drawn, so the step trains on
the first informative groups of the prompt order, as with one batch at a time.

Exact resume holds as for any round: the loop draws from the same prompt order and RNG,
and checkpoints are written between rounds only (the rate's history is in the checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpokit import distributed as dist
from grpokit.algo.advantages import informative_groups, weighted_sum
from grpokit.rollout.base import Rollout


@dataclass
class Groups:
    """One process's part of a generation batch: its prompt rows, their G completions each,
    the (N, F) rewards of those completions, the seconds spent generating and scoring, and
    (N,) bool: which completions the task's grader calls correct."""

    rows: list
    rollout: Rollout
    rewards: torch.Tensor
    seconds: tuple[float, float] = (0.0, 0.0)
    correct: torch.Tensor | None = None


def select_rows(ro: Rollout, idx: torch.Tensor) -> Rollout:
    """The completions ``idx`` (an index tensor) of ``ro``."""
    s_lp = None if ro.sampling_logps is None else ro.sampling_logps[idx]
    keep = idx.tolist()
    return Rollout(
        ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx],
        ro.completion_mask[idx], ro.truncated[idx], [ro.texts[i] for i in keep], s_lp,
        None if ro.tool_mask is None else ro.tool_mask[idx],
        None if ro.episodes is None else [ro.episodes[i] for i in keep],
    )  # fmt: skip


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Rollouts stacked row-wise: prompts left-padded, completions right-padded to the
    longest (``pad_id`` and mask 0 in the new padding)."""
    if len(parts) == 1:
        return parts[0]
    P = max(r.prompt_ids.shape[1] for r in parts)
    C = max(r.completion_ids.shape[1] for r in parts)

    def left(x, value):
        return F.pad(x, (P - x.shape[1], 0), value=value)

    def right(x, value):
        return F.pad(x, (0, C - x.shape[1]), value=value)

    cat = torch.cat
    s_lp = None
    if all(r.sampling_logps is not None for r in parts):
        s_lp = cat([right(r.sampling_logps, 0.0) for r in parts])
    multi = parts[0].tool_mask is not None  # multi-turn rollouts (all parts alike)
    tool_mask = cat([right(r.tool_mask, 0) for r in parts]) if multi else None
    episodes = [e for r in parts for e in r.episodes] if multi else None
    return Rollout(
        cat([left(r.prompt_ids, pad_id) for r in parts]),
        cat([left(r.prompt_mask, 0) for r in parts]),
        cat([right(r.completion_ids, pad_id) for r in parts]),
        cat([right(r.completion_mask, 0) for r in parts]),
        cat([r.truncated for r in parts]),
        [t for r in parts for t in r.texts],
        s_lp,
        tool_mask,
        episodes,
    )


def _take(g: Groups, groups: torch.Tensor, G: int) -> Groups:
    """The groups ``groups`` (indices, in order) of ``g``."""
    rows_idx = (groups[:, None] * G + torch.arange(G)[None]).reshape(-1)
    rows = [g.rows[i] for i in groups.tolist()]
    correct = None if g.correct is None else g.correct[rows_idx]
    return Groups(rows, select_rows(g.rollout, rows_idx), g.rewards[rows_idx], correct=correct)


def _join(parts: list[Groups], pad_id: int) -> Groups:
    correct = None
    if all(p.correct is not None for p in parts):
        correct = torch.cat([p.correct for p in parts])
    return Groups(
        [r for p in parts for r in p.rows],
        concat_rollouts([p.rollout for p in parts], pad_id),
        torch.cat([p.rewards for p in parts]),
        correct=correct,
    )


# gen_batch_size 0: the informative rate is that of the groups sampled in the last
# RATE_WINDOW steps; a call draws at most AUTO_MAX_CALL times the step's prompts (its KV
# cache is then at most that many times a plain step's).
RATE_WINDOW = 4
AUTO_MAX_CALL = 2


class CallSizes:
    """How many prompts each process draws for each generation call of dynamic sampling.

    ``per_call`` > 0 (``gen_batch_size`` / processes): that many, every call. 0 (auto):
    ceil(missing / rate), ``missing`` the informative groups the step still lacks (the most
    any process lacks) and ``rate`` the informative share of all groups sampled in the last
    ``RATE_WINDOW`` steps (1 before any step), at most ``AUTO_MAX_CALL`` x the step's
    prompts. On the default recipe's CPU a call of 8 prompts costs 1.6x one of 4 and ~2
    calls of 4 were needed a step (``docs/speed.md``). Budget a step: ``max_num_gen_batches``
    calls (0: no limit) and, auto, that many times the step's prompts."""

    def __init__(self, groups_per_rank: int, per_call: int = 0, max_calls: int = 0, limit: int = 0):
        self.groups, self.per_call, self.max_calls = groups_per_rank, per_call, max_calls
        self.limit = limit  # the training prompts of a process (0: no limit)
        self.history: list[tuple[float, float]] = []  # (informative, sampled) groups a step

    def rate(self) -> float:
        informative = sum(h[0] for h in self.history)
        sampled = sum(h[1] for h in self.history)
        return informative / sampled if sampled else 1.0

    def size(self, missing: int, drawn: int) -> int:
        """Prompts of the next call, given the groups still ``missing`` and the prompts
        ``drawn`` this step."""
        if self.per_call:
            return self.per_call
        k = math.ceil(missing / max(self.rate(), 1e-3) - 1e-9)
        if self.max_calls:  # the prompts left of the budget
            k = min(k, self.max_calls * self.groups - drawn)
        k = min(k, AUTO_MAX_CALL * self.groups, self.limit or k)
        return max(1, k)

    def spent(self, calls: int, drawn: int) -> bool:
        if not self.max_calls:
            return False
        return calls >= self.max_calls or (
            not self.per_call and drawn >= self.max_calls * self.groups
        )

    def record(self, informative: float, sampled: float) -> None:
        self.history = [*self.history, (informative, sampled)][-RATE_WINDOW:]

    def state_dict(self) -> dict:
        return {"history": [list(h) for h in self.history]}

    def load_state_dict(self, s: dict | None) -> None:
        self.history = [tuple(h) for h in (s or {}).get("history", [])]


def one_batch(
    generate: Callable[[], Groups], weights: torch.Tensor, group_size: int
) -> tuple[Groups, dict[str, float]]:
    """One generation batch from ``generate`` (no dynamic sampling), with ``sampled_metrics``."""
    g = generate()
    return g, sampled_metrics([g], weights, group_size)


def fill_batch(
    generate: Callable[[int], Groups],
    weights: torch.Tensor,
    group_size: int,
    sizes: CallSizes,
    pad_id: int,
) -> tuple[Groups, dict[str, float]]:
    """Generation calls ``generate(k)`` (k prompts of this process, ``sizes``) until every
    process holds ``sizes.groups`` informative groups (their combined rewards not all
    equal) or the budget is spent; the batch of the first ``sizes.groups`` of them, and the
    metrics ``dynamic_sampling/num_gen_batches`` (calls), ``dynamic_sampling/sampled_prompts``
    (all processes), ``dynamic_sampling/dropped_frac`` (dropped / generated groups) and
    ``dynamic_sampling/filled_groups``."""
    want = sizes.groups
    kept: list[Groups] = []
    dropped: list[Groups] = []
    n_kept = n_batches = drawn = 0
    missing = want
    gen = score = 0.0
    sampled: list[Groups] = []
    while True:
        k = sizes.size(missing, drawn)
        g = generate(k)
        sampled.append(g)
        n_batches, drawn = n_batches + 1, drawn + k
        gen, score = gen + g.seconds[0], score + g.seconds[1]
        good = informative_groups(weighted_sum(g.rewards, weights), group_size)
        kept.append(_take(g, torch.nonzero(good).squeeze(1), group_size))
        dropped.append(_take(g, torch.nonzero(~good).squeeze(1), group_size))
        n_kept += int(good.sum())
        missing = int(dist.all_reduce_max(torch.tensor(float(max(want - n_kept, 0)))).item())
        if missing == 0 or sizes.spent(n_batches, drawn):
            break
    pool = _join(kept + dropped, pad_id)
    n_fill = max(want - n_kept, 0)
    out = _take(pool, torch.arange(want), group_size)
    out.seconds = (gen, score)
    counts = dist.all_reduce_sum(torch.tensor([float(n_kept), float(drawn), float(n_fill)]))
    informative, sampled_prompts, filled = counts.tolist()  # one group a prompt
    sizes.record(informative, sampled_prompts)
    generated = max(sampled_prompts, 1.0)
    metrics = {
        "dynamic_sampling/num_gen_batches": float(n_batches),
        "dynamic_sampling/sampled_prompts": sampled_prompts,
        "dynamic_sampling/dropped_frac": (generated - informative) / generated,
        "dynamic_sampling/filled_groups": filled,
        **sampled_metrics(sampled, weights, group_size),
    }
    return out, metrics


def sampled_metrics(parts: list[Groups], weights: torch.Tensor, G: int) -> dict[str, float]:
    """What the policy did on every group it sampled this step, over all processes: with
    dynamic sampling the dropped groups too, which the trained batch's ``accuracy`` and
    ``frac_reward_zero_std`` never see. ``sampled/accuracy``: completions the task's grader
    calls correct; ``sampled/solved_groups``: groups with all G correct;
    ``sampled/failed_groups``: none correct; ``sampled/stuck_groups``: equal rewards without
    all being correct (the completions agree where the task is not learnt yet: no signal
    there). Empty when the grader was not run."""
    if any(p.correct is None for p in parts):
        return {}
    counts = torch.zeros(5, dtype=torch.float64)
    for p in parts:
        n_ok = p.correct.view(-1, G).sum(dim=1)
        same = ~informative_groups(weighted_sum(p.rewards, weights), G)
        counts += torch.stack(
            [n_ok.sum(), (n_ok == G).sum(), (n_ok == 0).sum(), (same & (n_ok < G)).sum(),
             torch.tensor(n_ok.numel())]
        ).double()  # fmt: skip
    c = dist.all_reduce_sum(counts).tolist()
    groups = max(c[4], 1.0)
    return {
        "sampled/accuracy": c[0] / (groups * G),
        "sampled/solved_groups": c[1] / groups,
        "sampled/failed_groups": c[2] / groups,
        "sampled/stuck_groups": c[3] / groups,
    }
