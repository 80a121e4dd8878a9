"""2D priors over the patch grid of a ViT: GOAT with seed 000's 2D factorization, and 2D ALiBi.

Positions are packed (row, column) pairs with a class token (:mod:`.positions`). The class token has
no place on the grid, so it takes no relative term: it is reached through a learned per-head bias.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...priors import GOAT, FoldLanes, PerHeadSink, Prior, alibi_slopes
from ...priors.base import concat_lanes
from ...priors.math import per_head
from .positions import GridPositions, unpack_positions


def patch_pairs(q: GridPositions, k: GridPositions) -> Tensor:
    """``(..., 1, Lq, Lk)`` bool: True where query and key are both patches."""
    return (~q.is_cls[..., :, None] & ~k.is_cls[..., None, :]).unsqueeze(-3)


class GOAT2D(Prior):
    """GOAT on the patch grid (seed 000 Sec. 6 "Learning Priors on Image Data", App. H "2D
    factorization"): for patches ``i = (y_i, x_i)`` and ``j = (y_j, x_j)``

    ``K_h(i, j) = sum_r [a_hr cos(w_r dy) + b_hr sin(w_r dy)] + sum_r [c_hr cos(w_r dx) + d_hr sin(w_r dx)]
    + u_h(j)``

    with ``dy = y_i - y_j`` and ``dx = x_i - x_j``: Eq. 12 once over row displacement and once over
    column displacement (``rows`` and ``cols``, each a 1D :class:`~priorattn.priors.GOAT` without
    sink or slope), plus a key sink over 2D position factored the same way, ``u_h(y, x) =
    u_row_h(y) + u_col_h(x)`` (Eq. 19, two :class:`~priorattn.priors.PerHeadSink` over the grid side).

    The class token: as a key it gets the per-head ``cls_bias`` from every query; as a query it
    gets the patch keys' sink only (no displacement to a token off the grid).

    Folding (Eq. 17-21, not causal): the row and column lanes concatenate, ``4 num_freqs`` lanes,
    zeroed at the class token; the key-only terms (sink, ``cls_bias``) are one key-bias lane. The
    fold is exact: no per-query constant is dropped. A new prior is ``K = 0`` (standard attention).
    """

    def __init__(
        self,
        num_heads: int,
        num_freqs: int = 3,
        *,
        sink: bool = True,
        freq_base: float = 16.0,
        grid_size: int = 4,
        sink_freqs: int = 2,
        sink_hidden: int = 16,
    ):
        super().__init__()
        if not isinstance(num_freqs, int) or num_freqs < 1:
            raise ValueError(f"num_freqs must be an int >= 1, got {num_freqs!r}")
        if not isinstance(grid_size, int) or grid_size < 1:
            raise ValueError(f"grid_size must be a positive int, got {grid_size!r}")
        axis = dict(sink=False, slope=False, freq_base=freq_base)
        self.rows = GOAT(num_heads, num_freqs, **axis)
        self.cols = GOAT(num_heads, num_freqs, **axis)
        self.num_heads = num_heads
        # Each sink axis normalises positions by the training grid's side (PerHeadSink's train_len).
        sinks = dict(num_freqs=sink_freqs, hidden=sink_hidden, train_len=grid_size, freq_base=freq_base)
        self.row_sink = PerHeadSink(num_heads, **sinks) if sink else None
        self.col_sink = PerHeadSink(num_heads, **sinks) if sink else None
        self.cls_bias = nn.Parameter(torch.zeros(num_heads, dtype=torch.get_default_dtype()))

    def key_bias(self, k: GridPositions) -> Tensor:
        """The key-only terms ``(..., H, Lk)``: ``cls_bias`` at the class token, the sink elsewhere."""
        cls_bias = self.cls_bias[:, None].expand(*k.row.shape[:-1], -1, k.row.shape[-1])
        if self.row_sink is None:
            return torch.where(k.is_cls[..., None, :], cls_bias, 0.0)
        sink = self.row_sink(k.row) + self.col_sink(k.col)
        return torch.where(k.is_cls[..., None, :], cls_bias, sink)

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        q, k = unpack_positions(q_pos), unpack_positions(k_pos)
        relative = self.rows.log_prior(q.row, k.row) + self.cols.log_prior(q.col, k.col)
        relative = torch.where(patch_pairs(q, k), relative, 0.0)  # (..., H, Lq, Lk)
        return relative + self.key_bias(k)[..., None, :]

    def can_fold(self, causal: bool) -> bool:
        return not causal  # the grid has no order for a causal mask to follow

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        q, k = unpack_positions(q_pos), unpack_positions(k_pos)
        lanes = concat_lanes([self.rows.fold(q.row, k.row), self.cols.fold(q.col, k.col)])
        on_grid_q = (~q.is_cls)[..., None, :, None].to(lanes.q.dtype)  # zero lanes: no relative term
        on_grid_k = (~k.is_cls)[..., None, :, None].to(lanes.k.dtype)
        return FoldLanes(lanes.q * on_grid_q, lanes.k * on_grid_k, self.key_bias(k))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_freqs={self.rows.alpha.shape[1]} per axis, "
            f"sink={self.row_sink is not None}"
        )


class ALiBi2D(Prior):
    """``K_h(i, j) = -m_h sqrt(dy^2 + dx^2)`` between patches, 0 to and from the class token.

    The 2D ALiBi of Fuller et al. (CROMA, 2023): ALiBi's fixed head slopes ``m_h`` times the
    Euclidean distance on the patch grid. A distance has no bilinear form, so it never folds: the
    routes evaluate it on tiles.
    """

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.register_buffer("slopes", alibi_slopes(num_heads).to(torch.get_default_dtype()))

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        q, k = unpack_positions(q_pos), unpack_positions(k_pos)
        dtype = self.slopes.dtype
        dy = (q.row[..., :, None] - k.row[..., None, :]).to(dtype).unsqueeze(-3)
        dx = (q.col[..., :, None] - k.col[..., None, :]).to(dtype).unsqueeze(-3)
        distance = torch.where(patch_pairs(q, k), torch.hypot(dy, dx), 0.0)
        return -per_head(self.slopes) * distance

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
