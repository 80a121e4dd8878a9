"""The SDPA route: fold the prior into extra q/k lanes and call unmodified SDPA.

Seed 000 Eq. 20-24 / Algorithm 1: ``q' = [scale * q, q_lanes, 1]``, ``k' = [k, k_lanes, key terms]``
and SDPA runs with its own scale set to 1, so the log-prior enters unscaled and no ``Lq x Lk`` bias
is ever built. Queries run in chunks only where needed, each against only the keys its queries can
see (``spans.py``: one mask-free call per document of a packed row, bands of queries under a
sliding window); a boolean mask is handed to SDPA only where no mask-free kernel fits, a few
million cells at a time, and a key-linear slope is re-centred on each chunk's queries.

On the CPU a prior's calls run through the flash kernel's own forward and backward
(:class:`~.flash.FoldedCalls`): each pass builds ``q'`` and ``k'`` of all queries and keys once and
re-centres only the slope lane of ``k'`` in place before each call, so a slope re-centred on every run
of queries costs O(L) memory, not a ``k'`` per run (at L = 16384, 1.73x-1.87x plain SDPA's peak memory
before, 1.04x-1.07x after: docs/performance_log.md); heads whose slopes allow longer runs take fewer
calls (:func:`~.planning.head_plans`), in chunks of heads that keep every thread busy; a steep
slope's heads and a fast-forgetting key bias's leave out the keys they give no weight
(:func:`~.planning.weight_bands`); and the kernel calls run where float32 subnormals flush to zero
(``subnormals.py``), which made the route 2-7x plain SDPA's time under a slope.

Modules, each importing only those listed before it: :mod:`.fold` (``q'`` and ``k'`` of a call),
:mod:`.planning` (the calls of a batch group, per run of heads), :mod:`.flash` (the autograd
Functions over the CPU flash kernel), :mod:`.route` (:func:`sdpa_attention`), and :mod:`.decode`
(:func:`sdpa_bias_attention`, a decode step's bias tile; it needs none of the others).
"""

from .decode import is_decode_step, sdpa_bias_attention
from .fold import to_width
from .route import sdpa_attention

__all__ = ["is_decode_step", "sdpa_attention", "sdpa_bias_attention", "to_width"]
