"""Training: ``train(model_config, train_config, run_dir)``, checkpoints, optimizer, DDP."""

from .config import TrainConfig
from .loop import TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train"]
