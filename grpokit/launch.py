"""How this process was launched, the startup checks for it, and the training strategy:
``LocalTraining`` (one process, or data parallel) or ``ShardedTraining`` (FSDP2, DeepSpeed),
one interface, so the loop never asks which.

grpokit has two ways to train over several processes:

- **data parallel** (``torchrun``, ``accelerate launch`` with a multi-GPU or the CPU config):
  every rank holds the whole model; grpokit sums the gradients itself
  (``distributed.sum_gradients``). Tested on CPU (2 gloo ranks = 1 process).
- **sharded** (``accelerate launch`` with a DeepSpeed ZeRO or FSDP config): the policy and the
  optimizer go through ``accelerate.Accelerator.prepare`` and backward through the
  accelerator; sampling uses an unsharded copy of the weights gathered after each update;
  saving gathers the full state dict. GPU only (accelerate enables FSDP and DeepSpeed only on
  GPU-like devices), and not run on grpokit's CPU test machine.

accelerate tells the processes what it launched through environment variables
(accelerate 1.15, ``accelerate/utils/launch.py``): ``ACCELERATE_USE_DEEPSPEED`` and
``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ``ACCELERATE_USE_FSDP`` and ``FSDP_VERSION``,
``ACCELERATE_MIXED_PRECISION``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from grpokit.config import ConfigError


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Launch:
    engine: str  # "data_parallel", "fsdp" or "deepspeed"
    zero_stage: int | None = None
    fsdp_version: int | None = None
    mixed_precision: str = "no"
    gradient_accumulation_steps: int | None = None  # when the accelerate config sets it

    @property
    def sharded(self) -> bool:
        return self.engine != "data_parallel"

    def describe(self) -> str:
        if self.engine == "deepspeed":
            return f"DeepSpeed ZeRO-{self.zero_stage}"
        if self.engine == "fsdp":
            return f"FSDP{self.fsdp_version}"
        return "data parallel (grpokit sums gradients)"


def launch_from_env(env: Mapping[str, str] | None = None) -> Launch:
    env = os.environ if env is None else env
    mp = env.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    ga = env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    ga = int(ga) if ga and ga.strip().isdigit() else None
    if _flag(env, "ACCELERATE_USE_DEEPSPEED"):
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        launch = Launch("deepspeed", zero_stage=int(stage) if stage else None)
    elif _flag(env, "ACCELERATE_USE_FSDP"):
        launch = Launch("fsdp", fsdp_version=int(env.get("FSDP_VERSION", "1")))
    else:
        launch = Launch("data_parallel")
    return dataclasses.replace(launch, mixed_precision=mp, gradient_accumulation_steps=ga)


def launch_from_accelerate_config(path: str) -> tuple[Launch, int]:
    """(launch, num_processes) of an accelerate config file, read with accelerate's loader:
    what ``accelerate launch --config_file path`` will start (for ``grpokit plan``)."""
    from accelerate.commands.config.config_args import load_config_from_file

    c = load_config_from_file(path)
    kind = getattr(c.distributed_type, "value", str(c.distributed_type))
    mp = str(getattr(c.mixed_precision, "value", c.mixed_precision) or "no").lower()
    ga = None
    if kind == "DEEPSPEED":
        stage = (c.deepspeed_config or {}).get("zero_stage")
        launch = Launch("deepspeed", zero_stage=None if stage is None else int(stage))
        g = (c.deepspeed_config or {}).get("gradient_accumulation_steps")
        ga = int(g) if isinstance(g, int) or (isinstance(g, str) and g.isdigit()) else None
    elif kind == "FSDP":
        launch = Launch("fsdp", fsdp_version=int((c.fsdp_config or {}).get("fsdp_version", 1)))
    else:
        launch = Launch("data_parallel")
    launch = dataclasses.replace(launch, mixed_precision=mp, gradient_accumulation_steps=ga)
    return launch, int(c.num_processes or 1)


def training_strategy(cfg, launch: Launch):
    return ShardedTraining(cfg, launch) if launch.sharded else LocalTraining(launch)


def check_launch(
    cfg, launch: Launch, device: torch.device, deepspeed_installed: bool | None = None
) -> None:
    """Refuse, before any model loads, the launches grpokit cannot train correctly.
    ``deepspeed_installed`` None: look it up."""
    if deepspeed_installed is None:
        deepspeed_installed = importlib.util.find_spec("deepspeed") is not None
    errors = []
    if launch.mixed_precision not in ("no", ""):
        errors.append(
            f"the accelerate config sets mixed_precision: {launch.mixed_precision}; grpokit "
            "takes precision from the recipe: set mixed_precision: 'no' in the accelerate "
            "config and bf16: true in the recipe"
        )
    ga = launch.gradient_accumulation_steps
    if ga is not None and ga != cfg.gradient_accumulation_steps:
        errors.append(
            f"the accelerate config sets gradient_accumulation_steps: {ga} but the recipe has "
            f"{cfg.gradient_accumulation_steps}; grpokit takes it from the recipe: remove it from "
            "the accelerate config (or make them equal)"
        )
    if launch.sharded and device.type != "cuda":
        errors.append(
            f"{launch.describe()} runs on GPUs only (accelerate enables it for CUDA devices), "
            f"but this process trains on {device}; on CPU use torchrun or "
            "recipes/accelerate/cpu_2proc.yaml"
        )
    if launch.engine == "fsdp" and launch.fsdp_version != 2:
        errors.append(
            f"FSDP version {launch.fsdp_version}: grpokit supports FSDP2 only; set "
            "fsdp_version: 2 in the accelerate config (see recipes/accelerate/fsdp.yaml)"
        )
    if launch.engine == "deepspeed":
        if launch.zero_stage not in (2, 3):
            errors.append(
                f"DeepSpeed zero_stage {launch.zero_stage}: grpokit supports ZeRO-2 and ZeRO-3; "
                "set zero_stage: 2 or 3 (recipes/accelerate/deepspeed_zero2.yaml, _zero3.yaml)"
            )
        if not deepspeed_installed:
            errors.append("the accelerate config uses DeepSpeed: pip install deepspeed")
    weights_sharded = launch.engine == "fsdp" or launch.zero_stage == 3
    if weights_sharded and cfg.use_peft:
        errors.append(
            f"use_peft with {launch.describe()} (sharded weights) is not supported by grpokit; "
            "LoRA's optimizer state is small, so use recipes/accelerate/multi_gpu.yaml or "
            "deepspeed_zero2.yaml"
        )
    if weights_sharded and cfg.sync_ref_model:
        errors.append(
            f"sync_ref_model with {launch.describe()} is not supported (the reference mix needs "
            "whole weights); set sync_ref_model: false or use multi_gpu.yaml / deepspeed_zero2.yaml"
        )
    if errors:
        raise ConfigError("cannot start this launch:\n  - " + "\n  - ".join(errors))


class LocalTraining:
    """One process, or data parallel: every rank holds the whole model and optimizer, and
    grpokit sums the gradients over ranks itself (``distributed.sum_gradients``)."""

    sharded = False
    every_rank_runs_backward = False  # a non-finite loss can stop the micro-batch loop
    steps_in_backward = False
    fixed_micro_batches = False

    def __init__(self, launch: Launch | None = None):
        self.launch = launch or Launch("data_parallel")

    def adjust_config(self, cfg):
        return cfg

    def prepare(self, model, optimizer, ref_model):
        return model, optimizer, ref_model

    def begin_step(self) -> None:
        pass

    def backward(self, model, loss: torch.Tensor) -> None:
        # the gradients accumulate into the kept buffers (optim.KeptGradients); the lean
        # layers add their weights' into them themselves
        from grpokit.speed.layers import weight_grads_into_grad

        with weight_grads_into_grad():
            loss.backward()

    def reduce_and_clip(self, model, params, max_norm: float) -> torch.Tensor:
        """Sum the gradients over ranks, clip them; the norm before clipping."""
        from grpokit import distributed as dist

        dist.sum_gradients(params)
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def optimizer_to_save(self, optimizer):
        return optimizer

    def check_resume(self, ckpt) -> None:
        pass

    def model_for_saving(self, model):
        """(model, state dict or None) to save."""
        return model, None


class ShardedTraining:
    """The policy and optimizer prepared by accelerate for FSDP2 or DeepSpeed ZeRO-2/3.

    The trainer's losses are normalised by global token/sequence counts, so the gradient of
    the global objective is the *sum* over ranks of each rank's gradient; FSDP and DeepSpeed
    average gradients over ranks and accelerate divides each micro-batch's loss by the
    accumulation steps, so ``backward`` multiplies the loss by world size x accumulation
    steps to undo both.
    """

    sharded = True
    every_rank_runs_backward = True  # the sharded backward has collectives
    fixed_micro_batches = True  # every rank runs the same wrapped forwards and backwards

    def __init__(self, cfg, launch: Launch):
        import datetime

        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        self.cfg, self.launch = cfg, launch
        # accelerate creates the process group: with ddp_timeout, not its 30 minutes
        pg = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=cfg.ddp_timeout))
        self.acc = Accelerator(
            gradient_accumulation_steps=cfg.gradient_accumulation_steps, kwargs_handlers=[pg]
        )
        if self.acc.gradient_accumulation_steps != cfg.gradient_accumulation_steps:
            raise ConfigError(
                f"accelerate uses gradient_accumulation_steps "
                f"{self.acc.gradient_accumulation_steps}, the recipe "
                f"{cfg.gradient_accumulation_steps}; remove it from the accelerate config"
            )
        if launch.engine == "deepspeed":
            ds = self.acc.state.deepspeed_plugin.deepspeed_config
            ds["train_micro_batch_size_per_gpu"] = cfg.per_device_train_batch_size
            ds["gradient_accumulation_steps"] = cfg.gradient_accumulation_steps
            ds["gradient_clipping"] = cfg.max_grad_norm if cfg.max_grad_norm > 0 else 0.0
            if launch.zero_stage == 3:  # whole 16-bit weights on save are gathered by us
                ds.setdefault("zero_optimization", {})[
                    "stage3_gather_16bit_weights_on_model_save"
                ] = True

    @property
    def device(self) -> torch.device:
        return self.acc.device

    def adjust_config(self, cfg):
        """The fused head calls the decoder and the output layer separately, and the
        shared-prompt forward runs a data-dependent number of forwards; sharded engines need
        every rank to run the same wrapped calls."""
        return dataclasses.replace(cfg, fused_logprobs=False, share_prompt_forward=False)

    def optimizer_to_save(self, optimizer):
        return None  # checkpoints hold the whole weights but no optimizer state

    def check_resume(self, ckpt) -> None:
        raise ValueError(
            f"--resume under {self.launch.describe()} is not implemented (its checkpoints "
            "hold the whole weights but no optimizer state); start a new output_dir with "
            f"model_name_or_path: {ckpt}, or train with torchrun / multi_gpu.yaml"
        )

    def model_for_saving(self, model):
        """(model, state dict or None) to save. Sharded weights (FSDP, ZeRO-3) are gathered
        here, on every rank (a collective); rank 0 writes them."""
        unwrapped = self.unwrap(model)
        if self.launch.engine == "fsdp" or self.launch.zero_stage == 3:
            sd = self.full_state_dict(model)
            # tied weights (lm_head = embeddings) once, as save_pretrained writes them itself
            seen, dup = set(), []
            for name, p in unwrapped.named_parameters(remove_duplicate=False):
                (dup.append(name) if id(p) in seen else seen.add(id(p)))
            return unwrapped, {k: v for k, v in sd.items() if k not in dup}
        return unwrapped, None

    def prepare(self, model, optimizer, ref_model):
        model, optimizer = self.acc.prepare(model, optimizer)
        if ref_model is not None:
            ref_model = self.prepare_reference(ref_model)
        return model, optimizer, ref_model

    def prepare_reference(self, ref):
        """The reference model for inference: sharded like the policy under FSDP2 and ZeRO-3
        (forward only), a whole copy on this GPU under ZeRO-2."""
        ref = ref.to(self.device)
        if self.launch.engine == "fsdp":
            from torch.distributed.fsdp import fully_shard

            layers = set(getattr(ref, "_no_split_modules", None) or ())
            for m in ref.modules():
                if type(m).__name__ in layers:
                    fully_shard(m)
            fully_shard(ref)
            return ref
        if self.launch.zero_stage == 3:
            import copy

            import deepspeed

            cfg = copy.deepcopy(self.acc.state.deepspeed_plugin.deepspeed_config)
            for k in ("optimizer", "scheduler"):
                cfg.pop(k, None)
            engine, *_ = deepspeed.initialize(model=ref, config=cfg)
            engine.eval()
            return engine
        return ref

    def begin_step(self) -> None:
        self.acc.step = 0  # the micro-batch counter behind accelerate.accumulate

    def backward(self, model, loss: torch.Tensor) -> None:
        scale = self.acc.num_processes * self.cfg.gradient_accumulation_steps
        with self.acc.accumulate(model):
            self.acc.backward(loss * scale)

    def reduce_and_clip(self, model, params, max_norm: float) -> torch.Tensor:
        """The engine has reduced the gradients; clip them, return the norm before."""
        n = self.acc.clip_grad_norm_(params, max_norm)
        if n is None and self.launch.engine == "deepspeed":
            n = model.get_global_grad_norm()  # DeepSpeed clipped inside its step
        if n is None:
            return torch.tensor(float("nan"))
        if hasattr(n, "full_tensor"):
            n = n.full_tensor()
        return torch.as_tensor(n, dtype=torch.float32).detach().cpu()

    @property
    def steps_in_backward(self) -> bool:
        """DeepSpeed's optimizer step runs inside accelerate's backward (at the last micro-batch);
        a non-finite step can be reported but not skipped."""
        return self.launch.engine == "deepspeed"

    def full_params(self, model) -> Iterator[torch.Tensor]:
        """The policy's whole parameters, one at a time, in ``model.parameters()`` order.
        Every rank must consume the iterator completely and at the same point (collectives)."""
        if self.launch.zero_stage == 3:
            import deepspeed

            for p in model.parameters():
                with deepspeed.zero.GatheredParameters([p]):
                    yield p.data
            return
        for p in model.parameters():
            yield p.full_tensor() if hasattr(p, "full_tensor") else p.detach()

    def unwrap(self, model):
        return self.acc.unwrap_model(model)

    def full_state_dict(self, model) -> dict[str, torch.Tensor]:
        """Whole weights for saving (complete on rank 0; called on every rank)."""
        return self.acc.get_state_dict(model)


def failure_line(e: BaseException, output_dir) -> str | None:
    """The one line a training process ends with when the layout failed (a training process
    died or hung: ``distributed.PeerError``; the rollout server is gone, hung or serves
    another model: ``VLLMError``): which side failed, the last complete checkpoint, how to
    resume. None for any other error (its traceback is wanted)."""
    import sys
    from pathlib import Path

    from grpokit.checkpoint import latest_checkpoint
    from grpokit.distributed import PeerError

    engine = sys.modules.get("grpokit.rollout.vllm_engine")
    if isinstance(e, PeerError):
        side = "training process failed"
    elif engine is not None and isinstance(e, engine.VLLMError):
        side = "rollout server failed"
    else:
        return None
    out = Path(output_dir)
    ckpt = latest_checkpoint(out) if out.is_dir() else None
    resume = (
        f"last complete checkpoint {ckpt}; once the cause is fixed, resume with the same "
        "launch command plus --resume"
        if ckpt
        else "no checkpoint was written yet; start the same launch command again"
    )
    return f"{side}: {' '.join(str(e).split())} | {resume}"
