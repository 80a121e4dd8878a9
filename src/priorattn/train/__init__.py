"""Training: ``train(model_config, train_config, run_dir)``, checkpoints, optimizer, DDP and FSDP;
the configs of a fresh, resumed or extended run from the fields given (``resolve_configs``); a run
copied with its checkpoint as one file (``export_run``)."""

from .config import TrainConfig
from .loop import TrainResult, train
from .resume import resolve_configs
from .runs import OtherSettings, TrainedRun, export_run, load_run

__all__ = [
    "OtherSettings",
    "TrainConfig",
    "TrainResult",
    "TrainedRun",
    "export_run",
    "load_run",
    "resolve_configs",
    "train",
]
