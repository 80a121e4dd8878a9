"""Training: ``train(model_config, train_config, run_dir)``, checkpoints, optimizer, DDP; the configs
of a fresh, resumed or extended run from the fields given (``resolve_configs``)."""

from .config import TrainConfig
from .loop import TrainResult, train
from .resume import resolve_configs
from .runs import TrainedRun, load_run

__all__ = ["TrainConfig", "TrainResult", "TrainedRun", "load_run", "resolve_configs", "train"]
