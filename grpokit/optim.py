"""The optimizer (``optim``), fp32 master weights for lower-precision trainable weights, and
the learning-rate schedules (warm-up, then linear / cosine / constant).

``optim`` takes transformers' names: ``adamw_torch_fused`` (the default, as in transformers
with torch >= 2.8), ``adamw_torch`` (torch's AdamW without the fused kernel), and
bitsandbytes' 8-bit AdamW as ``adamw_8bit`` = ``adamw_bnb_8bit``, or ``paged_adamw_8bit``
(paged on CUDA; bitsandbytes falls back to the plain 8-bit optimizer on CPU).

Master weights: when trainable weights are bf16 or fp16 (``torch_dtype: bfloat16``), the
optimizer steps fp32 copies of them and then rounds the copies back into the model (round to
nearest), as DeepSpeed's bf16 optimizer does. Each parameter's gradient is added into its
copy's fp32 ``.grad`` as soon as a backward has accumulated it (a post-accumulate-grad hook),
so micro-batches accumulate in fp32 and clipping and the logged grad_norm see the same fp32
values the optimizer steps. Cost: 4 bytes per such parameter for the copy, and an fp32
gradient (4 bytes) instead of a bf16 one (2); AdamW's two moments are fp32 (8 bytes) instead
of bf16 (4).
"""

from __future__ import annotations

import logging
import math

import torch

from grpokit.config import OPTIMS_8BIT, ConfigError

LOW_PRECISION = (torch.bfloat16, torch.float16)
# bitsandbytes' class of each 8-bit name
EIGHT_BIT = {"adamw_8bit": "AdamW8bit", "adamw_bnb_8bit": "AdamW8bit"}
EIGHT_BIT["paged_adamw_8bit"] = "PagedAdamW8bit"
assert set(EIGHT_BIT) == set(OPTIMS_8BIT)
BNB_INSTALL = "pip install 'grpokit[optim8bit]' (or: pip install bitsandbytes)"


def lr_lambda(
    kind: str,
    warmup_steps: int,
    total_steps: int,
    min_lr_rate: float = 0.0,
    num_cycles: float = 0.5,
):
    """The schedule's factor of step ``step``. Cosine: transformers' formula,
    0.5 * (1 + cos(2 pi num_cycles progress)) (num_cycles 0.5: one half-wave to 0)."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps + 1) if kind != "constant" else 1.0
        if kind in ("constant", "constant_with_warmup"):
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        progress = min(max(progress, 0.0), 1.0)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        cos = 0.5 * (1.0 + math.cos(math.pi * (2.0 * num_cycles) * progress))
        if kind == "cosine_with_min_lr":
            return max(0.0, min_lr_rate + (1.0 - min_lr_rate) * cos)
        return max(0.0, cos)

    return f


def _adamw(params, cfg, optim: str) -> torch.optim.Optimizer:
    """AdamW over ``params``. ``adamw_torch_fused``: plain CPU/CUDA parameters get torch's
    fused kernel (one pass over each parameter's four tensors instead of ~10 elementwise ops;
    same update up to float rounding): measured here for SmolLM2-135M in fp32, 0.24 -> 0.08 s
    a step. Sharded parameters (DTensor) keep the default implementation."""
    kw = dict(
        lr=cfg.learning_rate,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_epsilon,
        weight_decay=cfg.weight_decay,
    )
    if optim in EIGHT_BIT:
        bnb = require_bitsandbytes(optim)
        return getattr(bnb.optim, EIGHT_BIT[optim])(params, **kw)
    fused = optim == "adamw_torch_fused" and all(
        type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") and p.is_floating_point()
        for p in params
    )
    return torch.optim.AdamW(params, fused=fused or None, **kw)


def require_bitsandbytes(optim: str):
    try:
        import bitsandbytes
    except ImportError:
        raise ConfigError(f"optim {optim} needs bitsandbytes: {BNB_INSTALL}") from None
    return bitsandbytes


def build_optimizer(params, cfg):
    """The ``optim`` optimizer over ``params``; wrapped in ``MasterWeights`` when some of them
    are bf16/fp16."""
    params = list(params)
    if not params:
        raise ValueError("the model has no trainable parameters")
    optim = cfg.optim
    if any(p.dtype in LOW_PRECISION for p in params):
        return MasterWeights(params, lambda ps: _adamw(ps, cfg, optim))
    return _adamw(params, cfg, optim)


def allocate_state(optimizer) -> None:
    """Create torch AdamW's per-parameter state (step, both moments) now, as its first
    ``step`` would: the same zeros, dtypes and devices, so the updates are bit-identical.

    Why: created lazily, the ~8 bytes a parameter land in whatever the heap has free after
    the first backward, the holes its activations left, and the next step's activations no
    longer fit there: with ``./run``'s heap (freed memory kept, never mmapped) that was most
    of the heap's growth in step 2. Made before any step, the state sits beside the weights.
    Other optimizers (bitsandbytes') keep their lazy state."""
    inner = optimizer.optimizer if isinstance(optimizer, MasterWeights) else optimizer
    if type(inner) is not torch.optim.AdamW:
        return
    from torch.optim.optimizer import _get_scalar_dtype

    for group in inner.param_groups:
        for p in group["params"]:
            state = inner.state[p]
            if state:
                continue
            if group["capturable"] or group["fused"]:
                kind = _get_scalar_dtype(is_fused=group["fused"])
                state["step"] = torch.zeros((), dtype=kind, device=p.device)
            else:
                state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
            moments = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
            for name in moments:
                state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)


