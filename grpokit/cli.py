"""``grpokit train | eval | generate`` (also ``python -m grpokit``)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = REPO_ROOT / "recipes" / "default.yaml"


def _split_resume(rest: list[str]) -> tuple[list[str], str | bool | None]:
    """Pull ``--resume [PATH]`` out of the override list."""
    out, resume, i = [], None, 0
    while i < len(rest):
        a = rest[i]
        if a == "--resume":
            if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                resume, i = rest[i + 1], i + 2
            else:
                resume, i = True, i + 1
            continue
        if a.startswith("--resume="):
            resume = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    return out, resume


def _final_model_lost(output_dir: str) -> str:
    """The closing line of a run whose final model did not fit on the disk."""
    from grpokit.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(output_dir)
    then = (
        f"free space and run the same command with --resume: it continues from {ckpt}"
        if ckpt
        else "no checkpoint was saved either, so the trained weights are lost: free space "
        "and train again"
    )
    return (
        "error: the final model was not saved (no space left on device, see the warning "
        f"above); metrics and evaluations are in {output_dir}; {then}"
    )


def cmd_train(args: argparse.Namespace, rest: list[str]) -> int:
    from grpokit.config import load_config

    recipe = args.recipe
    if recipe is None:
        recipe = str(DEFAULT_RECIPE)
        print(f"[grpokit] no recipe given: running the default recipe {recipe}", flush=True)
    overrides, resume = _split_resume(rest)
    dry_run = "--dry-run" in overrides or "--dry_run" in overrides
    overrides = [o for o in overrides if o not in ("--dry-run", "--dry_run")]
    cfg = load_config(recipe, overrides)
    if dry_run:
        return _print_plan(cfg, argparse.Namespace(**_PLAN_DEFAULTS))
    from grpokit.checkpoint import prepare_output_dir

    try:
        said = prepare_output_dir(
            cfg.output_dir,
            resume=resume,
            overwrite=cfg.overwrite_output_dir,
            is_main=os.environ.get("RANK", "0") == "0",
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if said:
        print(f"[grpokit] {said}", flush=True)
    from grpokit.launch import failure_line
    from grpokit.trainer import GRPOTrainer

    try:
        trainer = GRPOTrainer(cfg, resume=resume)  # device and launch checks first
        result = trainer.train()
    except Exception as e:  # a dead or hung peer or server: one line, not a traceback
        line = failure_line(e, cfg.output_dir)
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        _exit_if_group_broken(3)
        return 3
    if result.get("health_stop"):  # health_checks: stop ended the run (docs/health.md)
        from grpokit.status import HEALTH_STOP_EXIT_CODE

        return HEALTH_STOP_EXIT_CODE
    if not result.get("stopped") and result.get("final_model") is None:  # the disk was full
        print(_final_model_lost(cfg.output_dir), file=sys.stderr)
        return 1
    return 130 if result.get("stopped") else 0


def _exit_if_group_broken(code: int) -> None:
    """After a peer failure the process group is broken: tearing it down at interpreter exit
    can abort the process in gloo (SIGABRT instead of ``code``, seen in 1 of ~10 runs).
    Flush what was said and leave at once with ``code``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_config(spec: str | None) -> dict:
    """The grpokit config saved with a trained model (final/grpokit_config.yaml, or a
    checkpoint's config.yaml, or a recipe given with --config), else {}."""
    import yaml

    if not spec:
        return {}
    p = Path(spec)
    for cand in (p, p / "grpokit_config.yaml", p / "config.yaml"):
        if cand.is_file() and cand.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(cand.read_text()) or {}
            if isinstance(data, dict) and "task" in data:
                return {**data, "_path": str(cand)}
    return {}


def cmd_eval(args: argparse.Namespace, rest: list[str]) -> int:
    from grpokit.config import ConfigError
    from grpokit.distributed import resolve_device
    from grpokit.evaluation import format_comparison, save_eval
    from grpokit.models import resolve_model
    from grpokit.rewards import get_reward_funcs

    models = _eval_models(args)
    for spec in models:  # a model that cannot load is named before any data loads
        resolve_model(spec)
    try:
        device = resolve_device(args.device)  # a GPU torch cannot see fails before loading
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    task = _eval_task(args)
    rows = task.build(args.split, limit=args.max_eval_samples)
    funcs = get_reward_funcs(list(task.default_reward_funcs))
    results = {}
    labels = [spec if len(models) == 1 else f"[{chr(65 + i)}]" for i, spec in enumerate(models)]
    for label, spec in zip(labels, models):
        if len(models) > 1:
            print(f"{label} = {spec}")
        try:
            results[label] = {
                "model": spec,
                **_evaluate_model(spec, task, rows, funcs, device, args),
            }
        except ConfigError as e:  # the run's tools cannot be set up here
            print(f"error: {e}", file=sys.stderr)
            return 2
    print(format_comparison(results))
    if args.output:
        save_eval(results if len(results) > 1 else results[labels[0]], args.output)
        print(f"saved {args.output}")
    return 0


