"""Models built from prior attention layers: a GPT-style language model and its presets."""

from .gpt import GPT, GPTConfig, build_prior
from .presets import PRESETS, preset

__all__ = ["GPT", "GPTConfig", "PRESETS", "build_prior", "preset"]
