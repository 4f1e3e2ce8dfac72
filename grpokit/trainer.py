"""The GRPO loop. Reads top to bottom: sample, score, advantages, update. No inline math:
the objective lives in ``grpokit.algo``.

One *round* = one generation batch of ``prompts_per_step`` prompts x G completions, followed
by ``num_iterations`` optimizer steps over it. ``max_steps`` counts optimizer steps.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from grpokit import distributed as dist
from grpokit.algo import (
    entropy_from_logits,
    group_advantages,
    linear_logprobs,
    policy_loss,
    sampling_is_weights,
    selective_log_softmax,
)
from grpokit.algo.advantages import group_reward_stats
from grpokit.algo.attention import training_attention
from grpokit.checkpoint import (
    fault_point,
    latest_checkpoint,
    load_model_weights,
    load_trainer_files,
    save_checkpoint,
    set_rng_state,
)
from grpokit.config import GRPOConfig, save_config
from grpokit.data import PromptSampler, columns_for_rewards, render_prompts, tokenize_prompts
from grpokit.engines import ShardedTraining, check_launch, launch_from_env
from grpokit.evaluation import evaluate, format_comparison, save_eval
from grpokit.logging import MetricsLogger
from grpokit.optim import build_optimizer, build_scheduler
from grpokit.rollout.base import Rollout, SamplingParams
from grpokit.rollout.hf import HFRolloutEngine, autocast
from grpokit.scoring import combine, reward_name, score

log = logging.getLogger("grpokit")

# Keys that change what training means: a resume with a different value is refused.
RESUME_LOCKED_KEYS = (
    "model_name_or_path", "task", "task_params", "dataset_name", "dataset_config",
    "dataset_train_split", "max_train_samples", "num_generations", "per_device_train_batch_size",
    "gradient_accumulation_steps", "num_iterations", "use_peft", "lora_r", "lora_alpha",
    "lora_target_modules", "loss_type", "seed", "reward_funcs", "reward_weights", "beta",
    "torch_dtype", "system_prompt", "dataset_prompt_column",
)  # fmt: skip


@dataclass
class Batch:
    """One round's training data. N = B*G rows, completions of a prompt contiguous."""

    rollout: Rollout
    loss_mask: torch.Tensor  # (N, C) completion mask, zeroed for truncated rows if asked
    advantages: torch.Tensor  # (N,)
    old_logp: torch.Tensor | None  # (N, C), num_iterations > 1: set by the round's first step
    ref_logp: torch.Tensor | None  # (N, C), only when beta > 0


class Stop(Exception):
    """Raised inside the loop when SIGINT/SIGTERM asked to stop after a checkpoint."""