def _eval_models(args: argparse.Namespace) -> list[str]:
    """The models to evaluate, in order: MODEL, then --compare's."""
    return ([args.model] if args.model else []) + list(args.compare or [])


def _eval_task(args: argparse.Namespace):
    """The task to evaluate on: --task with its options, else the task of the last given
    model's saved run config (or --config's), else gsm8k. Sets ``args.task`` to its name,
    ``args.run_cfg`` to the run config read ({} with --task) and the eval options not given
    to the run's (``_eval_settings``)."""
    from grpokit.config import build_config
    from grpokit.setup import build_task

    # --config, else the last model given that was trained by grpokit (has a run config)
    specs = [] if args.task else [args.config] if args.config else _eval_models(args)[::-1]
    run_cfg = next((c for c in map(_run_config, specs) if c), {})
    keep = ("task_params", "dataset_name", "dataset_config", "system_prompt",
            "dataset_prompt_column", "dataset_train_split")  # fmt: skip
    values = {k: run_cfg[k] for k in keep if run_cfg.get(k) is not None}
    values["task"] = args.task or run_cfg.get("task") or "gsm8k"
    values["seed"] = args.seed if args.seed is not None else run_cfg.get("seed", 42)
    if args.seed is None:  # the run's own held-out draw (data_seed, when it fixed one)
        values["data_seed"] = run_cfg.get("data_seed")
    _eval_settings(args, run_cfg)
    args.run_cfg = run_cfg  # its chat template and tools, for _evaluate_model
    if args.task_params:
        values["task_params"] = json.loads(args.task_params)
    if args.dataset_name:
        values["dataset_name"] = args.dataset_name
    if args.system_prompt is not None:
        values["system_prompt"] = args.system_prompt
    cfg = build_config(values, source="eval options")
    if run_cfg:
        print(
            f"[grpokit] task {cfg.task} {cfg.task_params} from the run's config ({run_cfg['_path']})"
            f"; its held-out draw (data seed {cfg.seed if cfg.data_seed is None else cfg.data_seed})"
            f", {args.max_eval_samples} problems, completions <= {args.max_completion_length} tokens"
        )
    args.task = cfg.task
    return build_task(cfg)


# eval's own defaults for what a trained model's run config otherwise sets (the run's
# evaluation: its lengths, prompt batch and number of held-out problems)
_EVAL_DEFAULTS = {"max_completion_length": 256, "batch_size": 32, "max_eval_samples": 200,
                  "max_prompt_length": None, "split": "test"}  # fmt: skip


def _eval_settings(args: argparse.Namespace, run_cfg: dict) -> None:
    """Fill the eval options the user did not give from the run's config, so that
    ``grpokit eval RUN/final`` repeats the run's own after-training evaluation; else eval's
    defaults."""
    from_run = {
        "max_completion_length": run_cfg.get("eval_max_completion_length")
        or run_cfg.get("max_completion_length"),
        "batch_size": run_cfg.get("per_device_eval_batch_size"),
        "max_eval_samples": run_cfg.get("max_eval_samples") or None,
        "max_prompt_length": run_cfg.get("max_prompt_length"),
        "split": run_cfg.get("dataset_test_split"),
    }
    for key, default in _EVAL_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, from_run[key] if from_run[key] is not None else default)


def _evaluate_model(spec: str, task, rows: list, funcs: list, device, args) -> dict:
    """Load the model ``spec`` onto ``device`` and evaluate it on ``rows`` of ``task``."""
    from grpokit.evaluation import evaluate
    from grpokit.rollout.hf import HFRolloutEngine

    run_cfg = getattr(args, "run_cfg", None) or {}
    model, tok, src, agent = _load_as_run(spec, run_cfg, args.torch_dtype)
    model.to(device)
    print(
        f"[grpokit] evaluating {src.source} on {len(rows)} {args.task}/{args.split} prompts"
        + (f", in the run's tool loop ({_tool_names(run_cfg)})" if agent else ""),
        flush=True,
    )
    return evaluate(
        HFRolloutEngine(model, tok),
        task,
        rows,
        funcs,
        batch_size=args.batch_size,
        max_new_tokens=args.max_completion_length,
        max_prompt_length=args.max_prompt_length,
        num_samples=args.num_samples,
        temperature=args.temperature,
        agent=agent,
    )


