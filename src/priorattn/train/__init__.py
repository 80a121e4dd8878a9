"""Training: ``train(model_config, train_config, run_dir)``, checkpoints, optimizer, DDP."""

from .config import TrainConfig
from .loop import TrainResult, train
from .runs import TrainedRun, load_run

__all__ = ["TrainConfig", "TrainResult", "TrainedRun", "load_run", "train"]