class GRPOTrainer:
    def __init__(self, cfg: GRPOConfig, *, resume: str | bool | None = None, stream=None):
        self.device = dist.resolve_device(cfg.device)  # a missing GPU fails before any work
        self.launch = launch_from_env()
        check_launch(cfg, self.launch, self.device)
        self.sharded = ShardedTraining(cfg, self.launch) if self.launch.sharded else None
        if self.sharded:
            # the fused head calls the decoder and the output layer separately, and the
            # shared-prompt forward runs a data-dependent number of forwards; sharded engines
            # need every rank to run the same wrapped calls
            cfg = dataclasses.replace(cfg, fused_logprobs=False, share_prompt_forward=False)
        self.cfg = cfg
        dist.init(self.device)
        torch.manual_seed(cfg.seed)
        if cfg.torch_num_threads:
            torch.set_num_threads(cfg.torch_num_threads)
        self.out = Path(cfg.output_dir)
        self.counters: dict[str, int] = {}
        self._stop_requested = False
        self._setup_task_and_rewards()  # cheap checks first, before any model loads
        self._setup_models()
        self._setup_optimization()
        self.logger = MetricsLogger(
            self.out,
            self.total_steps,
            stream=stream,
            enabled=dist.is_main(),
            trackers=_trackers(cfg),
        )
        self.step = 0
        self.resumed_from = 0
        if resume:
            self._resume(resume)

    # ------------------------------------------------------------------ setup
    def _setup_task_and_rewards(self) -> None:
        from grpokit.rewards import get_reward_funcs
        from grpokit.tasks import get_task

        c = self.cfg
        self.task = get_task(
            c.task,
            dataset_name=c.dataset_name,
            dataset_config=c.dataset_config,
            system_prompt=c.system_prompt,
            seed=c.seed,
            dataset_prompt_column=c.dataset_prompt_column,
            **c.task_params,
        )
        self.train_rows = self.task.build(c.dataset_train_split, limit=c.max_train_samples)
        self.eval_rows = (
            self.task.build(c.dataset_test_split, limit=c.max_eval_samples)
            if c.do_eval and c.max_eval_samples > 0
            else []
        )
        specs = (
            c.reward_funcs if c.reward_funcs is not None else list(self.task.default_reward_funcs)
        )
        if not specs:
            raise ValueError(
                f"task {c.task!r} has no default rewards; set reward_funcs in the recipe"
            )
        self.reward_funcs = get_reward_funcs(specs)
        if c.reward_weights is not None:
            weights = list(c.reward_weights)
        elif c.reward_funcs is None and self.task.default_reward_weights is not None:
            weights = list(self.task.default_reward_weights)
        else:
            weights = [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(
                f"{len(weights)} reward_weights for {len(self.reward_funcs)} reward_funcs"
            )
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        self.reward_names = [reward_name(f) for f in self.reward_funcs]
        W = dist.world_size()
        if c.prompts_per_step % W:
            raise ValueError(
                f"{c.prompts_per_step} prompts per step do not split over {W} processes"
            )
        self.prompts_per_rank = c.prompts_per_step // W
        self.sampler = PromptSampler(len(self.train_rows), c.prompts_per_step, c.seed)
        mu = c.num_iterations
        if c.max_steps > 0:
            self.total_steps = c.max_steps
        else:
            rounds = math.ceil(c.num_train_epochs * self.sampler.batches_per_epoch)
            self.total_steps = rounds * mu

    def _setup_models(self) -> None:
        from grpokit.models import load_model_and_tokenizer

        c = self.cfg
        if c.use_vllm:  # before any model loads: a missing package is a one-line fix
            from grpokit.rollout.vllm_engine import require_vllm

            require_vllm()
        self.model, self.tokenizer, self.model_source = load_model_and_tokenizer(
            c.model_name_or_path,
            dtype=c.torch_dtype,
            use_peft=c.use_peft,
            lora_r=c.lora_r,
            lora_alpha=c.lora_alpha,
            lora_dropout=c.lora_dropout,
            lora_target_modules=c.lora_target_modules,
            gradient_checkpointing=c.gradient_checkpointing,
            trust_remote_code=c.trust_remote_code,
            chat_template=c.chat_template,
        )
        self.model.to(self.device)
        self.model.train()
        self.ref_model = None
        if c.beta > 0 and not c.use_peft:  # with LoRA the reference is the adapter-disabled base
            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.amp_dtype = torch.bfloat16 if c.bf16 else None
        if self.ref_model is not None and self.amp_dtype is not None:
            # frozen: its products' weights are cast once here instead of by autocast in
            # every reference forward (same values); not when it is mixed with the policy
            # (sync_ref_model) or handed to a sharding engine
            if not c.sync_ref_model and not self.launch.sharded:
                _lower_frozen_linears(self.ref_model, self.amp_dtype)
        if c.use_vllm:
            self.engine = self._vllm_engine()
        else:
            self.engine = HFRolloutEngine(
                self.model,
                self.tokenizer,
                autocast_dtype=self.amp_dtype,
                loop=c.generation_loop,
                fused_decode=c.fused_decode,
                # bf16 runs sample from a bf16 copy of the weights (LoRA merged in; see there)
                sampling_dtype=self.amp_dtype if c.bf16_sampling_copy else None,
            )
        # held-out evaluation decodes with the training model itself (autocast when bf16)
        self.eval_engine = HFRolloutEngine(
            self.model,
            self.tokenizer,
            autocast_dtype=self.amp_dtype,
            loop=c.generation_loop,
            fused_decode=c.fused_decode,
        )
        if self.sharded:  # sample and evaluate from an unsharded copy, refreshed each update
            self.engine.build_copy(self.amp_dtype or next(self.model.parameters()).dtype)
            self.eval_engine = self.engine
        self.sampling = SamplingParams(
            max_new_tokens=c.max_completion_length,
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
            repetition_penalty=c.repetition_penalty,
        )

    def _vllm_engine(self):
        from grpokit.rollout.vllm_engine import VLLMColocateEngine, VLLMServerEngine

        c = self.cfg
        if c.vllm_mode == "server":
            return VLLMServerEngine(
                self.model,
                self.tokenizer,
                c.vllm_server_host,
                c.vllm_server_port,
                c.vllm_server_timeout,
            )
        max_len = c.vllm_max_model_len
        if max_len is None and c.max_prompt_length is not None:
            max_len = c.max_prompt_length + c.max_completion_length
            limit = getattr(self.model.config, "max_position_embeddings", None)
            if limit:  # vLLM refuses a longer context than the model's
                max_len = min(max_len, int(limit))
        dtype = "bfloat16" if c.bf16 else c.torch_dtype
        # vLLM's CPU worker binds this process's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND)
        # and from then on turns torch.set_num_threads into a no-op with a warning
        return VLLMColocateEngine(
            self.model,
            self.tokenizer,
            self.model_source.path,
            dtype="auto" if dtype == "auto" else dtype,
            max_model_len=max_len,
            gpu_memory_utilization=c.vllm_gpu_memory_utilization,
            enable_sleep_mode=c.vllm_enable_sleep_mode,
            enforce_eager=c.vllm_enforce_eager,
            seed=c.seed,
        )

    def _setup_optimization(self) -> None:
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = build_optimizer(self.params, self.cfg)
        if self.sharded:
            self.model, self.optimizer, self.ref_model = self.sharded.prepare(
                self.model, self.optimizer, self.ref_model
            )
            self.engine.model = self.model
            self.engine.full_params = lambda: self.sharded.full_params(self.model)
            self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.sharded:
            _sparse_tied_embedding_grad(self.model)
        # checkpointed layers recompute their forward inside the backward, outside the
        # route: they keep transformers' SDPA for both
        self._own_attention_backward = (
            self.cfg.attention_backward
            and self.device.type == "cpu"
            and not _checkpointing(self.model)
        )
        self.train_positions = 0  # token positions through the model in training forwards
        self._rss_base: int | None = None  # highest RSS of the first steps (heap trimming)
        self.scheduler = build_scheduler(self.optimizer, self.cfg, self.total_steps)

    # ------------------------------------------------------------------ resume
    def _resume(self, resume: str | bool) -> None:
        ckpt = latest_checkpoint(self.out) if resume is True or resume == "latest" else Path(resume)
        if ckpt is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint in {self.out}")
        if self.sharded:
            raise ValueError(
                f"--resume under {self.launch.describe()} is not implemented (its checkpoints "
                "hold the whole weights but no optimizer state); start a new output_dir with "
                f"model_name_or_path: {ckpt}, or train with torchrun / multi_gpu.yaml"
            )
        files = load_trainer_files(ckpt)
        saved = yaml.safe_load(files["config_yaml"])
        diffs = [k for k in RESUME_LOCKED_KEYS if saved.get(k) != getattr(self.cfg, k)]
        if diffs:
            lines = ", ".join(f"{k}: {saved.get(k)!r} -> {getattr(self.cfg, k)!r}" for k in diffs)
            raise ValueError(
                f"cannot resume from {ckpt}: the config changes what training means ({lines}); "
                "resume with the checkpoint's values or start a new output_dir"
            )
        load_model_weights(self.model, ckpt, is_peft=self.cfg.use_peft)
        self.engine.weights_updated()
        self.optimizer.load_state_dict(files["optimizer"])
        self.scheduler.load_state_dict(files["scheduler"])
        if files["ref_model"] is not None and self.ref_model is not None:
            self.ref_model.load_state_dict(files["ref_model"])
        st = files["state"]
        self.sampler.load_state_dict(st["sampler"])
        self.step = self.resumed_from = st["global_step"]
        self.counters = dict(st.get("counters", {}))
        set_rng_state(files["rng"])
        if dist.is_main():  # drop what a killed run logged after its last checkpoint
            for name in ("metrics.jsonl", "completions.jsonl"):
                _truncate_log(self.out / name, self.step)
        self.logger.print(f"resumed from {ckpt} at step {self.step}")

    def save(self) -> Path | None:
        path = None
        model, sd = self._model_for_saving()
        if dist.is_main():
            c = self.cfg
            synced = c.sync_ref_model and self.step >= c.ref_model_sync_steps
            path = save_checkpoint(
                self.out,
                self.step,
                model=model,
                model_state_dict=sd,
                tokenizer=self.tokenizer,
                optimizer=None if self.sharded else self.optimizer,
                scheduler=self.scheduler,
                trainer_state={
                    "global_step": self.step,
                    "sampler": self.sampler.state_dict(),
                    "counters": self.counters,
                    "total_steps": self.total_steps,
                },
                config_yaml=yaml.safe_dump(c.to_dict(), sort_keys=False),
                ref_model=self.ref_model if synced else None,
                save_total_limit=c.save_total_limit,
            )
        dist.barrier()
        return path

    # ------------------------------------------------------------------ log-probs
    def completion_logps(self, model, ro: Rollout, rows, with_entropy: bool = False):
        """(n, C) log-probs of the completion tokens of ``rows`` (and their entropies).

        ``rows`` is a slice or an index tensor. Logits are divided by the sampling
        temperature, so these are the log-probs of the distribution the tokens were sampled
        from. Columns that are padding in every row of ``rows`` are not computed (prompt
        columns on the left, completion columns after the longest completion); positions
        past a row's completion are returned as 0. With the fused head (``fused_logprobs``),
        the output layer, log-softmax and entropy run token chunk by token chunk over the
        completion tokens only, never holding the (n, C, V) logits.
        """
        p_ids, p_mask = ro.prompt_ids[rows], ro.prompt_mask[rows]
        c_ids, c_mask = ro.completion_ids[rows], ro.completion_mask[rows]
        n, C = c_ids.shape
        P = p_ids.shape[1]
        pk = max(1, int(p_mask.sum(-1).max()))  # prompts are left-padded
        ck = max(1, int(c_mask.sum(-1).max()))  # completions are right-padded
        p_ids, p_mask = p_ids[:, P - pk :], p_mask[:, P - pk :]
        c_ids, c_mask = c_ids[:, :ck], c_mask[:, :ck]
        head = _fused_head(model) if self.cfg.fused_logprobs else None
        shared = self._shared_prompts(model, p_ids, p_mask)
        if torch.is_grad_enabled():  # token positions the training forward computes
            u = n if shared is None else shared[0].numel()
            self.train_positions += u * (pk - 1) + n * (ck + 1)
        if shared is not None:
            hs_or_logits = self._forward_shared_prompts(
                model, head, p_ids, p_mask, c_ids, c_mask, shared
            )
        else:
            ids = torch.cat([p_ids, c_ids], dim=1)  # (n, pk+ck)
            attn = torch.cat([p_mask, c_mask], dim=1)
            pos = (attn.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
            with autocast(ids.device.type, self.amp_dtype):
                if head is None:
                    out = model(
                        input_ids=ids,
                        attention_mask=attn,
                        position_ids=pos,
                        logits_to_keep=ck + 1,
                        use_cache=False,
                    )
                    hs_or_logits = out.logits[:, :-1]  # (n, ck, V)
                else:
                    hs = head[0](
                        input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False
                    ).last_hidden_state  # (n, pk+ck, H)
                    hs_or_logits = hs[:, pk - 1 : pk + ck - 1]  # the positions predicting c_ids
        if head is None:
            logits = hs_or_logits / self.cfg.temperature  # (n, ck, V)
            logp = selective_log_softmax(logits, c_ids) * c_mask
            ent = entropy_from_logits(logits.detach()) * c_mask if with_entropy else None
            return _pad_cols(logp, C), (None if ent is None else _pad_cols(ent, C))
        lm_head = head[1]
        sel = c_mask.bool()
        h = hs_or_logits[sel]  # (tokens, H)
        lp, ent = linear_logprobs(
            h,
            lm_head.weight,
            c_ids[sel],
            bias=lm_head.bias,
            temperature=self.cfg.temperature,
            compute_dtype=self.amp_dtype,
            with_entropy=with_entropy,
        )
        flat = torch.nonzero(torch.nn.functional.pad(sel, (0, C - ck)).reshape(-1)).squeeze(1)
        logp = lp.new_zeros(n * C).index_put((flat,), lp).view(n, C)
        if ent is not None:
            ent = ent.new_zeros(n * C).index_put((flat,), ent).view(n, C)
        return logp, ent

    def _shared_prompts(self, model, p_ids, p_mask):
        """(first row of each distinct prompt, (n,) index of each row's prompt) when rows
        share prompts and the shared-prompt forward applies, else None."""
        if not self.cfg.share_prompt_forward or p_ids.shape[1] < 2:
            return None
        if _checkpointing(model):
            return None  # checkpointed layers run without a KV cache
        key = torch.cat([p_ids, p_mask], dim=1)
        uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
        if uniq.shape[0] == p_ids.shape[0]:
            return None
        n, dev = p_ids.shape[0], p_ids.device
        first = torch.full((uniq.shape[0],), n, dtype=torch.long, device=dev)
        first = first.scatter_reduce(0, inverse, torch.arange(n, device=dev), "amin")
        return first, inverse

    def _forward_shared_prompts(self, model, head, p_ids, p_mask, c_ids, c_mask, shared):
        """The same numbers as one forward over [prompt | completion] rows, with each
        distinct prompt computed once: its tokens but the last run through the model for the
        distinct prompts only, the KV cache is indexed out to every row (autograd sums the
        rows' gradients back into the shared prompt), then each row runs [last prompt token |
        completion] against it. Returns the hidden states (fused head) or logits predicting
        ``c_ids``, (n, ck, .)."""
        first, inverse = shared
        ck = c_ids.shape[1]
        pre_ids, pre_mask = p_ids[first, :-1], p_mask[first, :-1]  # (u, pk-1)
        pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
        ids = torch.cat([p_ids[:, -1:], c_ids], dim=1)  # (n, ck+1)
        attn = torch.cat([p_mask, c_mask], dim=1)  # (n, pk+ck): the cached columns and these
        start = p_mask.sum(-1, keepdim=True) - 1  # position of the last prompt token
        pos = start + torch.arange(ck + 1, device=ids.device)[None]
        net = model if head is None else head[0]
        extra = {"logits_to_keep": 1} if head is None else {}
        with autocast(ids.device.type, self.amp_dtype):
            cache = net(
                input_ids=pre_ids,
                attention_mask=pre_mask,
                position_ids=pre_pos,
                use_cache=True,
                **extra,
            ).past_key_values
            cache.batch_select_indices(inverse)
            out = net(
                input_ids=ids,
                attention_mask=attn,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                **({"logits_to_keep": 0} if head is None else {}),
            )
        return (out.logits if head is None else out.last_hidden_state)[:, :ck]

    def _micro_batches(self, ro: Rollout, keep_order: bool = False) -> list[torch.Tensor]:
        """Row indices of each micro-batch (at most ``per_device_train_batch_size`` rows).

        The loss sums are the same in any partition except ``bnpo``'s per-micro-batch mean
        (``keep_order``: consecutive rows, full micro-batches). Otherwise rows are ordered
        and split to make the forward passes cheap: each micro-batch pads to its own longest
        prompt and completion, and with ``share_prompt_forward`` each distinct prompt in it
        runs once. For three orders (by total length, by completion length, whole groups by
        their longest completion) the split points are chosen by dynamic programming to
        minimise the token positions computed plus a fixed cost per forward pass, and the
        cheapest order is used."""
        N, mb = ro.completion_ids.shape[0], self.cfg.per_device_train_batch_size
        if keep_order:
            order = torch.arange(N, device=ro.completion_ids.device)
            return [order[s : s + mb] for s in range(0, N, mb)]
        plen = ro.prompt_mask.sum(-1)
        clen = ro.completion_mask.sum(-1)
        if self.sharded:  # every rank runs the same number of forwards and backwards
            order = torch.argsort(plen + clen, descending=True, stable=True)
            return [order[s : s + mb] for s in range(0, N, mb)]
        G = max(1, self.cfg.num_generations)
        group = torch.arange(N, device=clen.device) // G
        by_group = torch.argsort(clen, descending=True, stable=True)
        gmax = torch.zeros(int(group.max()) + 1, dtype=clen.dtype, device=clen.device)
        gmax = gmax.scatter_reduce(0, group, clen, "amax")
        key = gmax[group[by_group]] * (N + 1) - group[by_group]
        by_group = by_group[torch.argsort(key, descending=True, stable=True)]
        candidates = [
            torch.argsort(plen + clen, descending=True, stable=True),
            torch.argsort(clen, descending=True, stable=True),
            by_group,
        ]
        best = min((_split_rows(o, plen, clen, group, mb, self.cfg.share_prompt_forward)
                    for o in candidates), key=lambda r: r[0])  # fmt: skip
        return best[1]

    @torch.no_grad()
    def _logps_no_grad(self, model, ro: Rollout) -> torch.Tensor:
        out = torch.zeros(
            ro.completion_ids.shape, dtype=torch.float32, device=ro.completion_ids.device
        )
        for idx in self._micro_batches(ro):
            out[idx] = self.completion_logps(model, ro, idx)[0]
        return out

    def _ref_logps(self, ro: Rollout) -> torch.Tensor:
        if self.ref_model is not None:
            return self._logps_no_grad(self.ref_model, ro)
        with self.model.disable_adapter():  # LoRA: the base model is the reference
            return self._logps_no_grad(self.model, ro)

    # ------------------------------------------------------------------ one round
    def _next_rows(self) -> list[dict[str, Any]]:
        idx = self.sampler.next()
        r = dist.rank()
        idx = idx[r * self.prompts_per_rank : (r + 1) * self.prompts_per_rank]
        return [self.train_rows[i] for i in idx]

    def _rollout_and_score(self, rows) -> tuple[Batch, dict[str, Any], list[dict[str, Any]]]:
        c, G = self.cfg, self.cfg.num_generations
        t0 = time.time()
        texts = render_prompts(self.tokenizer, [r["prompt"] for r in rows])
        p_ids, p_mask = tokenize_prompts(
            self.tokenizer, texts, c.max_prompt_length, c.prompt_truncation, self.counters
        )
        ro = self.engine.generate(p_ids, p_mask, self.sampling, num_generations=G)
        fault_point("generation", self.step + 1)
        t1 = time.time()

        prompts = [r["prompt"] for r in rows for _ in range(G)]
        completions = [[{"role": "assistant", "content": t}] for t in ro.texts]
        cols = columns_for_rewards(rows, G)
        cols["completion_ids"] = [
            ro.completion_ids[i, : int(n)].tolist() for i, n in enumerate(ro.lengths)
        ]
        rewards = score(
            self.reward_funcs,
            prompts,
            completions,
            cols,
            on_error=c.reward_errors,
            counters=self.counters,
        )  # (N, F)
        all_rewards = dist.all_gather_cat(rewards)  # (N_global, F): statistics are global
        total = combine(all_rewards, self.reward_weights)  # (N_global,)
        adv_all = group_advantages(total, G, c.scale_rewards_mode)
        N = rewards.shape[0]
        adv = adv_all[dist.rank() * N : (dist.rank() + 1) * N].to(self.device)
        t2 = time.time()

        loss_mask = ro.completion_mask.clone()
        if c.mask_truncated_completions:
            loss_mask[ro.truncated] = 0
        # With num_iterations > 1 the old log-probs are the first optimizer step's own
        # (detached; see _optimizer_step): the policy has not changed yet, so no extra pass.
        ref_logp = self._ref_logps(ro) if c.beta > 0 else None
        batch = Batch(ro, loss_mask, adv, None, ref_logp)
        t3 = time.time()

        lengths = dist.all_gather_cat(ro.lengths.float())
        truncated = dist.all_gather_cat(ro.truncated.float())
        m: dict[str, Any] = {
            "reward": torch.nanmean(total),
            **group_reward_stats(total, G),
            "completions/mean_length": lengths.mean(),
            "completions/min_length": lengths.min(),
            "completions/max_length": lengths.max(),
            "completions/clipped_ratio": truncated.mean(),
            "time/generation": t1 - t0,
            **(
                {"time/weight_sync": self.engine.sync_seconds}
                if getattr(self.engine, "sync_seconds", None) is not None
                else {}
            ),
            "time/scoring": t2 - t1,
            "time/reference": t3 - t2,
            "tokens_generated": lengths.sum(),
            "tokens_prompt": dist.all_reduce_sum(ro.prompt_mask.sum().float()),
        }
        for j, name in enumerate(self.reward_names):
            col = all_rewards[:, j]
            valid = col[~torch.isnan(col)]
            m[f"rewards/{name}/mean"] = valid.mean() if valid.numel() else float("nan")
            m[f"rewards/{name}/std"] = valid.std() if valid.numel() > 1 else float("nan")
        correct = [
            self.task.is_correct(t, r)
            for t, r in zip(ro.texts, [r for r in rows for _ in range(G)])
        ]
        m["accuracy"] = dist.all_reduce_sum(torch.tensor(float(sum(correct)))) / total.numel()

        table = []
        if c.log_completions:
            for i in range(N):
                table.append(
                    {
                        "prompt": prompts[i][-1]["content"],
                        "completion": ro.texts[i],
                        "reward": _nan_none(total[dist.rank() * N + i].item()),
                        "rewards": {
                            n: _nan_none(rewards[i, j].item())
                            for j, n in enumerate(self.reward_names)
                        },
                        "advantage": adv[i].item(),
                    }
                )
        return batch, m, table

    def _optimizer_step(self, b: Batch) -> dict[str, Any]:
        """One optimizer step over the round's batch: micro-batches + gradient accumulation."""
        c = self.cfg
        t0 = time.time()
        N = b.advantages.shape[0]
        mb = c.per_device_train_batch_size
        n_micro = math.ceil(N / mb)
        num_seqs = float(N * dist.world_size())
        num_tokens = dist.all_reduce_sum(b.loss_mask.sum().float()).item()
        acc: dict[str, float] = {}
        loss_total, tok_total = 0.0, 0.0
        finite = True
        positions0 = self.train_positions
        # first step of a round with num_iterations > 1: this step's log-probs, detached, are
        # the old log-probs of the steps after it (the ratio is exactly 1 in this one)
        record = (
            torch.zeros_like(b.loss_mask, dtype=torch.float32)
            if (c.num_iterations > 1 and b.old_logp is None)
            else None
        )
        if self.sharded:
            self.sharded.begin_step()
        s_logps = b.rollout.sampling_logps  # (N, C) from vLLM, None from the HF engine
        extremes: dict[str, float] = {}
        for sl in self._micro_batches(b.rollout, keep_order=c.loss_type == "bnpo"):
            with training_attention(self._own_attention_backward):
                logp, ent = self.completion_logps(self.model, b.rollout, sl, with_entropy=True)
            if record is not None:
                record[sl] = logp.detach()
            is_w, is_m = None, {}
            if s_logps is not None:  # the sampler's log-probs vs ours under the same weights
                old = logp.detach() if b.old_logp is None else b.old_logp[sl]
                is_w, is_m = sampling_is_weights(
                    old,
                    s_logps[sl],
                    b.loss_mask[sl],
                    mode=c.vllm_importance_sampling_mode,
                    cap=c.vllm_importance_sampling_cap,
                )
                if not c.vllm_importance_sampling_correction:
                    is_w = None  # measured and logged, not applied
                for k in [k for k in is_m if k.endswith(("_max", "_min"))]:
                    v = is_m.pop(k).item()
                    pick = max if k.endswith("_max") else min
                    extremes[k] = pick(extremes.get(k, v), v)
            loss, m = policy_loss(
                logp,
                None if b.old_logp is None else b.old_logp[sl],
                None if b.ref_logp is None else b.ref_logp[sl],
                b.advantages[sl],
                b.loss_mask[sl],
                loss_type=c.loss_type,
                epsilon_low=c.epsilon,
                epsilon_high=c.epsilon_high,
                beta=c.beta,
                importance_sampling_level=c.importance_sampling_level,
                max_completion_length=c.max_completion_length,
                num_sequences=num_seqs,
                num_tokens=num_tokens,
                entropy=ent,
                is_weights=is_w,
            )
            m.update(is_m)
            if c.loss_type == "bnpo":  # per-micro-batch mean: average over micro-batches/ranks
                loss = loss / (n_micro * dist.world_size())
            if not torch.isfinite(loss):
                finite = False
                if not self.sharded:  # sharded backward has collectives: every rank runs it
                    break
            if self.sharded:
                self.sharded.backward(self.model, loss)
            else:
                loss.backward()
            fault_point("backward", self.step + 1)
            loss_total += loss.item()
            ntok = b.loss_mask[sl].sum().item()
            tok_total += ntok
            for k, v in m.items():
                acc[k] = acc.get(k, 0.0) + v.item() * ntok
        if record is not None and finite:
            b.old_logp = record  # (a skipped micro-batch loop leaves it None: recorded again)
        finite = bool(dist.all_reduce_sum(torch.tensor(0.0 if finite else 1.0)).item() == 0.0)
        grad_norm = torch.tensor(float("nan"))
        max_norm = c.max_grad_norm if c.max_grad_norm > 0 else float("inf")
        if finite and self.sharded:  # the engine reduces gradients; see ShardedTraining
            grad_norm = self.sharded.clip_grad_norm(self.model, self.params, max_norm)
            finite = bool(torch.isfinite(grad_norm))
        elif finite:
            dist.sum_gradients(self.params)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
            finite = bool(torch.isfinite(grad_norm))
        lr = self.scheduler.get_last_lr()[0]
        if finite:
            self.optimizer.step()
            self.engine.weights_updated()
            self._consecutive_skips = 0
        else:
            if self.sharded and self.sharded.steps_in_backward:
                log.warning("DeepSpeed applied this step's update inside backward; not skipped")
            self._skip_nonfinite(b)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        if (
            c.sync_ref_model
            and self.ref_model is not None
            and self.step % c.ref_model_sync_steps == 0
        ):
            _mix_into(self.ref_model, self.model, c.ref_model_mixup_alpha)
        if dist.world_size() > 1:  # token-weighted means over all ranks
            keys = sorted(acc)
            packed = dist.all_reduce_sum(
                torch.tensor([acc[k] for k in keys] + [tok_total], dtype=torch.float64)
            )
            acc, tok_total = dict(zip(keys, packed[:-1].tolist())), packed[-1].item()
        out = {k: v / max(tok_total, 1.0) for k, v in acc.items()}
        out.update(extremes)
        out.update(
            loss=dist.all_reduce_sum(torch.tensor(loss_total)).item() if finite else float("nan"),
            grad_norm=grad_norm.item(),
            learning_rate=lr,
            skipped_steps=self.counters.get("skipped_nonfinite_steps", 0),
            reward_errors=self.counters.get("reward_errors", 0),
            truncated_prompts=self.counters.get("truncated_prompts", 0),
        )
        out["time/training"] = time.time() - t0
        out["tokens_forward"] = dist.all_reduce_sum(
            torch.tensor(float(self.train_positions - positions0))
        ).item()
        self._rss_base = _release_freed_memory(self._rss_base, self.step)
        return out

    def _skip_nonfinite(self, b: Batch) -> None:
        """No update this step: count it, dump what went in, stop after too many in a row."""
        self.counters["skipped_nonfinite_steps"] = (
            self.counters.get("skipped_nonfinite_steps", 0) + 1
        )
        self._consecutive_skips = getattr(self, "_consecutive_skips", 0) + 1
        dump = self.out / f"nonfinite-step-{self.step + 1}.pt"
        if dist.is_main():
            self.out.mkdir(parents=True, exist_ok=True)
            nonfinite_params = [  # (this rank's shard of sharded parameters)
                n
                for n, p in self.model.named_parameters()
                if not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
            ]
            torch.save(
                {
                    "step": self.step + 1,
                    "advantages": b.advantages,
                    "loss_mask": b.loss_mask,
                    "completion_ids": b.rollout.completion_ids,
                    "texts": b.rollout.texts,
                    "old_logp": b.old_logp,
                    "ref_logp": b.ref_logp,
                    "nonfinite_params": nonfinite_params,
                },
                dump,
            )
        log.warning(
            "non-finite loss or gradient at step %d: update skipped, inputs dumped to %s",
            self.step + 1,
            dump,
        )
        if self._consecutive_skips >= self.cfg.max_nonfinite_skips:
            raise FloatingPointError(
                f"{self._consecutive_skips} consecutive steps had a non-finite loss or gradient; "
                f"stopping. Inputs of the last one: {dump}. Lower learning_rate, check the rewards, "
                "or use torch_dtype float32"
            )

    # ------------------------------------------------------------------ the loop
    def train(self) -> dict[str, Any]:
        c = self.cfg
        self._install_signal_handlers()
        results: dict[str, Any] = {}
        self.logger.print(f"model: {self.model_source.source}")
        self.logger.print(
            f"task {c.task}: {len(self.train_rows)} train prompts, {len(self.eval_rows)} held-out; "
            f"{c.prompts_per_step} prompts x {c.num_generations} completions per step; "
            f"{self.total_steps} steps; rewards {self.reward_names} weights {self.reward_weights.tolist()}"
        )
        self._status("running")
        if dist.is_main():
            save_config(c, self.out / "config.yaml")  # the run's resolved config, for its report
        if self.eval_rows and self.step == 0:
            results["before"] = self._evaluate("before")
        stopped = False
        self.logger.start(self.step)
        try:
            while self.step < self.total_steps:
                t_round, round_start = time.time(), self.step
                rows = self._next_rows()
                batch, rmetrics, table = self._rollout_and_score(rows)
                saved_due = False
                for _ in range(c.num_iterations):
                    if self.step >= self.total_steps:
                        break
                    m = self._optimizer_step(batch)
                    m.update(rmetrics)
                    m["time/step"] = time.time() - t_round
                    t_round = time.time()
                    # a round's timings and generated tokens belong to its first step only
                    rmetrics = {
                        k: v
                        for k, v in rmetrics.items()
                        if not k.startswith("time/") and k != "tokens_generated"
                    }
                    if (
                        self.step % c.logging_steps == 0
                        or self.step == 1
                        or self.step == self.total_steps
                    ):
                        self.logger.log(self.step, m, resumed_from=self.resumed_from)
                        if table:
                            self.logger.log_completions(self.step, table)
                    saved_due |= bool(c.save_steps) and self.step % c.save_steps == 0
                if (
                    c.eval_steps
                    and self.eval_rows
                    and self.step % c.eval_steps == 0
                    and self.step < self.total_steps
                ):
                    r = self._evaluate(f"step-{self.step}", verbose=False)
                    self.logger.log(
                        self.step,
                        {f"eval/{k}": v for k, v in r.items() if isinstance(v, float)},
                        resumed_from=self.resumed_from,
                    )
                if saved_due and self.step < self.total_steps:
                    self.save()
                if (
                    c.report_steps
                    and self.step // c.report_steps > round_start // c.report_steps
                    and self.step < self.total_steps
                ):
                    self._write_report()
                if self._stop_requested:
                    raise Stop
        except (Stop, KeyboardInterrupt):
            stopped = True
            self._status("stopped")
            path = self.save()
            self.logger.print(
                f"\nstopped at step {self.step}; checkpoint saved to {path}.\n"
                f"continue with: grpokit train <recipe> --output_dir {c.output_dir} --resume"
            )
        except Exception as e:
            self._status("failed", error=f"{type(e).__name__}: {e}"[:2000])
            self._write_report()
            raise
        finally:
            self._restore_signal_handlers()
        if stopped:
            self._write_report()
            self.logger.close()
            return {"stopped": True, "step": self.step}
        ckpt = self.save() if c.save_steps else None
        final = self._save_final()
        if self.eval_rows:
            results["after"] = self._evaluate("after")
            if "before" in results:
                self.logger.print("\nheld-out evaluation (greedy):\n" + format_comparison(results))
                if dist.is_main():
                    save_eval(results, self.out / "eval_summary.json")
        self._status("finished")
        report = self._write_report()
        self.logger.print(
            f"\nfinal model: {final}\nmetrics: {self.out / 'metrics.jsonl'}"
            + (f"\nlast checkpoint: {ckpt}" if ckpt else "")
            + (f"\nreport: {report}" if report else f"\nreport: grpokit report {self.out}")
        )
        self.logger.close()
        return {"stopped": False, "step": self.step, "final_model": str(final), **results}

    def _status(self, state: str, **extra: Any) -> None:
        """status.json: what the run is doing, for the report (a running run's page reloads)."""
        self._state = state
        if not dist.is_main():
            return
        self.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "state": state,
            "step": self.step,
            "total_steps": self.total_steps,
            "updated": time.time(),
            **extra,
        }
        tmp = self.out / ".status.json.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.out / "status.json")

    def _write_report(self) -> Path | None:
        """report.html of the run so far; a failure here is logged, never fatal."""
        if not (self.cfg.write_report and dist.is_main()):
            return None
        try:
            from grpokit.report import write_report

            if getattr(self, "_state", None) == "running":
                self._status("running")  # the page shows the step it was written at
            return write_report(self.out)
        except ImportError as e:
            if not getattr(self, "_report_warned", False):
                log.warning("report.html not written (%s); pip install matplotlib", e)
                self._report_warned = True
        except Exception as e:  # noqa: BLE001 - the run matters more than its report
            log.warning("report.html not written: %s: %s", type(e).__name__, e)
        return None

    def _evaluate(self, tag: str, verbose: bool = True) -> dict[str, Any]:
        c = self.cfg
        t0 = time.time()
        r = evaluate(
            self.eval_engine,
            self.task,
            self.eval_rows,
            self.reward_funcs,
            batch_size=c.per_device_eval_batch_size,
            max_new_tokens=c.eval_max_completion_length or c.max_completion_length,
            max_prompt_length=c.max_prompt_length,
        )
        r["seconds"] = time.time() - t0
        if dist.is_main():
            save_eval(r, self.out / f"eval_{tag}.json")
        if verbose:
            self.logger.print(
                f"eval {tag}: accuracy {r['accuracy']:.3f}, format {r['format_rate']:.3f} "
                f"on {r['num_prompts']} held-out prompts ({r['seconds']:.0f}s)"
            )
        return r

    def _save_final(self) -> Path | None:
        from grpokit.models import save_final_model

        path = self.out / "final"
        model, sd = self._model_for_saving()
        if dist.is_main():
            save_final_model(
                model, self.tokenizer, path, merge_lora=self.cfg.merge_lora, state_dict=sd
            )
            (path / "grpokit_config.yaml").write_text(
                yaml.safe_dump(self.cfg.to_dict(), sort_keys=False)
            )
        dist.barrier()
        return path

    def _model_for_saving(self):
        """(model, state dict or None) to save. Sharded weights (FSDP, ZeRO-3) are gathered
        here, on every rank (a collective); rank 0 writes them."""
        if not self.sharded:
            return self.model, None
        model = self.sharded.unwrap(self.model)
        if self.launch.engine == "fsdp" or self.launch.zero_stage == 3:
            sd = self.sharded.full_state_dict(self.model)
            # tied weights (lm_head = embeddings) once, as save_pretrained writes them itself
            seen, dup = set(), []
            for name, p in model.named_parameters(remove_duplicate=False):
                (dup.append(name) if id(p) in seen else seen.add(id(p)))
            return model, {k: v for k, v in sd.items() if k not in dup}
        return model, None

    # ------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> None:
        self._old_handlers = {}

        def handler(signum, frame):
            if self._stop_requested:  # second press: stop now
                raise KeyboardInterrupt
            self._stop_requested = True
            self.logger.print(
                f"\n{signal.Signals(signum).name}: finishing this step, then saving "
                "a checkpoint (press again to stop at once)"
            )

        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old_handlers[s] = signal.signal(s, handler)
            except ValueError:  # not the main thread
                pass

    def _restore_signal_handlers(self) -> None:
        for s, h in getattr(self, "_old_handlers", {}).items():
            signal.signal(s, h)


# Causal LMs whose logits are exactly ``lm_head(final hidden state)`` (no soft-capping or
# scaling), so the fused head computes the same log-probs as the model's own forward.
FUSED_HEAD_MODEL_TYPES = frozenset(
    ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "olmo", "olmo2",
     "smollm3", "gemma", "gemma3_text")
)  # fmt: skip


