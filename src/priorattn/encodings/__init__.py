"""Positional encodings: RoPE rotates q/k inside attention; Sinusoidal is added to embeddings.

"Local RoPE" is :class:`RoPE` plus a sliding ``window`` on attention (the layer's ``window=``). RoPE
reaches past its training length by position interpolation (``RoPE(interpolation=s)``),
:class:`NTKAwareRoPE` or :class:`YaRNRoPE`; :func:`scaled_rope` builds each by name.
"""

from .rope import RoPE
from .rope_scaling import ROPE_SCALINGS, NTKAwareRoPE, YaRNRoPE, scaled_rope
from .sinusoidal import Sinusoidal

__all__ = ["ROPE_SCALINGS", "NTKAwareRoPE", "RoPE", "Sinusoidal", "YaRNRoPE", "scaled_rope"]
