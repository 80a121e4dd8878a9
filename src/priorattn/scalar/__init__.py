"""Scalar sort attention (seed 002): scalar Gaussian-kernel and hybrid attention, sorted-cache decoding.

- :func:`scalar_attention`: the functional op, the dense definition (``backend="reference"``) and
  the scalar term folded into q/k lanes for every route of :func:`priorattn.attention`.
- :class:`ScalarMultiheadAttention`, :class:`MixedMultiheadAttention`: layers with a KV cache.
- :class:`Temperature`: the learnable bandwidth (global, per head, per token; optional cap).
- :class:`SortedScalarCache`: decoding that reads only the keys nearest each query's scalar;
  :class:`SortedDecoding` are the options of ``GPT.generate(decoding="sorted")`` through it.
- :mod:`.regularizers`: ``L_align``, ``L_spread``, ``L_tau`` and their schedule (:class:`Regularization`);
  :class:`Regularizer` makes them a model's auxiliary training losses.

Importing the package registers (:mod:`.model`, :mod:`priorattn.mechanisms`) the ``"scalar"``,
``"hybrid"`` and ``"mixed"`` attention of a GPT with their options (:class:`ScalarOptions`), the
regularizers and the ``"sorted"`` decoding.

See ``docs/scalar.md``.
"""

from .functional import scalar_attention
from .layers import MixedCache, MixedMultiheadAttention, ScalarMultiheadAttention
from .model import Regularizer
from .options import ScalarOptions
from .regularizers import Regularization, align_from_moments, align_values, spread_loss, tau_loss
from .sorted_cache import DecodeStep, DensityMerge, GeometricEviction, SortedScalarCache
from .sorted_decoding import SortedDecoding, SortedLayerCache
from .temperature import TAU_KINDS, Temperature

__all__ = [
    "TAU_KINDS",
    "DecodeStep",
    "DensityMerge",
    "GeometricEviction",
    "MixedCache",
    "MixedMultiheadAttention",
    "Regularization",
    "Regularizer",
    "ScalarMultiheadAttention",
    "ScalarOptions",
    "SortedDecoding",
    "SortedLayerCache",
    "SortedScalarCache",
    "Temperature",
    "align_from_moments",
    "align_values",
    "scalar_attention",
    "spread_loss",
    "tau_loss",
]