def _tool_names(run_cfg: dict) -> str:
    names = list(run_cfg.get("tools") or [])
    factory = run_cfg.get("environment_factory")
    return ", ".join(names + ([f"environment {factory}"] if factory else []))


# what a run's config says about how its model is asked: the chat template and its
# kwargs, and the tool loop (tools / environment_factory and their settings)
_RUN_PROMPTING = ("chat_template", "chat_template_kwargs", "tools", "environment_factory",
                  "max_tool_calling_iterations", "tool_timeout", "prompt_truncation",
                  "max_prompt_length")  # fmt: skip


def _load_as_run(spec: str, run_cfg: dict, dtype: str):
    """``(model, tokenizer, source, agent)`` for ``spec`` set up as its run set up the
    policy: the run's chat template and ``chat_template_kwargs``, and, when it trained with
    ``tools`` / ``environment_factory``, the run's tool loop (``setup.make_agent``; else
    None), so a model trained to call a calculator is asked with the calculator at hand.
    ConfigError (one line) when the run's tools cannot be set up here."""
    from grpokit import setup
    from grpokit.config import build_config
    from grpokit.models import load_model_and_tokenizer
    from grpokit.prompts import bind_chat_template_kwargs
    from grpokit.tools.template import named_chat_template

    values = {k: run_cfg[k] for k in _RUN_PROMPTING if k in run_cfg}
    cfg = build_config(values, source=f"the run's config ({run_cfg.get('_path')})")
    template = named_chat_template(cfg.chat_template)
    model, tok, src = load_model_and_tokenizer(spec, dtype=dtype, chat_template=template)
    bind_chat_template_kwargs(tok, cfg.chat_template_kwargs)
    agent = None
    if cfg.tools or cfg.environment_factory is not None:
        agent = setup.make_agent(cfg, tok, model, setup.build_environments(cfg), spec)
    return model, tok, src, agent


def _generate_prompt_head(args: argparse.Namespace) -> tuple[list[dict[str, str]], dict]:
    """The messages before each question: for a model grpokit trained (its run config),
    unless ``--task`` or ``--plain``, the run's system prompt and worked problems
    (``task_params.demonstrations``), so it is asked as it was trained; with ``--task``, that
    task's default system prompt; ``--system_prompt`` replaces the system prompt in each.
    Also the run config read ({} when none is used): its chat template and tools."""
    from grpokit.tasks import get_task
    from grpokit.tasks.base import check_demonstrations

    run_cfg = {} if args.task or args.plain else _run_config(args.model)
    task = args.task or run_cfg.get("task")
    system, demos = args.system_prompt, []
    if task:
        t = get_task(task)
        if system is None:
            system = run_cfg.get("system_prompt")
            system = t.default_system_prompt if system is None else system
        demos = (run_cfg.get("task_params") or {}).get("demonstrations") or []
        demos = check_demonstrations(demos, task)
    if run_cfg:
        print(
            f"[grpokit] asked as the run trained it ({run_cfg['_path']}): its system prompt"
            f" and {sum(m['role'] == 'user' for m in demos)} worked problem(s) before each"
            " question (--plain: without)",
            flush=True,
        )
    return ([{"role": "system", "content": system}] if system else []) + demos, run_cfg


