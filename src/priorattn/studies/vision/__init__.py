"""Vision: a ViT with 2D position mechanisms (GOAT, RoPE, ALiBi, learned), trained on Fashion-MNIST
and evaluated at higher resolutions (seed 000 Fig. 5)."""

from .data import load_split, parse_idx, read_idx
from .model import POSITIONS, ViT, ViTConfig
from .positions import CLS_POSITION, grid_positions, unpack_positions
from .priors import GOAT2D, ALiBi2D
from .rope import RoPE2D

__all__ = [
    "CLS_POSITION",
    "GOAT2D",
    "POSITIONS",
    "ALiBi2D",
    "RoPE2D",
    "ViT",
    "ViTConfig",
    "grid_positions",
    "load_split",
    "parse_idx",
    "read_idx",
    "unpack_positions",
]
