"""Positional encodings: RoPE rotates q/k inside attention; Sinusoidal is added to embeddings.

"Local RoPE" is :class:`RoPE` plus a sliding ``window`` on attention (the layer's ``window=``).
"""

from .rope import RoPE
from .sinusoidal import Sinusoidal

__all__ = ["RoPE", "Sinusoidal"]
