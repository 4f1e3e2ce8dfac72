"""The plan: a model's shape, the batch arithmetic and the memory estimate together, with
the warnings a user should see before loading any weights."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from grpokit.config import GRPOConfig
from grpokit.plan.batch import BatchPlan, batch_plan
from grpokit.plan.memory import GB, estimate_memory
from grpokit.plan.params import param_counts
from grpokit.plan.rows import task_train_rows
from grpokit.plan.shape import ModelShape, PlanError, read_model_config


@dataclass
class Plan:
    model: str
    shape: ModelShape
    batch: BatchPlan
    memory: dict[str, Any]
    params: dict[str, int]
    zero_stage: int
    device_memory: float | None  # bytes
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "shape": asdict(self.shape),
            "params": self.params,
            "batch": asdict(self.batch),
            "memory": self.memory,
            "zero_stage": self.zero_stage,
            "device_memory": self.device_memory,
            "warnings": self.warnings,
        }


def parse_size(text: str | float | int | None) -> float | None:
    """ "80GB", "24 GiB", "512MB", "8e9" -> bytes."""
    if text is None or isinstance(text, (int, float)):
        return None if text is None else float(text)
    mt = re.fullmatch(r"\s*([\d.]+(?:e\d+)?)\s*([kmgt]i?b?)?\s*", text.lower())
    if not mt:
        raise ValueError(f"device memory {text!r}: use e.g. 80GB, 24GiB or 512MB")
    unit = mt.group(2) or ""
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(unit[:1], 1.0)
    if "i" in unit:
        scale = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[unit[:1]]
    return float(mt.group(1)) * scale


def make_plan(
    cfg: GRPOConfig,
    *,
    num_processes: int | None = None,
    zero_stage: int = 0,
    device_memory: str | float | None = None,
    count_rows: bool = True,
    prompt_length: int | None = None,
) -> Plan:
    if zero_stage not in (0, 1, 2, 3):
        raise PlanError(f"zero_stage={zero_stage}: use 0, 1, 2 or 3")
    nproc = num_processes or cfg.world_size
    shape = read_model_config(cfg.model_name_or_path)
    rows, why = task_train_rows(cfg) if count_rows else (None, "not counted")
    batch = batch_plan(cfg, nproc, rows)
    if batch.train_rows is not None and batch.prompts_per_step:
        from grpokit.prompts import PromptSampler  # training's own refusal of too few rows

        PromptSampler(batch.train_rows, batch.prompts_per_step, cfg.seed)
    if rows is None and cfg.max_steps <= 0:
        batch.notes.append(f"steps per epoch unknown: training rows not counted ({why})")
    mem = estimate_memory(
        cfg, shape, num_processes=nproc, zero_stage=zero_stage, prompt_length=prompt_length
    )
    limit = parse_size(device_memory)
    warns = list(batch.notes)
    if limit is not None and mem["peak"] > limit:
        warns.append(
            f"estimated peak {mem['peak'] / GB:.1f} GB exceeds device memory {limit / GB:.1f} GB: "
            "try gradient_checkpointing, a smaller per_device_train_batch_size, use_peft, "
            "--zero_stage 2/3 over more processes, or bf16 weights"
        )
    return Plan(
        model=cfg.model_name_or_path,
        shape=shape,
        batch=batch,
        memory=mem,
        params=param_counts(shape),
        zero_stage=zero_stage,
        device_memory=limit,
        warnings=warns,
    )
