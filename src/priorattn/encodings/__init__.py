"""Positional encodings: RoPE rotates q/k inside attention; Sinusoidal is added to embeddings.

"Local RoPE" is :class:`RoPE` plus a sliding ``window`` on attention (the layer's ``window=``). RoPE
reaches past its training length by position interpolation (``RoPE(interpolation=s)``),
:class:`NTKAwareRoPE` or :class:`YaRNRoPE`; :func:`scaled_rope` builds each by name.
"""

from .. import registry
from .rope import RoPE
from .rope_scaling import ROPE_SCALINGS, NTKAwareRoPE, YaRNRoPE, scaled_rope
from .sinusoidal import Sinusoidal

#: The values of ``GPTConfig.encoding`` (the ``"encoding"`` kind of :mod:`priorattn.registry`), each
#: with where it puts position.
ENCODINGS = {
    "none": "no encoding: position enters through the prior alone, or not at all (NoPE)",
    "rope": "RoPE rotates q and k inside attention (Su et al. 2021)",
    "sinusoidal": "sinusoids added to the token embeddings (Vaswani et al. 2017)",
    "local_rope": "RoPE with a sliding window of GPTConfig.window keys",
}
for _name, _doc in ENCODINGS.items():
    registry.register("encoding", _name, _doc)

__all__ = ["ENCODINGS", "ROPE_SCALINGS", "NTKAwareRoPE", "RoPE", "Sinusoidal", "YaRNRoPE", "scaled_rope"]
