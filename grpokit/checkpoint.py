"""Atomic checkpoints and exact resume.

A checkpoint ``OUTPUT_DIR/checkpoint-N/`` holds the model (a transformers directory, or a
peft adapter), ``optimizer.pt`` (with bf16/fp16 weights also their fp32 master copies, see
``optim.MasterWeights``), ``scheduler.pt``, ``rng.pt`` (python, numpy, torch),
``trainer_state.json`` (step counters, data order and position), ``config.yaml`` and, when
the reference model has been synced, ``ref_model.pt``. It is written to a hidden temporary
directory and renamed into place, so a crash leaves either the whole checkpoint or none.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.json"
log = logging.getLogger("grpokit")


class NoSpaceError(OSError):
    """A checkpoint or the final model was not written: the disk (or the quota) is full.
    The partial copy has been removed; the message says where, how much is free and what to
    change."""


# Free bytes under which a failed write with no OS error attached is taken for a full disk
NEARLY_FULL = 16 * 2**20


def _is_no_space(e: BaseException, where: Path | None = None) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    # safetensors reports a failed write as its own error class, with the OS's words in it
    text = str(e)
    if "No space left on device" in text or "Disk quota exceeded" in text:
        return True
    # torch.save's zip writer says only "iostream error" / "unexpected pos N vs M": judged
    # by the space left where it was writing
    if where is None or not isinstance(e, RuntimeError):
        return False
    try:
        return shutil.disk_usage(where).free < NEARLY_FULL
    except OSError:
        return False


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


@contextmanager
def written_or_removed(tmp: Path, what: str) -> Iterator[None]:
    """Write ``what`` into ``tmp`` inside this block; if the disk fills up, remove ``tmp`` and
    raise ``NoSpaceError`` naming the directory, the free space and the fix."""
    try:
        yield
    except Exception as e:
        if not _is_no_space(e, tmp.parent):
            raise
        done = _size(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(tmp.parent).free
        raise NoSpaceError(
            errno.ENOSPC,
            f"{what} not saved: no space left on device under {tmp.parent} "
            f"({free / 1e6:.1f} MB free once its partial copy of {done / 1e6:.1f} MB was removed); "
            "free space there, or set save_total_limit (e.g. 1) or a larger save_steps",
        ) from None


@contextmanager
def skipped_when_full(counters: dict[str, int], key: str, then: str) -> Iterator[None]:
    """Around a save: a full disk becomes one warning (ending with what happens ``then``)
    and ``counters[key]`` + 1 instead of ending the run; nothing saved so far is touched."""
    try:
        yield
    except NoSpaceError as e:
        counters[key] = counters.get(key, 0) + 1
        log.warning("%s; %s", e.strerror, then)


def fault_point(name: str, step: int) -> None:
    """Fault injection for the crash tests: ``GRPOKIT_FAULT=name@step`` SIGKILLs this process
    when it reaches point ``name`` at ``step``. Unset (always, outside tests) it does nothing."""
    spec = os.environ.get("GRPOKIT_FAULT")
    if spec and spec == f"{name}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (a complete one has its trainer_state.json)."""
    d = Path(output_dir)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _CKPT_RE.match(p.name)
        if m and p.is_dir() and (p / STATE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def previous_run(output_dir: str | Path) -> list[str]:
    """What in ``output_dir`` shows an earlier run: checkpoints, metrics, a final model."""
    d = Path(output_dir)
    if not d.is_dir():
        return []
    return sorted(
        p.name
        for p in d.iterdir()
        if p.name.startswith("checkpoint-") or p.name in ("metrics.jsonl", "final")
    )


def prepare_output_dir(output_dir: str | Path, *, resume, overwrite: bool, is_main: bool) -> str:
    """Check ``output_dir`` before a run starts; a sentence for the console ("" when there is
    nothing to say). A run there, no ``--resume``: an error unless ``overwrite`` (TRL's
    ``overwrite_output_dir``), which moves the whole directory aside to
    ``OUTPUT_DIR.previous-<UTC time>``: nothing is deleted, and the new run's checkpoints
    and logs never mix with the old ones. Only the main process moves it."""
    import time

    out = Path(output_dir)
    found = previous_run(out)
    if resume or not found:
        return ""
    if not overwrite:
        raise ValueError(
            f"output_dir {out} already holds a run ({', '.join(found[:3])}); add --resume to "
            "continue it, set overwrite_output_dir: true to start afresh (the old run is moved "
            "aside), or choose another --output_dir"
        )
    if not is_main:
        return ""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    aside = out.with_name(f"{out.name}.previous-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = out.with_name(f"{out.name}.previous-{stamp}-{n}")
    try:
        out.rename(aside)
    except OSError as e:
        raise ValueError(
            f"overwrite_output_dir: cannot move the earlier run in {out} aside to {aside} "
            f"({e.strerror}); move it yourself or choose another --output_dir"
        ) from e
    return f"overwrite_output_dir: the earlier run in {out} was moved to {aside}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    model,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    scheduler,
    trainer_state: dict[str, Any],
    config_yaml: str,
    ref_model=None,
    save_total_limit: int | None = None,
    model_state_dict=None,
) -> Path:
    """``optimizer`` None: no optimizer.pt (sharded runs); ``model_state_dict``: the whole
    weights when ``model``'s own are sharded."""
    out = Path(output_dir)
    final = out / f"checkpoint-{step}"
    tmp = out / f".checkpoint-{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    with written_or_removed(tmp, f"checkpoint-{step}"):
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state_dict)
        tokenizer.save_pretrained(tmp)
        fault_point("checkpoint", step)  # model written, the rest not yet
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        if ref_model is not None:
            torch.save(ref_model.state_dict(), tmp / "ref_model.pt")
        (tmp / "config.yaml").write_text(config_yaml)
        (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=1))  # written last
    if final.exists():  # a checkpoint of the same step from an earlier attempt
        old = out / f".checkpoint-{step}.old"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    if save_total_limit:
        ckpts = list_checkpoints(out)
        for p in ckpts[: max(0, len(ckpts) - save_total_limit)]:
            if p != final:
                shutil.rmtree(p, ignore_errors=True)
    return final


