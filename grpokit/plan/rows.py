"""How many training rows the recipe's task has, when that is cheap to know (a local or
generated dataset; never a download)."""

from __future__ import annotations

from pathlib import Path

from grpokit.config import GRPOConfig


def task_train_rows(cfg: GRPOConfig) -> tuple[int | None, str | None]:
    """Number of training rows of the recipe's task, or (None, why) when not cheaply known."""
    try:
        from grpokit.setup import build_task

        task = build_task(cfg)
        source = task.source
        sizes = getattr(task, "sizes", None)
        if source in (None, "generate") and isinstance(sizes, dict) and "train" in sizes:
            return int(sizes["train"]), None  # a generated task's own count, no generation
        if source not in (None, "generate") and not Path(source).expanduser().exists():
            return None, f"{source} is a hub dataset, which plan does not download"
        return len(task.load_rows(cfg.dataset_train_split)), None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e)[:160]}"
