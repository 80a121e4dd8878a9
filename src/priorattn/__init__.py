"""priorattn: attention priors for PyTorch.

Attention logits = content score + a learnable log-prior over positions:
``softmax_j(scale <q_i, k_j> + K_h(i, j))``. See ``priorattn.attention`` and ``priorattn.priors``.
"""

from importlib import metadata

from . import encodings, eot, models, priors, scalar  # scalar registers its attention mechanisms
from .checks import set_value_checks
from .functional import attention
from .layers import KVCache, PriorMultiheadAttention
from .ssmax import SSMax

__all__ = [
    "KVCache",
    "PriorMultiheadAttention",
    "SSMax",
    "attention",
    "encodings",
    "eot",
    "models",
    "priors",
    "scalar",
    "set_value_checks",
]

try:
    __version__ = metadata.version("priorattn")  # pyproject.toml's, as installed: one place to bump
except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