def cmd_generate(args: argparse.Namespace, rest: list[str]) -> int:
    from grpokit.config import ConfigError
    from grpokit.distributed import resolve_device
    from grpokit.prompts import render_prompts, tokenize_prompts
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.hf import HFRolloutEngine

    prompts = list(args.prompts)
    if args.file:
        prompts += [ln.strip() for ln in Path(args.file).read_text().splitlines() if ln.strip()]
    if not prompts:
        print("give a prompt, or --file with one prompt per line", file=sys.stderr)
        return 2
    try:
        head, run_cfg = _generate_prompt_head(args)
        device = resolve_device(args.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        model, tok, src, agent = _load_as_run(args.model, run_cfg, args.torch_dtype)
    except ConfigError as e:  # the run's tools cannot be set up here
        print(f"error: {e}", file=sys.stderr)
        return 2
    model.to(device)
    msgs = [head + [{"role": "user", "content": p}] for p in prompts]
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        greedy=args.greedy,
    )
    engine = HFRolloutEngine(model, tok)
    if agent is not None:  # the run's tool loop: calls executed, results fed back
        ro = agent.rollout(engine, [{"prompt": m} for m in msgs], args.num_samples, params)
    else:
        ids, mask = tokenize_prompts(tok, render_prompts(tok, msgs), None)
        ro = engine.generate(ids, mask, params, num_generations=args.num_samples)
    for i, text in enumerate(ro.shown_texts):
        print(
            f"=== prompt {i // args.num_samples + 1}, sample {i % args.num_samples + 1}\n{text}\n"
        )
    return 0


_PLAN_DEFAULTS = dict(
    device_memory=None,
    zero_stage=0,
    num_processes=None,
    prompt_length=None,
    accelerate_config=None,
)


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device_memory", default=None, help="e.g. 80GB; warn when the peak exceeds it")
    p.add_argument("--zero_stage", type=int, default=0, choices=(0, 1, 2, 3))
    p.add_argument(
        "--accelerate_config",
        default=None,
        help="an accelerate launch config (recipes/accelerate/*.yaml): check it against the "
        "recipe as training will at start, and take processes and sharding from it",
    )
    p.add_argument("--num_processes", type=int, default=None, help="default: $WORLD_SIZE or 1")
    p.add_argument(
        "--prompt_length", type=int, default=None, help="prompt tokens (default max_prompt_length)"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def _planned_launch(cfg, opts: argparse.Namespace):
    """The launch ``grpokit plan`` is asked about, put through the refusals training makes
    at start (``setup.preflight``); None (after printing why) when training would refuse."""
    import torch

    from grpokit.config import ConfigError
    from grpokit.launch import launch_from_accelerate_config, launch_from_env
    from grpokit.setup import preflight
    from grpokit.tasks import TaskDataError

    where = None
    try:
        if getattr(opts, "accelerate_config", None):
            where = opts.accelerate_config
            launch, nproc = launch_from_accelerate_config(opts.accelerate_config)
            opts.num_processes = opts.num_processes or nproc
            if launch.engine == "fsdp" or launch.zero_stage == 3:
                opts.zero_stage = 3  # FSDP shards weights, gradients and optimizer like ZeRO-3
            elif launch.zero_stage:
                opts.zero_stage = launch.zero_stage
            device = torch.device("cuda", 0)  # a launch config's processes run on GPUs
        else:
            launch, device = launch_from_env(), torch.device("cpu")
        # deepspeed and vllm need installing where training runs, not necessarily here
        preflight(cfg, launch, opts.num_processes or cfg.world_size, device, check_packages=False)
    except (ConfigError, TaskDataError, FileNotFoundError, ValueError) as e:
        print(f"launch error ({where}): {e}" if where else f"config error: {e}", file=sys.stderr)
        return None
    return launch


def _print_plan(cfg, opts: argparse.Namespace) -> int:
    from grpokit.plan import PlanError, format_plan, make_plan

    launch = _planned_launch(cfg, opts)
    if launch is None:
        return 2
    try:
        plan = make_plan(
            cfg,
            num_processes=opts.num_processes,
            zero_stage=opts.zero_stage,
            device_memory=opts.device_memory,
            prompt_length=opts.prompt_length,
        )
    except (PlanError, ValueError) as e:
        print(f"plan error: {e}", file=sys.stderr)
        return 2
    layout = _plan_layout(cfg, plan)
    if layout is None:
        return 2
    if getattr(opts, "json", False):
        print(json.dumps({"config": cfg.to_dict(), "plan": plan.to_dict()}, indent=1))
    else:
        print(format_plan(plan, cfg))
        print("\n".join(layout))
        if getattr(opts, "accelerate_config", None):
            print(f"launch: {launch.describe()} over {opts.num_processes} processes (checked)")
            if launch.engine == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
                print("note: deepspeed is not installed here; training needs pip install deepspeed")
        if cfg.use_vllm and importlib.util.find_spec("vllm") is None:
            print("note: vllm is not installed here; use_vllm: true needs it where training runs")
    return 0


def _plan_layout(cfg, plan) -> list[str] | None:
    """The launch layout's lines (grpokit.plan.layout), or None after printing why training
    would refuse it."""
    from grpokit.config import ConfigError
    from grpokit.plan.layout import check_layout

    n = plan.batch.num_processes
    pushed = plan.memory["weights"] * (n if plan.zero_stage == 3 else 1)
    try:
        return check_layout(cfg, n, plan.memory["peak"], plan.device_memory, pushed)
    except ConfigError as e:
        print(f"config error (with {n} processes): {e}", file=sys.stderr)
        return None


def cmd_plan(args: argparse.Namespace, rest: list[str]) -> int:
    """Batch arithmetic and a per-device memory estimate; reads config.json, no weights."""
    from grpokit.config import load_config

    own = argparse.ArgumentParser(prog="grpokit plan", add_help=False)
    _add_plan_options(own)
    opts, overrides = own.parse_known_args(rest)
    cfg = load_config(args.recipe or str(DEFAULT_RECIPE), overrides)
    return _print_plan(cfg, opts)


def cmd_report(args: argparse.Namespace, rest: list[str]) -> int:
    from grpokit.report import write_report

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"no such run directory: {run_dir}", file=sys.stderr)
        return 2
    out = write_report(run_dir, args.output)
    print(f"report: {out}\nplots: {out.parent / 'plots'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpokit", description="GRPO fine-tuning on verifiable tasks")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser(
        "train",
        help="train with a recipe; --key value overrides any config key",
        description="grpokit train [RECIPE.yaml] [--resume [CKPT]] [--dry-run] [--key value ...]",
    )
    t.add_argument("recipe", nargs="?", default=None)
    _add_eval_parser(sub)
    _add_generate_parser(sub)
    pl = sub.add_parser(
        "plan",
        help="batch arithmetic + memory estimate per device, without loading weights",
        description="grpokit plan [RECIPE.yaml] [--device_memory 80GB] [--zero_stage 0|2|3] "
        "[--num_processes N] [--json] [--key value ...]",
    )
    pl.add_argument("recipe", nargs="?", default=None)
    _add_plan_options(pl)
    r = sub.add_parser("report", help="plots + a self-contained HTML report of a run directory")
    r.add_argument("run_dir")
    r.add_argument(
        "--output", default=None, help="HTML path (default RUN_DIR/report.html); plots/ beside it"
    )
    _add_rollout_server_parser(sub)
    return p