class KeptGradients:
    """Gradient buffers made once, before the first step, and zeroed after each step instead
    of freed (``zero_grad(set_to_none=True)``): every backward accumulates into the same
    memory, beside the weights, instead of a fresh (0.54 GB for a 135M model in fp32) set
    placed in the holes of the heap the step's activations left.

    The optimizer still sees no gradient for a parameter no backward of the step reached
    (AdamW skips it, as with freed gradients): ``hold_back_unused`` takes such buffers off
    ``.grad`` until ``zero``. Reached means the buffer was accumulated into (autograd and
    ``MasterWeights`` add in place, which bumps its version counter) or replaced."""

    def __init__(self, params: list):
        self.params = params  # the tensors the optimizer steps (fp32 masters where any)
        self.buffers = [torch.zeros_like(p) for p in params]
        self._restore()

    def _restore(self) -> None:
        for p, buf in zip(self.params, self.buffers):
            p.grad = buf
        self.versions = [buf._version for buf in self.buffers]

    def hold_back_unused(self) -> None:
        """After the step's backwards, before the gradients are summed, clipped and stepped."""
        for p, buf, version in zip(self.params, self.buffers, self.versions):
            if p.grad is buf and buf._version == version:
                p.grad = None  # back on the parameter in ``zero``

    def zero(self) -> None:
        """After the optimizer step: every buffer back on its parameter, zeroed."""
        for buf in self.buffers:
            buf.zero_()
        self._restore()


class FreedGradients:
    """Gradients freed after each step: sharded engines own their gradient memory."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def hold_back_unused(self) -> None:
        pass

    def zero(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)


def params_to_clip(optimizer, params: list) -> list:
    """The tensors whose ``.grad`` the optimizer steps: clip (and sum over ranks) these."""
    return optimizer.master_params if isinstance(optimizer, MasterWeights) else params


class MasterWeights:
    """An optimizer that steps fp32 copies of the bf16/fp16 parameters among ``params`` (fp32
    ones are stepped in place) and rounds the copies back into them after each step.

    ``master_params[i]`` is the fp32 copy of ``params[i]`` (or ``params[i]`` itself when it
    is fp32); gradients reach it through a post-accumulate-grad hook that adds each backward's
    gradient in fp32 and frees the low-precision one. ``state_dict`` holds the inner
    optimizer's state and the copies, so a resume continues from the same fp32 values."""

    def __init__(self, params: list, make_optimizer):
        self.params = list(params)
        self.master_params = []
        self.hooks = []
        for i, p in enumerate(self.params):
            if p.dtype in LOW_PRECISION:
                master = torch.nn.Parameter(p.detach().to(torch.float32), requires_grad=True)
                self.hooks.append(p.register_post_accumulate_grad_hook(self._collect(i)))
            else:
                master = p
            self.master_params.append(master)
        self.low = [i for i, p in enumerate(self.params) if p is not self.master_params[i]]
        self.optimizer = make_optimizer(self.master_params)

    def _collect(self, i: int):
        def collect(p: torch.Tensor) -> None:
            g, master = p.grad, self.master_params[i]
            g = g.to_dense() if g.is_sparse else g
            if master.grad is None:
                master.grad = g.to(torch.float32)
            else:
                master.grad.add_(g)
            p.grad = None

        return collect

    # what the trainer, the scheduler and the tests use of an optimizer
    param_groups = property(lambda self: self.optimizer.param_groups)
    state = property(lambda self: self.optimizer.state)
    defaults = property(lambda self: self.optimizer.defaults)

    def step(self) -> None:
        self.optimizer.step()
        self._round_into_model()

    @torch.no_grad()
    def _round_into_model(self) -> None:
        for i in self.low:
            self.params[i].copy_(self.master_params[i])  # round to nearest even

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "master_weights": {i: self.master_params[i].detach() for i in self.low},
        }

    @torch.no_grad()
    def load_state_dict(self, sd: dict) -> None:
        if "master_weights" not in sd:  # a checkpoint written before master weights
            logging.getLogger("grpokit").warning(
                "the checkpoint has no fp32 master weights (written by an older grpokit): "
                "they start from the model's bf16/fp16 weights"
            )
            for i in self.low:
                self.master_params[i].copy_(self.params[i])
            self.optimizer.load_state_dict(sd)
            return
        saved = sd["master_weights"]
        if sorted(saved) != self.low:
            raise ValueError(
                "the checkpoint's master weights do not match this model's bf16/fp16 "
                f"parameters ({len(saved)} saved, {len(self.low)} here)"
            )
        for i in self.low:
            self.master_params[i].copy_(saved[i])
        self.optimizer.load_state_dict(sd["optimizer"])
        self._round_into_model()


def build_scheduler(opt, cfg, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The warm-up and schedule of ``cfg`` (``lr_scheduler_kwargs`` checked by the config:
    ``num_cycles`` for the cosines, ``min_lr`` or ``min_lr_rate`` for cosine_with_min_lr,
    whose default is min_lr_rate 0.1)."""
    w = cfg.warmup_steps
    warmup = int(w) if w >= 1 else math.ceil((w or cfg.warmup_ratio) * total_steps)
    kw = dict(cfg.lr_scheduler_kwargs)
    min_lr_rate = float(
        kw.get("min_lr_rate", 0.1 if cfg.lr_scheduler_type == "cosine_with_min_lr" else 0.0)
    )
    if "min_lr" in kw:
        min_lr_rate = float(kw["min_lr"]) / cfg.learning_rate
    num_cycles = float(kw.get("num_cycles", 0.5))
    inner = opt.optimizer if isinstance(opt, MasterWeights) else opt
    return torch.optim.lr_scheduler.LambdaLR(
        inner, lr_lambda(cfg.lr_scheduler_type, warmup, total_steps, min_lr_rate, num_cycles)
    )
