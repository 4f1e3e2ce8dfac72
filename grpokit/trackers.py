"""Optional experiment trackers, each imported only when ``report_to`` names it.

Each logs exactly the rows written to ``metrics.jsonl``.
"""

from __future__ import annotations

from typing import Any


class _TensorBoard:
    def __init__(self, cfg):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("report_to: tensorboard needs `pip install tensorboard`") from e
        self.w = SummaryWriter(log_dir=f"{cfg.output_dir}/tensorboard")

    def log(self, row: dict[str, Any], step: int) -> None:
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)):
                self.w.add_scalar(k, v, step)

    def close(self) -> None:
        self.w.close()


class _WandB:
    def __init__(self, cfg):
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "report_to: wandb needs `pip install wandb` (WANDB_MODE=offline works without a network)"
            ) from e
        self.wandb = wandb
        self.run = wandb.init(
            project="grpokit",
            dir=cfg.output_dir,
            config=cfg.to_dict(),
            name=cfg.output_dir.rstrip("/").split("/")[-1],
        )

    def log(self, row, step):
        self.run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=step)

    def close(self):
        self.run.finish()


class _MLflow:
    def __init__(self, cfg):
        try:
            import mlflow
        except ImportError as e:
            raise ImportError("report_to: mlflow needs `pip install mlflow`") from e
        self.mlflow = mlflow
        mlflow.start_run(run_name=cfg.output_dir.rstrip("/").split("/")[-1])
        mlflow.log_params({k: str(v)[:250] for k, v in cfg.to_dict().items()})

    def log(self, row, step):
        clean = {
            k.replace("/", "_"): v
            for k, v in row.items()
            if k != "step" and isinstance(v, (int, float))
        }
        self.mlflow.log_metrics(clean, step=step)

    def close(self):
        self.mlflow.end_run()


class _Trackio:
    def __init__(self, cfg):
        try:
            import trackio
        except ImportError as e:
            raise ImportError("report_to: trackio needs `pip install trackio`") from e
        self.trackio = trackio
        trackio.init(
            project="grpokit", name=cfg.output_dir.rstrip("/").split("/")[-1], config=cfg.to_dict()
        )

    def log(self, row, step):
        self.trackio.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=step)

    def close(self):
        self.trackio.finish()


_TRACKERS = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow, "trackio": _Trackio}


def make_trackers(names: list[str], cfg) -> list:
    return [_TRACKERS[n](cfg) for n in names]