_DEVICE_HELP = "auto (a GPU when torch sees one), cpu, cuda, cuda:N"


def _add_eval_parser(sub) -> None:
    e = sub.add_parser("eval", help="evaluate a model on a task's held-out split")
    e.add_argument("model", nargs="?", default=None)
    e.add_argument("--compare", nargs="+", metavar="MODEL")
    e.add_argument(
        "--task",
        default=None,
        help="default: the task the model was trained on (its grpokit_config.yaml), else gsm8k",
    )
    e.add_argument(
        "--config", default=None, help="take task, task_params, system prompt from this recipe"
    )
    e.add_argument("--task_params", default=None, help="JSON, e.g. '{\"digits\": 2}'")
    e.add_argument("--dataset_name", default=None)
    e.add_argument("--system_prompt", default=None)
    e.add_argument("--split", default=None, help="default: the run's dataset_test_split, else test")
    e.add_argument(
        "--max_eval_samples", type=int, default=None, help="default: the run's, else 200"
    )
    e.add_argument("--num_samples", type=int, default=1, help="k for pass@k (sampled)")
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument(
        "--max_completion_length", type=int, default=None, help="default: the run's, else 256"
    )
    e.add_argument(
        "--batch_size", type=int, default=None, help="default: the run's eval batch, else 32"
    )
    e.add_argument("--torch_dtype", default="float32")
    e.add_argument("--device", default="auto", help=_DEVICE_HELP)
    e.add_argument("--seed", type=int, default=None)
    e.add_argument("--output", default=None, help="write results as JSON")


def _add_generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="sample from a model with the training chat template")
    g.add_argument("model")
    g.add_argument("prompts", nargs="*")
    g.add_argument("--file")
    g.add_argument(
        "--task",
        default=None,
        help="use this task's default system prompt (default: a grpokit-trained model is asked "
        "as its run trained it: the run's system prompt and worked problems)",
    )
    g.add_argument(
        "--plain",
        action="store_true",
        help="only --system_prompt (if given) and the question: not the run's prompt",
    )
    g.add_argument("--system_prompt", default=None)
    g.add_argument("--max_new_tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top_p", type=float, default=1.0)
    g.add_argument("--greedy", action="store_true")
    g.add_argument("--num_samples", type=int, default=1)
    g.add_argument("--torch_dtype", default="float32")
    g.add_argument("--device", default="auto", help=_DEVICE_HELP)


