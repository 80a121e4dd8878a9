"""priorattn: attention priors for PyTorch.

Attention logits = content score + a learnable log-prior over positions:
``softmax_j(scale <q_i, k_j> + K_h(i, j))``. See ``priorattn.attention`` and ``priorattn.priors``.
"""

from . import priors
from .attention import attention
from .ssmax import SSMax

__all__ = ["SSMax", "attention", "priors"]
__version__ = "0.1.0"