def _read_safetensors_dir(path: Path, pattern: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    files = sorted(path.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no {pattern} in checkpoint {path}")
    for f in files:
        sd.update(load_file(str(f)))
    return sd


def load_model_weights(model, ckpt: Path, is_peft: bool) -> None:
    """Load the checkpoint's weights into an already-built model (same architecture)."""
    if is_peft:
        from peft import set_peft_model_state_dict

        sd = _read_safetensors_dir(ckpt, "adapter_model*.safetensors")
        res = set_peft_model_state_dict(model, sd)
        unexpected = getattr(res, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"checkpoint {ckpt} adapter has unexpected keys {unexpected[:5]}")
        return
    sd = _read_safetensors_dir(ckpt, "model*.safetensors")
    missing, unexpected = model.load_state_dict(sd, strict=False)
    tied = set()
    if getattr(model.config, "tie_word_embeddings", False):
        tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"checkpoint {ckpt} does not match the model: missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {unexpected[:5]}"
        )


def load_trainer_files(ckpt: Path) -> dict[str, Any]:
    return {
        "state": json.loads((ckpt / STATE_FILE).read_text()),
        "optimizer": torch.load(ckpt / "optimizer.pt", weights_only=False, map_location="cpu"),
        "scheduler": torch.load(ckpt / "scheduler.pt", weights_only=False, map_location="cpu"),
        "rng": torch.load(ckpt / "rng.pt", weights_only=False, map_location="cpu"),
        "ref_model": torch.load(ckpt / "ref_model.pt", weights_only=False, map_location="cpu")
        if (ckpt / "ref_model.pt").exists()
        else None,
        "config_yaml": (ckpt / "config.yaml").read_text(),
    }


# Keys that change what training means: a resume with a different value is refused.
RESUME_LOCKED_KEYS = (
    "model_name_or_path", "model_revision", "task", "task_params", "dataset_name", "dataset_config",
    "dataset_train_split", "max_train_samples", "num_generations", "per_device_train_batch_size",
    "gradient_accumulation_steps", "num_iterations", "use_peft", "lora_r", "lora_alpha",
    "lora_target_modules", "loss_type", "seed", "reward_funcs", "reward_weights", "beta",
    "torch_dtype", "system_prompt", "dataset_prompt_column", "advantage_estimator",
    "multi_objective_aggregation", "dynamic_sampling", "data_seed", "tools",
    "environment_factory", "max_tool_calling_iterations", "shuffle_dataset",
)  # fmt: skip


def _optimizer_kind(optim: str | None) -> str:
    """Optimizers whose checkpointed states load into each other share a kind (a checkpoint
    from before ``optim`` existed holds torch's AdamW)."""
    from grpokit.config import OPTIMS_8BIT

    return "8bit" if optim in OPTIMS_8BIT else "adamw"


def check_resume_config(saved: dict[str, Any], cfg, ckpt: Path) -> None:
    """Refuse to resume from ``ckpt`` (whose config was ``saved``) when ``cfg`` changes a key
    of ``RESUME_LOCKED_KEYS``, naming each change."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}  # keys newer than `saved`
    diffs = [k for k in RESUME_LOCKED_KEYS if saved.get(k, defaults[k]) != getattr(cfg, k)]
    if _optimizer_kind(saved.get("optim")) != _optimizer_kind(cfg.optim):
        diffs.append("optim")  # AdamW and 8-bit AdamW states do not load into each other
    if diffs:
        lines = ", ".join(f"{k}: {saved.get(k)!r} -> {getattr(cfg, k)!r}" for k in diffs)
        raise ValueError(
            f"cannot resume from {ckpt}: the config changes what training means ({lines}); "
            "resume with the checkpoint's values or start a new output_dir"
        )


class NonFiniteSkips:
    """Steps whose loss or gradient was not finite get no update: each one is counted
    (``counters["skipped_nonfinite_steps"]``), its inputs dumped for a post-mortem, and the
    run stops after ``max_in_a_row`` in a row."""

    def __init__(self, out: Path, max_in_a_row: int, *, is_main: bool = True):
        self.out, self.max_in_a_row, self.is_main = Path(out), max_in_a_row, is_main
        self.in_a_row = 0

    def passed(self) -> None:
        self.in_a_row = 0

    def skip(self, step: int, batch, model, counters: dict[str, int]) -> None:
        import logging

        counters["skipped_nonfinite_steps"] = counters.get("skipped_nonfinite_steps", 0) + 1
        self.in_a_row += 1
        dump = self.out / f"nonfinite-step-{step}.pt"
        if self.is_main:
            dump_nonfinite(dump, step, batch, model)
        logging.getLogger("grpokit").warning(
            "non-finite loss or gradient at step %d: update skipped, inputs dumped to %s",
            step,
            dump,
        )
        if self.in_a_row >= self.max_in_a_row:
            raise FloatingPointError(
                f"{self.in_a_row} consecutive steps had a non-finite loss or gradient; "
                f"stopping. Inputs of the last one: {dump}. Lower learning_rate, check the "
                "rewards, or use torch_dtype float32"
            )


def dump_nonfinite(path: Path, step: int, batch, model) -> None:
    """Save what went into a step whose loss or gradient was not finite, for a post-mortem:
    the batch's advantages, masks, completions and log-probs, and the names of parameters
    that are not finite (this rank's shard of sharded parameters)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nonfinite_params = [
        n
        for n, p in model.named_parameters()
        if not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
    ]
    torch.save(
        {
            "step": step,
            "advantages": batch.advantages,
            "loss_mask": batch.loss_mask,
            "completion_ids": batch.rollout.completion_ids,
            "texts": batch.rollout.texts,
            "old_logp": batch.old_logp,
            "ref_logp": batch.ref_logp,
            "nonfinite_params": nonfinite_params,
        },
        path,
    )
