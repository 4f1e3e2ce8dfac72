"""GRPO batch arithmetic, as the trainer does it: completions, prompts and steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from grpokit.config import GRPOConfig


@dataclass
class BatchPlan:
    num_processes: int
    num_generations: int
    micro_batch: int  # completions per forward/backward, per process
    gradient_accumulation_steps: int
    completions_per_step: int  # all processes
    prompts_per_step: int
    generation_batch: int  # completions generated in one call, per process
    prompts_per_process: int
    optimizer_steps: int | None  # None: epochs of a dataset of unknown size
    steps_per_epoch: int | None
    train_rows: int | None
    max_tokens_generated: int | None
    divisible: bool
    notes: list[str] = field(default_factory=list)


def batch_plan(cfg: GRPOConfig, num_processes: int, train_rows: int | None) -> BatchPlan:
    """GRPO batch arithmetic, as the trainer does it.

    completions/step = per_device_train_batch_size x gradient_accumulation_steps x processes;
    prompts/step = that / G; each process generates its prompts x G completions in one call;
    rounds/epoch = train rows // prompts/step (the last partial batch is dropped); each round
    makes num_iterations optimizer steps; tokens generated <= rounds x completions/step x
    max_completion_length.
    """
    G, mb, ga = (
        cfg.num_generations,
        cfg.per_device_train_batch_size,
        cfg.gradient_accumulation_steps,
    )
    n = mb * ga * num_processes
    prompts = n // G
    rows = train_rows
    if rows is not None and cfg.max_train_samples is not None:
        rows = min(rows, cfg.max_train_samples)
    mu = cfg.num_iterations
    rounds_per_epoch = rows // prompts if rows is not None and prompts else None
    steps_per_epoch = rounds_per_epoch * mu if rounds_per_epoch is not None else None
    if cfg.max_steps > 0:
        steps = cfg.max_steps
    elif rounds_per_epoch is not None:
        steps = math.ceil(cfg.num_train_epochs * rounds_per_epoch) * mu
    else:
        steps = None
    notes = []
    if n % G:
        notes.append(f"{n} completions per step is not divisible by num_generations {G}")
    if rows is not None and prompts and rows < prompts:
        notes.append(f"only {rows} training prompts for {prompts} prompts per step")
    return BatchPlan(
        num_processes=num_processes,
        num_generations=G,
        micro_batch=mb,
        gradient_accumulation_steps=ga,
        completions_per_step=n,
        prompts_per_step=prompts,
        generation_batch=mb * ga,
        prompts_per_process=(mb * ga) // G,
        optimizer_steps=steps,
        steps_per_epoch=steps_per_epoch,
        train_rows=rows,
        max_tokens_generated=(
            math.ceil(steps / mu) * n * cfg.max_completion_length if steps is not None else None
        ),
        divisible=n % G == 0,
        notes=notes,
    )