def _fused_head(model):
    """(decoder, lm_head) when the fused head applies to ``model``, else None."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in FUSED_HEAD_MODEL_TYPES:
        return None
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:  # e.g. a LoRA-wrapped lm_head
        return None
    return model.get_decoder(), head


_LIBC = None
TRIM_SLACK_BYTES = 1 << 30
TRIM_WARMUP_STEPS = 4


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _release_freed_memory(base: int | None, step: int) -> int | None:
    """Bound the heap's growth (glibc ``malloc_trim``), checked once a step.

    ``./run`` keeps freed memory in the heap (``MALLOC_TRIM_THRESHOLD_`` at 16 GB,
    ``MALLOC_MMAP_MAX_=0`` so that blocks over 32 MB are not mmapped and unmapped on free)
    because fresh pages cost a page fault each (training 20 s -> 15 s a step). Tensors of a
    different size every step then fragment the heap, and
    the default run's RSS grew by ~0.12 GB a step (8.9 GB after 40 steps). Trimming returns
    every free page, which the next step faults in again: measured on the speed bench's (a)
    rollouts, 200-600 thousand page faults and 1.3-1.4 s more training time in a step after a
    trim (6.4 -> 7.9 s, 7.8 -> 9.2 s). So the base is the highest RSS after any of the first
    ``TRIM_WARMUP_STEPS`` steps (a step's working set with its heap, over several lengths),
    and a trim runs only when the RSS after a step is ``max(TRIM_SLACK_BYTES, base / 4)``
    above it: the heap stays bounded at 1.25 x the warm working set and trims are rare.
    Returns the base. No-op off glibc/Linux."""
    global _LIBC
    rss = _rss_bytes()
    if rss is None:
        return base
    if base is None or step <= TRIM_WARMUP_STEPS:
        return max(base or 0, rss)
    if rss < base + max(TRIM_SLACK_BYTES, base // 4):
        return base
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)
        log.info(
            "released freed heap memory: RSS %.2f -> %.2f GB", rss / 1e9, (_rss_bytes() or 0) / 1e9
        )
    return base


FORWARD_COST_TOKENS = (
    256  # fixed cost of one more forward pass, in token positions (measured: 64 split too finely)
)


def _split_rows(order, plen, clen, group, mb: int, share: bool):
    """(cost, micro-batches): ``order`` cut into consecutive pieces of at most ``mb`` rows,
    cut points chosen by dynamic programming to minimise the token positions the forward
    passes compute (with ``share``: each distinct group's prompt once, then one token more
    than the longest completion per row) plus FORWARD_COST_TOKENS per piece."""
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
            tokens = len(seen) * (pk - 1) + n * (ck + 1) if share else n * (pk + ck)
            c = best[j] + tokens + FORWARD_COST_TOKENS
            if best[i] is None or c < best[i]:
                best[i], cut[i] = c, j
    pieces, i = [], N
    while i > 0:
        pieces.append(order[cut[i] : i])
        i = cut[i]
    return best[N], pieces[::-1]


def _checkpointing(model) -> bool:
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # new, old name
        if hasattr(type(getattr(model, "get_base_model", lambda: model)()), name):
            return bool(getattr(model, name))
    return False


def _pad_cols(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1])) if x.shape[1] < width else x


def _sparse_tied_embedding_grad(model) -> bool:
    """When the trained input embedding is tied to the output head, make its lookup's
    gradient sparse (the rows the batch used) instead of a dense (V, H) tensor.

    The head's gradient is dense and reaches the same parameter in the same backward, and
    autograd adds the sparse part into it, so ``.grad`` is dense as before (same values up to
    float summation order). What goes is, per lookup, a zero-filled (V, H) float32 tensor
    and one (V, H) addition: for a 49k x 576 embedding, 113 MB of fresh memory each, measured
    at 20-150 ms a lookup here (page faults), with two lookups a micro-batch under the
    shared-prompt forward. Not for an untied embedding, whose sparse gradient would reach
    the optimizer, nor a frozen one."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if type(emb) is not torch.nn.Embedding or head is None:
        return False
    if emb.weight is not getattr(head, "weight", None) or not emb.weight.requires_grad:
        return False
    emb.sparse = True
    return True


def _lower_frozen_linears(model, dtype: torch.dtype) -> int:
    """Store the weights of ``model``'s plain ``nn.Linear`` layers (the output head included,
    untied from a float32 input embedding, which stays as it is) in ``dtype``.

    For a frozen model run under autocast to ``dtype``, whose products cast their weights
    to ``dtype`` anyway: the log-probs are bit-identical, the per-forward casts of every
    weight go (about a 3-byte-per-parameter pass each reference micro-batch), and the
    weights take half the memory. Norms, embeddings and everything outside the products stay
    in their dtype. Returns the number of layers lowered."""
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    n = 0
    for m in model.modules():
        if type(m) is not torch.nn.Linear or m.weight.dtype == dtype:
            continue
        if m is out_emb and in_emb is not None and m.weight is in_emb.weight:
            m.weight = torch.nn.Parameter(m.weight.detach().to(dtype), requires_grad=False)
        else:
            m.to(dtype)
        n += 1
    return n


@torch.no_grad()
def _mix_into(ref, model, alpha: float) -> None:
    """TR-DPO reference update (Gorbatovski et al. 2024): ref <- alpha*policy + (1-alpha)*ref."""
    for pr, pm in zip(ref.parameters(), model.parameters()):
        pr.mul_(1.0 - alpha).add_(pm.detach(), alpha=alpha)


def _truncate_log(path: Path, step: int) -> None:
    """Keep only the rows of a jsonl log whose step is <= ``step``."""
    if not path.exists():
        return
    import json

    kept = [
        ln
        for ln in path.read_text().splitlines()
        if ln.strip() and json.loads(ln).get("step", 0) <= step
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(ln + "\n" for ln in kept))
    tmp.replace(path)


def _nan_none(x: float):
    return None if math.isnan(x) else x


def _trackers(cfg: GRPOConfig) -> list:
    names = [cfg.report_to] if isinstance(cfg.report_to, str) else list(cfg.report_to)
    names = [n for n in names if n != "none"]
    if not names or not dist.is_main():
        return []
    from grpokit.trackers import make_trackers

    return make_trackers(names, cfg)
