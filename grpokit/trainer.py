"""The GRPO loop. Reads top to bottom: sample, score, advantages, update.

One *round* = one generation batch of ``prompts_per_step`` prompts x G completions, followed
by ``num_iterations`` optimizer steps over it. ``max_steps`` counts optimizer steps.

The parts come from ``grpokit.setup`` (the one place the config is unpacked); the math from
``grpokit.algo``; the forward passes from ``grpokit.forward``; how the processes share the
work from the strategy in ``grpokit.launch``. This file decides only *when* things happen.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from grpokit import distributed as dist
from grpokit import setup
from grpokit.batch import Batch
from grpokit.batch import loss_mask as make_loss_mask
from grpokit.checkpoint import (
    NonFiniteSkips,
    check_resume_config,
    fault_point,
    latest_checkpoint,
    load_model_weights,
    load_trainer_files,
    save_checkpoint,
    set_rng_state,
    skipped_when_full,
)
from grpokit.config import GRPOConfig, save_config
from grpokit.dynamic import Groups, fill_batch, one_batch
from grpokit.evaluation import describe_eval, evaluate_rows, format_comparison, save_eval
from grpokit.launch import launch_from_env, training_strategy
from grpokit.logging import MetricsLogger, truncate_logs
from grpokit.metrics import accuracy, completions_table, counter_metrics, graded, round_metrics
from grpokit.prompts import render_prompts, tokenize_prompts
from grpokit.scoring import round_advantages, score_rollout
from grpokit.speed.fastdecode import keep_decoders
from grpokit.speed.heap import HeapRelease
from grpokit.status import HealthAlerts, RunStatus, StopRequests

log = logging.getLogger("grpokit")


class Stop(Exception):
    """Raised inside the loop when SIGINT/SIGTERM asked to stop after a checkpoint."""


class GRPOTrainer:
    def __init__(self, cfg: GRPOConfig, *, resume: str | bool | None = None, stream=None):
        self.device = dist.resolve_device(cfg.device)  # a missing GPU fails before any work
        launch = launch_from_env()  # every refusal before any model loads: setup.preflight
        self.task, self.rewards = setup.preflight(cfg, launch, cfg.world_size, self.device)
        self.strategy = training_strategy(cfg, launch)
        self.cfg = cfg = self.strategy.adjust_config(cfg)
        dist.init(self.device, cfg.ddp_timeout)  # every collective waits at most ddp_timeout
        torch.manual_seed(cfg.seed)
        if cfg.torch_num_threads:
            torch.set_num_threads(cfg.torch_num_threads)
        self.out = Path(cfg.output_dir)
        self.counters: dict[str, int] = {}
        self.hub = setup.hub(cfg)  # push_to_hub: token, hub and repository checked now
        self.data = setup.build_data(cfg, self.task)
        self.train_rows, self.eval_rows = self.data.train_rows, self.data.eval_rows
        self.total_steps = self.data.total_steps
        self.models = setup.build_models(cfg, self.device, self.strategy)
        self.engine, self.eval_engine, self.sampling = setup.build_engines(
            cfg, self.models, self.strategy
        )
        self.agent = setup.build_agent(cfg, self.models, self.rewards, self.train_rows)
        self.opt = setup.build_optimization(
            cfg, self.models, self.engine, self.strategy, self.device, self.total_steps
        )
        self.logprobs, self.reference = self.opt.logprobs, self.opt.reference
        self.heap = HeapRelease()
        self.logger = MetricsLogger(
            self.out, self.total_steps, stream=stream, enabled=dist.is_main(),
            trackers=setup.trackers(cfg),
        )  # fmt: skip
        self.status = RunStatus(
            self.out, self.total_steps, enabled=dist.is_main(), report=cfg.write_report
        )
        self.stop = StopRequests(self.logger.print)
        self.health = HealthAlerts(cfg, self.status, enabled=dist.is_main())  # docs/health.md
        self.nonfinite = NonFiniteSkips(self.out, cfg.max_nonfinite_skips, is_main=dist.is_main())
        self.step = self.resumed_from = 0
        if resume:
            self._resume(resume)

    # the parts tests and tools reach for
    model = property(lambda self: self.models.model)
    tokenizer = property(lambda self: self.models.tokenizer)
    ref_model = property(lambda self: self.models.ref_copy)
    optimizer = property(lambda self: self.opt.optimizer)
    scheduler = property(lambda self: self.opt.scheduler)

    def request_stop(self) -> None:
        """What SIGINT/SIGTERM do: finish this step, save a checkpoint, stop."""
        self.stop.requested = True

    # ------------------------------------------------------------------ the loop
    def train(self) -> dict[str, Any]:
        c = self.cfg
        self._announce()
        results: dict[str, Any] = {}
        if self.eval_rows and self.step == 0:
            results["before"] = self._evaluate("before")
        self.logger.start(self.step)
        try:
            with self.stop:
                while self.step < self.total_steps:
                    self._round()
        except (Stop, KeyboardInterrupt):  # a signal, or health_checks: stop (stop_line)
            self.status.set("stopped", self.step)
            path = self.save()
            self.logger.print(
                f"\nstopped at step {self.step}; checkpoint saved to {path or 'NOWHERE (disk full)'}.\n"
                f"continue with: grpokit train <recipe> --output_dir {c.output_dir} --resume"
            )
            self.status.write_report(self.step)
            self.logger.close()
            return {"stopped": True, "step": self.step, "health_stop": self.health.stop_line}
        except Exception as e:
            self.status.set("failed", self.step, error=f"{type(e).__name__}: {e}"[:2000])
            self.status.write_report(self.step)
            raise
        return self._finish(results)

    def _round(self) -> None:
        """One generation batch, then num_iterations optimizer steps over it; held-out
        evaluation, checkpoint and report when one falls due inside the round."""
        c = self.cfg
        t_round, round_start = time.time(), self.step
        batch, rmetrics, table = self.collect_round()
        for _ in range(c.num_iterations):
            if self.step >= self.total_steps:
                break
            m = self.optimizer_step(batch)
            m.update(rmetrics)
            m["time/step"] = time.time() - t_round
            m.update(self.health.observe(self.step, m))
            t_round = time.time()
            # a round's timings and generated tokens belong to its first step only
            rmetrics = {
                k: v
                for k, v in rmetrics.items()
                if not k.startswith("time/") and k != "tokens_generated"
            }
            if self.step % c.logging_steps == 0 or self.step in (1, self.total_steps):
                self.logger.log(self.step, m, resumed_from=self.resumed_from)
                if table:
                    self.logger.log_completions(self.step, table)
        self._after_round(round_start)

    def _after_round(self, round_start: int) -> None:
        c, step = self.cfg, self.step

        def due(every: int) -> bool:  # a multiple of ``every`` passed during the round
            return bool(every) and step // every > round_start // every

        if step < self.total_steps:  # the end of training evaluates and saves anyway
            if c.eval_steps and self.eval_rows and step % c.eval_steps == 0:
                r = self._evaluate(f"step-{step}", verbose=False)
                evals = {f"eval/{k}": v for k, v in r.items() if isinstance(v, float)}
                self.logger.log(step, evals, resumed_from=self.resumed_from)
            if due(self.data.save_every):
                self.save()
            if due(c.report_steps):
                self.status.write_report(step)
        if self.stop.requested or self.health.stop_now():
            raise Stop

    # ------------------------------------------------------------------ one round
    def collect_round(self) -> tuple[Batch, dict[str, Any], list[dict[str, Any]]]:
        """Sample and score a generation batch (dynamic sampling: ``grpokit.dynamic``), compute
        advantages and reference log-probs: the round's batch, metrics, completions table."""
        c, G = self.cfg, self.cfg.num_generations
        with keep_decoders(), self.engine.rollout_phase():  # packed once for all batches
            w, pad = self.rewards.weights, self.tokenizer.pad_token_id or 0
            if c.dynamic_sampling:
                g, extra = fill_batch(self._generate_groups, w, G, self.data.call_sizes, pad)
            else:
                g, extra = one_batch(self._generate_groups, w, G)
        rows, ro, rewards = g.rows, g.rollout, g.rewards
        loss_mask = make_loss_mask(ro, c.mask_truncated_completions)
        t1 = time.time()  # lengths: the loss tokens (verl's response_mask) of each row
        all_rewards, total, adv = round_advantages(
            rewards, self.rewards.weights, c, self.device, lengths=loss_mask.sum(-1)
        )
        t2 = time.time()
        # With num_iterations > 1 the old log-probs are the first optimizer step's own
        # (detached; see update.GradientPass): the policy has not changed yet, no extra pass.
        ref_logp = None
        if c.beta > 0:
            ref_logp = self.reference.logps(self.logprobs, ro, self.opt.plan(ro))
        batch = Batch(ro, loss_mask, adv, None, ref_logp)
        t3 = time.time()
        m = round_metrics(ro, total, all_rewards, self.rewards, c)
        m.update({"time/generation": g.seconds[0], "time/scoring": g.seconds[1] + t2 - t1})
        m.update({"time/reference": t3 - t2, **extra})
        if getattr(self.engine, "sync_seconds", None) is not None:
            m["time/weight_sync"] = self.engine.sync_seconds
        m["accuracy"] = accuracy(g.correct, total.numel())
        table = []
        if c.log_completions:
            N, r = rewards.shape[0], dist.rank()
            prompts = [row["prompt"] for row in rows for _ in range(G)]
            local_total = total[r * N : (r + 1) * N]
            table = completions_table(
                prompts, ro.shown_texts, rewards, local_total, adv, self.rewards.names
            )
        return batch, m, table

    def _generate_groups(self, n: int | None = None) -> Groups:
        """This process's next ``n`` prompts (default: a step's), completions, (N, F) rewards."""
        c, G, r = self.cfg, self.cfg.num_generations, dist.rank()
        n = n or self.data.prompts_per_rank
        idx = self.data.sampler.next(n * dist.world_size())
        rows = [self.train_rows[i] for i in idx[r * n : (r + 1) * n]]
        t0 = time.time()
        if self.agent is not None:  # tools / environments: multi-turn (grpokit/rollout/agent.py)
            ro = self.agent.rollout(self.engine, rows, G, self.sampling, self.counters)
        else:
            texts = render_prompts(self.tokenizer, [r["prompt"] for r in rows])
            p_ids, p_mask = tokenize_prompts(
                self.tokenizer, texts, c.max_prompt_length, c.prompt_truncation, self.counters
            )
            ro = self.engine.generate(p_ids, p_mask, self.sampling, num_generations=G)
        fault_point("generation", self.step + 1)
        t1 = time.time()
        rewards = score_rollout(
            self.rewards.funcs, rows, ro, G, on_error=c.reward_errors, counters=self.counters
        )  # (N, F)
        ok = graded(self.task, ro.texts, rows, G)  # accuracy, sampled/*
        return Groups(rows, ro, rewards, (t1 - t0, time.time() - t1), ok)

    def optimizer_step(self, b: Batch) -> dict[str, Any]:
        """One optimizer step over the round's batch: micro-batches + gradient accumulation."""
        c, o = self.cfg, self.opt
        t0, positions0 = time.time(), self.logprobs.train_positions
        self.strategy.begin_step()
        pieces = o.plan(b.rollout, keep_order=c.loss_type == "bnpo")
        g = o.gradients.run(b, pieces, self.step + 1)
        o.grads.hold_back_unused()
        finite = bool(dist.all_reduce_sum(torch.tensor(0.0 if g.finite else 1.0)).item() == 0.0)
        grad_norm = torch.tensor(float("nan"))
        if finite:
            max_norm = c.max_grad_norm if c.max_grad_norm > 0 else float("inf")
            grad_norm = self.strategy.reduce_and_clip(self.model, o.params, max_norm)
            finite = bool(torch.isfinite(grad_norm))
        lr = o.scheduler.get_last_lr()[0]
        if finite:
            o.optimizer.step()
            self.engine.weights_updated()
            self.nonfinite.passed()
        else:
            if self.strategy.steps_in_backward:
                log.warning("DeepSpeed applied this step's update inside backward; not skipped")
            self.nonfinite.skip(self.step + 1, b, self.model, self.counters)
        o.grads.zero()
        o.scheduler.step()
        self.step += 1
        self.reference.after_step(self.step)
        out = g.means.result()
        out.update(
            loss=dist.all_reduce_sum(torch.tensor(g.loss_sum)).item() if finite else float("nan"),
            grad_norm=grad_norm.item(),
            learning_rate=lr,
            **counter_metrics(self.counters),
        )
        out["time/training"] = time.time() - t0
        positions = torch.tensor(float(self.logprobs.train_positions - positions0))
        out["tokens_forward"] = dist.all_reduce_sum(positions).item()
        self.heap.after_step(self.step)
        return out

    # ------------------------------------------------------------------ start and end
    def _announce(self) -> None:
        c = self.cfg
        self.logger.print(f"model: {self.models.source.source}")
        self.logger.print(
            f"task {c.task}: {len(self.train_rows)} train prompts, {len(self.eval_rows)} held-out; "
            f"{c.prompts_per_step} prompts x {c.num_generations} completions per step; "
            f"{self.total_steps} steps; rewards {self.rewards.names} "
            f"weights {self.rewards.weights.tolist()}"
        )
        self.status.set("running", self.step)
        if dist.is_main():
            save_config(c, self.out / "config.yaml")  # the run's resolved config, for its report

    def _finish(self, results: dict[str, Any]) -> dict[str, Any]:
        ckpt = self.save() if self.data.save_every else None
        final = self._save_final()
        if self.eval_rows:
            results["after"] = self._evaluate("after")
            if "before" in results:
                self.logger.print("\n" + format_comparison(results, "held-out evaluation"))
                if dist.is_main():
                    save_eval(results, self.out / "eval_summary.json")
        self.status.set("finished", self.step)
        report = self.status.write_report(self.step)
        self.logger.print(
            f"\nfinal model: {final or 'NOT SAVED (disk full, see above)'}"
            f"\nmetrics: {self.out / 'metrics.jsonl'}"
            + (f"\nlast checkpoint: {ckpt}" if ckpt else "")
            + (f"\nreport: {report}" if report else f"\nreport: grpokit report {self.out}")
        )
        self.logger.close()
        return {"stopped": False, "step": self.step, "final_model": final and str(final), **results}

    def _evaluate(self, tag: str, verbose: bool = True) -> dict[str, Any]:
        r = evaluate_rows(
            self.eval_engine, self.task, self.eval_rows, self.rewards.funcs, self.cfg, self.agent
        )
        if dist.is_main():
            save_eval(r, self.out / f"eval_{tag}.json")
        self.health.observe_eval(self.step, r)
        if verbose:
            self.logger.print(describe_eval(tag, r))
        return r

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path | None:
        path = None
        model, sd = self.strategy.model_for_saving(self.model)
        if dist.is_main():
            with skipped_when_full(self.counters, "checkpoints_not_saved", "training goes on"):
                path = save_checkpoint(
                    self.out,
                    self.step,
                    model=model,
                    model_state_dict=sd,
                    tokenizer=self.tokenizer,
                    optimizer=self.strategy.optimizer_to_save(self.optimizer),
                    scheduler=self.scheduler,
                    trainer_state={
                        "global_step": self.step,
                        "sampler": self.data.sampler.state_dict(),
                        "call_sizes": self.data.call_sizes.state_dict(),
                        "counters": self.counters,
                        "total_steps": self.total_steps,
                        "entropy_control": self.opt.gradients.state_dict(),
                        "health": self.health.state_dict(),
                    },
                    config_yaml=yaml.safe_dump(self.cfg.to_dict(), sort_keys=False),
                    ref_model=self.reference.to_save(self.step),
                    save_total_limit=self.cfg.save_total_limit,
                )
            if self.hub and path is not None:
                self.hub.after_save(path, self.step)
        dist.barrier()
        return path

    def _resume(self, resume: str | bool) -> None:
        ckpt = latest_checkpoint(self.out) if resume is True or resume == "latest" else Path(resume)
        if ckpt is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint in {self.out}")
        self.strategy.check_resume(ckpt)
        files = load_trainer_files(ckpt)
        check_resume_config(yaml.safe_load(files["config_yaml"]), self.cfg, ckpt)
        load_model_weights(self.model, ckpt, is_peft=self.cfg.use_peft)
        self.engine.weights_updated()
        self.optimizer.load_state_dict(files["optimizer"])
        self.scheduler.load_state_dict(files["scheduler"])
        self.reference.load(files["ref_model"])
        st = files["state"]
        self.data.sampler.load_state_dict(st["sampler"])
        self.data.call_sizes.load_state_dict(st.get("call_sizes"))
        self.step = self.resumed_from = st["global_step"]
        self.counters = dict(st.get("counters", {}))
        self.opt.gradients.load_state_dict(st.get("entropy_control"))
        self.health.load_state_dict(st.get("health"))
        set_rng_state(files["rng"])
        if dist.is_main():
            truncate_logs(self.out, self.step)
        self.logger.print(f"resumed from {ckpt} at step {self.step}")

    def _save_final(self) -> Path | None:
        from grpokit.models import save_final_model

        path = self.out / "final"
        model, sd = self.strategy.model_for_saving(self.model)
        if dist.is_main():
            with skipped_when_full(self.counters, "final_model_not_saved", "evaluating anyway"):
                save_final_model(
                    model, self.tokenizer, path, merge_lora=self.cfg.merge_lora, state_dict=sd
                )
                (path / "grpokit_config.yaml").write_text(
                    yaml.safe_dump(self.cfg.to_dict(), sort_keys=False)
                )
                if self.hub:
                    self.logger.print(f"uploaded to {self.hub.at_end(path)}")
        dist.barrier()
        return None if self.counters.get("final_model_not_saved") else path
