"""``grpokit plan``: batch arithmetic and a memory estimate per device, before any weights load.

Only the model's ``config.json`` is read (a local directory, the hub cache, or
``AutoConfig`` for a hub id), so a plan costs a second. Every number is a plain formula of
the config; the formulas are stated on the functions and checked against measured peak RSS
in docs/plan.md.

    from grpokit.config import load_config
    from grpokit.plan import make_plan, format_plan
    print(format_plan(make_plan(load_config("recipes/gsm8k.yaml"))))

The rooms: ``shape`` (config.json -> ModelShape), ``params`` (parameter counts, LoRA),
``batch`` (completions, prompts, steps), ``memory`` (bytes by component), ``rows`` (the
task's training rows), ``make`` (the plan and its warnings), ``format`` (the table).
"""

from grpokit.plan.batch import BatchPlan, batch_plan
from grpokit.plan.format import format_plan
from grpokit.plan.make import Plan, make_plan, parse_size
from grpokit.plan.memory import (
    GB,
    PROCESS_BASELINE_BYTES,
    activation_bytes_per_token_layer,
    estimate_memory,
    logits_bytes,
)
from grpokit.plan.params import LINEARS, linear_shapes, lora_param_count, param_counts
from grpokit.plan.rows import task_train_rows
from grpokit.plan.shape import KNOWN_CONFIGS, ModelShape, PlanError, read_model_config

__all__ = [
    "GB",
    "KNOWN_CONFIGS",
    "LINEARS",
    "PROCESS_BASELINE_BYTES",
    "BatchPlan",
    "ModelShape",
    "Plan",
    "PlanError",
    "activation_bytes_per_token_layer",
    "batch_plan",
    "estimate_memory",
    "format_plan",
    "linear_shapes",
    "logits_bytes",
    "lora_param_count",
    "make_plan",
    "param_counts",
    "parse_size",
    "read_model_config",
    "task_train_rows",
]
