"""priorattn: attention priors for PyTorch.

Attention logits = content score + a learnable log-prior over positions:
``softmax_j(scale <q_i, k_j> + K_h(i, j))``. See ``priorattn.attention`` and ``priorattn.priors``.

Docstrings cite the source papers by number: seed 000 is GOAT (Litman and Guo, *You Need Better
Attention Priors*), seed 002 *Scalar Sort Attention* (a gist by antimatter15), seed 003 BAM
(Bianchessi, Aguirre, Barros and Kupssinskü, *Bayesian Attention Mechanism: A Probabilistic Framework
for Positional Encoding and Context Length Extrapolation*), seed 004 Litman, *Scaled-Dot-Product
Attention as One-Sided Entropic Optimal Transport*.
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
