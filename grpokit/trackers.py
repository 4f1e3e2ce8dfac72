"""Optional experiment trackers, each imported only when ``report_to`` names it.

Every tracker receives exactly the rows written to ``metrics.jsonl`` (same names, same
steps; None values, which stand for non-finite numbers, are left out) and, with
``log_completions: true``, the completions table of each logging step.

The run is named ``run_name`` (TRL's key), or after the output_dir when it is not set:
the wandb and trackio run name, the mlflow run name, and for tensorboard a subdirectory
``<output_dir>/tensorboard/<run_name>`` (the run's name in TensorBoard's run list).

Where each one writes, when nothing else is configured:

- tensorboard: ``<output_dir>/tensorboard`` (event files; ``tensorboard --logdir``);
- wandb: online when credentials exist, else offline in ``<output_dir>/wandb``
  (``wandb sync`` uploads it later); ``WANDB_MODE`` / ``WANDB_PROJECT`` are honoured;
- mlflow: ``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<output_dir>/mlflow.db`` (artifacts
  such as the completion tables in ``<output_dir>/mlartifacts``);
- trackio: ``TRACKIO_DIR`` if set, else ``<output_dir>/trackio`` (local SQLite);
  ``trackio show`` opens the dashboard.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("grpokit")

COMPLETION_COLUMNS = ("prompt", "completion", "reward", "advantage")


def _run_name(cfg) -> str:
    return cfg.run_name or Path(cfg.output_dir).resolve().name


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: v
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Completion rows -> (columns, data): prompt, completion, reward, advantage, then one
    ``rewards/<name>`` column per reward function, in a stable order."""
    flat = []
    for r in rows:
        r = dict(r)
        for name, v in (r.pop("rewards", None) or {}).items():
            r[f"rewards/{name}"] = v
        flat.append(r)
    rows = flat
    extra = sorted({k for r in rows for k in r} - set(COMPLETION_COLUMNS))
    cols = [c for c in COMPLETION_COLUMNS if any(c in r for r in rows)] + extra
    return cols, [[r.get(c) for c in cols] for r in rows]


class _TensorBoard:
    def __init__(self, cfg):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("report_to: tensorboard needs `pip install tensorboard`") from e
        self.dir = Path(cfg.output_dir) / "tensorboard"
        if cfg.run_name:
            self.dir = self.dir / cfg.run_name
        self.w = SummaryWriter(log_dir=str(self.dir))

    def log(self, row: dict[str, Any], step: int) -> None:
        for k, v in _numbers(row).items():
            self.w.add_scalar(k, v, step)
        self.w.flush()

    def log_completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        cols, data = _table(rows)

        def cell(v):
            s = v if isinstance(v, str) else json.dumps(v)
            return s.replace("|", "\\|").replace("\n", "<br>")

        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in data]
        self.w.add_text("completions", "\n".join(lines), step)

    def close(self) -> None:
        self.w.close()


def _wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


class _WandB:
    def __init__(self, cfg):
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "report_to: wandb needs `pip install wandb` (it runs offline without a network)"
            ) from e
        self.wandb = wandb
        mode = os.environ.get("WANDB_MODE")
        if mode is None and not _wandb_has_credentials():
            mode = "offline"
            log.info("wandb: no credentials found, logging offline (upload later: wandb sync)")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "grpokit"),
            dir=str(Path(cfg.output_dir).resolve()),
            config=cfg.to_dict(),
            name=_run_name(cfg),
            mode=mode,
        )

    def log(self, row, step):
        self.run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=step)

    def log_completions(self, step, rows):
        cols, data = _table(rows)
        self.run.log({"completions_table": self.wandb.Table(columns=cols, data=data)}, step=step)

    def close(self):
        self.run.finish()


class _MLflow:
    def __init__(self, cfg):
        try:
            import mlflow
        except ImportError as e:
            raise ImportError("report_to: mlflow needs `pip install mlflow`") from e
        self.mlflow = mlflow
        out = Path(cfg.output_dir).resolve()
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # MLflow 3 refuses new file stores; a SQLite file in the run directory needs no
            # server and `mlflow ui --backend-store-uri sqlite:///<output_dir>/mlflow.db` reads it
            mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "grpokit")
        exp = mlflow.get_experiment_by_name(name)
        exp_id = (
            exp.experiment_id
            if exp is not None
            else mlflow.create_experiment(name, artifact_location=(out / "mlartifacts").as_uri())
        )
        self.run = mlflow.start_run(experiment_id=exp_id, run_name=_run_name(cfg))
        mlflow.log_params({k: str(v)[:250] for k, v in cfg.to_dict().items()})

    def log(self, row, step):
        self.mlflow.log_metrics(_numbers(row), step=step)

    def log_completions(self, step, rows):
        cols, data = _table(rows)
        self.mlflow.log_dict({"columns": cols, "data": data}, f"completions/step_{step:07d}.json")

    def close(self):
        self.mlflow.end_run()


class _Trackio:
    def __init__(self, cfg):
        os.environ.setdefault("TRACKIO_DIR", str(Path(cfg.output_dir).resolve() / "trackio"))
        utils = sys.modules.get("trackio.utils")  # trackio reads TRACKIO_DIR once, on import
        if utils is not None and str(utils.TRACKIO_DIR) != os.environ["TRACKIO_DIR"]:
            log.warning(
                "trackio was imported before grpokit set TRACKIO_DIR: it logs to %s",
                utils.TRACKIO_DIR,
            )
        try:
            import trackio
        except ImportError as e:
            raise ImportError("report_to: trackio needs `pip install trackio`") from e
        self.trackio = trackio
        self.run = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT", "grpokit"),
            name=_run_name(cfg),
            config=cfg.to_dict(),
            embed=False,
        )

    def log(self, row, step):
        self.trackio.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=step)

    def log_completions(self, step, rows):
        cols, data = _table(rows)
        self.trackio.log(
            {"completions_table": self.trackio.Table(columns=cols, data=data)}, step=step
        )

    def close(self):
        self.trackio.finish()


_TRACKERS = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow, "trackio": _Trackio}


def make_trackers(names: list[str], cfg) -> list:
    return [_TRACKERS[n](cfg) for n in names]
