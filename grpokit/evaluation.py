"""Held-out evaluation: greedy (or sampled) completions graded by the task and the rewards."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from grpokit.prompts import prompt_text, render_prompts, tokenize_prompts
from grpokit.rollout.base import SamplingParams
from grpokit.scoring import reward_name, score_rollout
from grpokit.speed.fastdecode import keep_decoders

log = logging.getLogger("grpokit")


def held_out_rows(cfg, task):
    """The rows held-out evaluation runs on, or none: ``do_eval: false`` or
    ``max_eval_samples: 0`` load nothing; a dataset without the held-out split trains with
    evaluation skipped (one line says so) unless ``do_eval: true`` asked for it."""
    from grpokit.tasks.sources import SplitNotFound, TaskDataError

    if cfg.do_eval is False or cfg.max_eval_samples == 0:
        return []
    try:
        return task.build(cfg.dataset_test_split, limit=cfg.max_eval_samples)
    except SplitNotFound as e:
        if cfg.do_eval:
            raise TaskDataError(
                f"do_eval is true, but there is no held-out {cfg.dataset_test_split!r} split: {e}; "
                "or set do_eval: false to train without evaluation"
            ) from e
        log.warning(
            "no held-out %r split in %s, so evaluation is skipped (set task_params test_size "
            "to hold out a seeded slice, or dataset_test_split to the split that exists)",
            cfg.dataset_test_split,
            task.source,
        )
        return []


def evaluate(
    engine,
    task,
    rows: list[dict[str, Any]],
    reward_funcs: list,
    *,
    batch_size: int = 32,
    max_new_tokens: int = 256,
    max_prompt_length: int | None = None,
    num_samples: int = 1,
    temperature: float = 1.0,
    greedy: bool | None = None,
    keep_examples: int = 5,
    agent=None,
) -> dict[str, Any]:
    """Accuracy (pass@1; pass@k with ``num_samples`` = k sampled completions), format rate,
    mean reward per function, and completion length statistics over ``rows``. ``greedy``
    (None: when ``num_samples`` is 1): the most probable token each step, else samples at
    ``temperature``. With an ``agent`` (tools), multi-turn completions and
    ``tool_call_rate`` (the fraction of completions that called a tool) and ``tool_calls``
    (calls per completion)."""
    tok = engine.tokenizer
    greedy = num_samples == 1 if greedy is None else greedy
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy)
    correct, formatted, lengths, truncated = [], [], [], []
    per_func: dict[str, list[float]] = {reward_name(f): [] for f in reward_funcs}
    examples, calls = [], []
    bs = max(1, batch_size // num_samples)
    for s in range(0, len(rows), bs):
        chunk = rows[s : s + bs]
        if agent is not None:
            ro = agent.rollout(engine, chunk, num_samples, params)
            calls.extend(e.calls for e in ro.episodes)
        else:
            ids, mask = tokenize_prompts(
                tok, render_prompts(tok, [r["prompt"] for r in chunk]), max_prompt_length
            )
            ro = engine.generate(ids, mask, params, num_generations=num_samples)
        rows_rep = [r for r in chunk for _ in range(num_samples)]
        r = score_rollout(reward_funcs, chunk, ro, num_samples, on_error="skip")
        for j, f in enumerate(reward_funcs):
            per_func[reward_name(f)].extend(v for v in r[:, j].tolist() if not math.isnan(v))
        ok = [bool(task.is_correct(t, row)) for t, row in zip(ro.texts, rows_rep)]
        correct.extend(ok)
        formatted.extend(bool(task.is_formatted(t)) for t in ro.texts)
        lengths.extend(ro.generated_lengths.tolist())
        truncated.extend(ro.truncated.tolist())
        for i in range(0, len(ro.texts), num_samples):
            if len(examples) < keep_examples:
                examples.append(
                    {
                        "prompt": prompt_text(chunk[i // num_samples]["prompt"]),
                        "completion": ro.shown_texts[i],
                        "correct": ok[i],
                    }
                )
    out = _summary(correct, formatted, lengths, truncated, per_func, examples, num_samples)
    out["decoding"] = (
        "greedy" if greedy else f"{num_samples} sampled at temperature {temperature:g}"
    )
    if agent is not None:
        out["tool_call_rate"] = sum(n > 0 for n in calls) / max(len(calls), 1)
        out["tool_calls"] = sum(calls) / max(len(calls), 1)
    return out


def _summary(correct, formatted, lengths, truncated, per_func, examples, num_samples):
    n = len(correct) // num_samples
    by_prompt = torch.tensor(correct, dtype=torch.float32).view(n, num_samples)
    out: dict[str, Any] = {
        "num_prompts": n,
        "num_samples": num_samples,
        "accuracy": by_prompt[:, 0].mean().item(),
        "format_rate": sum(formatted) / len(formatted),
        "mean_length": sum(lengths) / len(lengths),
        "max_length": max(lengths),
        "truncated_ratio": sum(truncated) / len(truncated),
        "rewards": {k: (sum(v) / len(v) if v else None) for k, v in per_func.items()},
        "examples": examples,
    }
    if num_samples > 1:
        out["pass@1"] = by_prompt.mean().item()
        out[f"pass@{num_samples}"] = by_prompt.max(dim=1).values.mean().item()
    return out


def evaluate_rows(engine, task, rows, reward_funcs, cfg, agent=None) -> dict[str, Any]:
    """``evaluate`` with a run config's batch size and lengths, timed (``seconds``).
    Sampled (``num_generations_eval``), it draws from its own generator seeded with the run's
    seed: the same samples at every evaluation of the same weights, and the training's
    random stream untouched."""
    t0 = time.time()
    # the weights packed for decoding once for all prompt batches
    gpus = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with keep_decoders(), torch.random.fork_rng(devices=gpus):
        torch.manual_seed(cfg.seed)
        r = evaluate(
            engine,
            task,
            rows,
            reward_funcs,
            batch_size=cfg.per_device_eval_batch_size,
            max_new_tokens=cfg.eval_max_completion_length or cfg.max_completion_length,
            max_prompt_length=cfg.max_prompt_length,
            num_samples=cfg.num_generations_eval or 1,
            temperature=cfg.temperature,
            greedy=cfg.num_generations_eval is None,
            agent=agent,
        )
    r["seconds"] = time.time() - t0
    return r


def describe_eval(tag: str, r: dict[str, Any]) -> str:
    return (
        f"eval {tag}: accuracy {r['accuracy']:.3f}, format {r['format_rate']:.3f} "
        f"on {r['num_prompts']} held-out prompts ({r['seconds']:.0f}s)"
    )


def save_eval(result: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1))


def format_comparison(results: dict[str, dict[str, Any]], title: str | None = None) -> str:
    """Side-by-side table of evaluation results (e.g. {"before": ..., "after": ...}), under
    ``title`` and how the completions were decoded, when given."""
    if title is not None:
        how = next(iter(results.values())).get("decoding", "greedy")
        return f"{title} ({how}):\n" + format_comparison(results)
    names = list(results)
    keys = ["accuracy", "format_rate", "mean_length", "truncated_ratio", "tool_call_rate"]
    for r in results.values():
        for k in r:
            if k.startswith("pass@") and k not in keys:
                keys.append(k)
    reward_keys = sorted({k for r in results.values() for k in r.get("rewards", {})})
    w = max(22, *(len(f"reward/{k}") + 2 for k in reward_keys)) if reward_keys else 22
    cw = max(12, *(len(n) + 2 for n in names))
    lines = ["".ljust(w) + "".join(n.rjust(cw) for n in names)]
    for k in keys:
        vals = [results[n].get(k) for n in names]
        if all(v is None for v in vals):
            continue
        lines.append(k.ljust(w) + "".join(_cell(v, cw) for v in vals))
    for k in reward_keys:
        vals = [results[n].get("rewards", {}).get(k) for n in names]
        lines.append(f"reward/{k}".ljust(w) + "".join(_cell(v, cw) for v in vals))
    return "\n".join(lines)


def _cell(v, width: int = 12) -> str:
    if v is None:
        return "-".rjust(width)
    return f"{v:.4f}".rjust(width) if isinstance(v, float) else str(v).rjust(width)