def _add_rollout_server_parser(sub) -> None:
    rs = sub.add_parser(
        "rollout-server",
        help="serve a model with vLLM for training with use_vllm: true, vllm_mode: server",
    )
    rs.add_argument("--model", required=True, help="the training model (a local directory)")
    rs.add_argument("--host", default="127.0.0.1")
    rs.add_argument("--port", type=int, default=8000)
    rs.add_argument("--dtype", default="float32", help="float32 or bfloat16 (the trainer's)")
    rs.add_argument("--max_model_len", type=int, default=None)
    rs.add_argument("--gpu_memory_utilization", type=float, default=0.9)
    rs.add_argument(
        "--compile", action="store_true", help="let vLLM compile (slower start-up, ~1-2 min)"
    )
    rs.add_argument("--seed", type=int, default=0)


def cmd_rollout_server(args: argparse.Namespace, rest: list[str]) -> int:
    from grpokit.models import resolve_model
    from grpokit.rollout.server import serve
    from grpokit.rollout.vllm_engine import require_vllm

    require_vllm()
    serve(
        resolve_model(args.model).path,
        args.host,
        args.port,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=not args.compile,
        seed=args.seed,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["train"]
    logging.basicConfig(level=logging.INFO, format="[grpokit] %(message)s")
    warnings.filterwarnings("default", module="grpokit")
    try:
        return _dispatch(build_parser(), argv)
    except Exception as e:
        label = _input_error_label(e)
        if label is None:
            raise
        print(f"{label}: {e}", file=sys.stderr)
        return 2


def _dispatch(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    if argv[0] in ("train", "plan"):  # free-form --key value overrides: parsed by hand
        if any(a in ("-h", "--help") for a in argv[1:]):
            parser.parse_args([argv[0], "--help"])
        argv = _config_flag_as_recipe(argv)
        has_recipe = len(argv) > 1 and not argv[1].startswith("--")
        args = argparse.Namespace(cmd=argv[0], recipe=argv[1] if has_recipe else None)
        cmd = cmd_train if argv[0] == "train" else cmd_plan
        return cmd(args, argv[2:] if has_recipe else argv[1:])
    args, rest = parser.parse_known_args(argv)
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    if args.cmd == "eval":
        if not args.model and not args.compare:
            parser.error("eval needs MODEL or --compare A B")
        return cmd_eval(args, rest)
    if args.cmd == "report":
        return cmd_report(args, rest)
    if args.cmd == "rollout-server":
        return cmd_rollout_server(args, rest)
    return cmd_generate(args, rest)


def _config_flag_as_recipe(argv: list[str]) -> list[str]:
    """``train --config R.yaml ...`` (TRL / open-r1's spelling) = ``train R.yaml ...``."""
    from grpokit.config import ConfigError

    rest = argv[1:]
    for i, a in enumerate(rest):
        if a == "--config" or a.startswith("--config="):
            path = a.split("=", 1)[1] if "=" in a else (rest[i + 1] if i + 1 < len(rest) else "")
            if not path or path.startswith("--"):
                raise ConfigError("--config needs a recipe path: grpokit train --config R.yaml")
            if not rest[0].startswith("--"):
                raise ConfigError(f"two recipes: {rest[0]} and --config {path}; give one")
            drop = 1 if "=" in a else 2
            return [argv[0], path, *rest[:i], *rest[i + drop :]]
    return argv


def _input_error_label(e: Exception) -> str | None:
    """The one-line label of an error whose message names a problem in the user's input and
    its fix (a config key, a model path, a dataset): the traceback would add nothing. None
    for any other error, whose traceback is wanted."""
    from grpokit.config import ConfigError

    if isinstance(e, ConfigError):
        return "config error"
    # an error of these classes means their module is loaded: look it up, import nothing
    models, tasks = sys.modules.get("grpokit.models"), sys.modules.get("grpokit.tasks")
    if models is not None and isinstance(e, models.ModelSourceError):
        return "model error"
    if tasks is not None and isinstance(e, tasks.TaskDataError):
        return "data error"
    hub = sys.modules.get("grpokit.hub")
    if hub is not None and isinstance(e, hub.HubError):
        return "hub error"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
