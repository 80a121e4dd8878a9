"""The prior layer: self-attention with injected parts and a KV cache.

- :mod:`~priorattn.layers.attention`: :class:`PriorMultiheadAttention` (a prior, RoPE, SSMax and
  FoX's forget gate as injected parts) and the ``"standard"`` and ``"fox"`` mechanisms a GPT builds
  from its config (registered in :mod:`priorattn.mechanisms` when imported);
- :mod:`~priorattn.layers.kv_cache`: :class:`KVCache`, the keys and values seen so far;
- :mod:`~priorattn.layers.forget_gate`: :class:`ForgetGate`, FoX's per-key decay.
"""

from .attention import PriorMultiheadAttention, config_rope, fox_attention, layer_rope, standard_attention
from .forget_gate import ForgetGate
from .kv_cache import KVCache

__all__ = [
    "ForgetGate",
    "KVCache",
    "PriorMultiheadAttention",
    "config_rope",
    "fox_attention",
    "layer_rope",
    "standard_attention",
]
