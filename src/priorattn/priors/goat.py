"""GOAT's learnable spectral prior with a key-only sink (seed 000 Section 4, Algorithm 1)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import check_int
from .base import FoldLanes, PositionTable, Prior, alibi_slopes, in_own_dtype
from .registry import FromModel, register


def geometric_freqs(num_freqs: int, base: float) -> Tensor:
    """``w_r = base^(-r / (R - 1))``, r = 0..R-1: from one radian per token down to ``1 / base``."""
    return base ** (-torch.arange(num_freqs, dtype=torch.float64) / max(num_freqs - 1, 1))


def phases(pos: Tensor, freqs: Tensor) -> tuple[Tensor, Tensor]:
    """``cos(w_r * pos)`` and ``sin(w_r * pos)``, ``(..., L, R)``, in ``freqs.dtype``.

    The angle is formed in float64: at position 10^5 a float32 angle is off by ~0.01 rad.
    """
    angle = pos.to(torch.float64)[..., None] * freqs.to(torch.float64)
    return angle.cos().to(freqs.dtype), angle.sin().to(freqs.dtype)


class GOATSink(nn.Module):
    """The key-only log-prior ``u_h(j)`` (seed 000 Eq. 19): a sink and absolute default per key.

    ``u_h(j) = -decay_h * j / train_len + MLP_h([cos(v_m j), sin(v_m j), j / train_len,
    sign(j) log(1 + |j|) / log(1 + train_len)])``: a learnable linear decay plus a small MLP over
    sinusoidal and length-normalised inputs (the seed names the kinds of input, not the formulas), so
    it is defined at every length, including unseen ones. ``train_len`` only scales the two
    length-normalised inputs (and sets the fitting range of ``GOAT(init="recency")``).

    Negative key positions (e.g. keys counted back from a query at 0): the sinusoids and ``j /
    train_len`` are defined there already; the log input is continued as an odd function, so ``u`` is
    finite at every integer position and unchanged at ``j >= 0``.
    The MLP's output layer starts at zero, so a new sink is ``u = 0`` (standard attention).

    ``u`` depends on the key's position alone: a decode step reads it from a :class:`PositionTable`.
    """

    def __init__(
        self,
        num_heads: int,
        num_freqs: int = 8,
        hidden: int = 16,
        train_len: int = 2048,
        freq_base: float = 10_000.0,
    ):
        super().__init__()
        if train_len < 1:
            raise ValueError(f"train_len must be >= 1, got {train_len}")
        dtype = torch.get_default_dtype()
        self.num_heads = num_heads
        self.train_len = train_len
        self.register_buffer("freqs", geometric_freqs(num_freqs, freq_base).to(dtype))
        self.decay = nn.Parameter(torch.zeros(num_heads, dtype=dtype))
        self.mlp = nn.Sequential(
            nn.Linear(2 * num_freqs + 2, hidden), nn.SiLU(), nn.Linear(hidden, num_heads)
        )
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)
        self.by_position = PositionTable(self, self.evaluate)

    def features(self, k_pos: Tensor) -> Tensor:
        """The MLP's inputs ``(..., Lk, 2 * sink_freqs + 2)`` for integer key positions ``(..., Lk)``."""
        dtype = self.freqs.dtype
        cos, sin = phases(k_pos, self.freqs)
        position = k_pos.to(dtype)[..., None]
        # odd continuation of log(1 + j): log1p alone is NaN below j = -1
        log_position = position.sign() * torch.log1p(position.abs())
        return torch.cat(
            [cos, sin, position / self.train_len, log_position / math.log1p(self.train_len)], dim=-1
        )

    def forward(self, k_pos: Tensor) -> Tensor:
        """``u_h(j)`` as ``(..., H, Lk)`` for integer key positions ``(..., Lk)``."""
        return self.by_position(k_pos).movedim(0, -2)

    def evaluate(self, k_pos: Tensor) -> Tensor:
        """``u_h(j)`` computed afresh, ``(..., H, Lk)``, in the parameters' dtype (:func:`in_own_dtype`)."""
        position = k_pos.to(self.freqs.dtype)[..., None]
        with in_own_dtype(self.freqs.device):
            u = self.mlp(self.features(k_pos)) - self.decay * position / self.train_len  # (..., Lk, H)
        return u.transpose(-1, -2)


class GOAT(Prior):
    """``K_h(i, j) = sum_r alpha[h,r] cos(w_r (i-j)) + beta[h,r] sin(w_r (i-j)) + u_h(j) - m_h |i-j|``.

    - Relative part (seed 000 Eq. 12): ``num_freqs`` fixed geometric frequencies in buffer ``freqs``
      (a parameter with ``learnable_freqs=True``, the paper's open question 2).
    - ``sink=True``: the key-only ``u_h(j)`` of :class:`GOATSink` (Eq. 19).
    - ``slope=True``: the ALiBi-equivalent recency term (App. F.3); it folds only under a causal
      mask, where it is the key-linear lane ``m_h j`` (Prop. F.6).
      ``m_h`` is the parameter ``slope`` clamped to ``[-max_slope, max_slope]`` (default 1: a
      recency weight of at most ``e^-1`` per token of lag), so its size is known without reading it:
      the SDPA route sizes its re-centred runs of queries by ``max_slope`` where reading the slope
      would stall an accelerator or break a compiled graph (``functional/prior_inputs.py``).

    ``num_freqs=0`` keeps only the sink and the slope (no relative spectral part).

    Folded into a head (:class:`~priorattn.PriorMultiheadAttention`), GOAT takes ``fold_width`` of
    its query/key lanes from the content: ``2 num_freqs`` + 1 for the sink + 1 for the slope.

    ``init="uniform"`` starts at ``K = 0``: standard attention, exactly. ``init="recency"`` starts
    at ALiBi: the slope takes the ALiBi slopes, or, with ``slope=False``, the spectral weights are
    fitted by least squares to ``-m_h d`` over lags ``d`` in ``[0, train_len)`` (so it matches
    ALiBi under a causal mask; future keys are not fitted).

    Folding (Eq. 17-21): ``q`` lanes ``[alpha cos(w i) + beta sin(w i), alpha sin(w i) - beta cos(w i)]``,
    ``k`` lanes ``[cos(w j), sin(w j)]`` (2R lanes shared by every head), then one sink lane
    ``1 . u_h(j)`` and one slope lane ``m_h . (j - centre)``.
    """

    def __init__(
        self,
        num_heads: int,
        num_freqs: int = 8,
        *,
        sink: bool = True,
        slope: bool = True,
        init: str = "uniform",
        learnable_freqs: bool = False,
        freq_base: float = 10_000.0,
        train_len: int = 2048,
        sink_freqs: int = 8,
        sink_hidden: int = 16,
        max_slope: float = 1.0,
    ):
        super().__init__()
        if not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if not isinstance(num_freqs, int) or num_freqs < 0:
            raise ValueError(f"num_freqs must be an int >= 0, got {num_freqs!r}")
        if num_freqs == 0 and not (sink or slope):
            raise ValueError(
                "GOAT with num_freqs=0, sink=False and slope=False has no term left: it is standard "
                "attention (use Uniform() or prior=None), or give num_freqs >= 1"
            )
        for name, value, low in (
            ("train_len", train_len, 1),
            ("sink_freqs", sink_freqs, 0),
            ("sink_hidden", sink_hidden, 1),
        ):
            check_int(name, value, low=low)
        for name, value in (("sink", sink), ("slope", slope), ("learnable_freqs", learnable_freqs)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if isinstance(freq_base, bool) or not (
            isinstance(freq_base, int | float) and 1 < freq_base < math.inf
        ):
            raise ValueError(f"freq_base must be a finite number > 1, got {freq_base!r}")
        if not (isinstance(max_slope, int | float) and 0 < max_slope < math.inf):
            raise ValueError(f"max_slope must be a positive finite number, got {max_slope!r}")
        if init not in ("uniform", "recency"):
            raise ValueError(f"init must be 'uniform' or 'recency', got {init!r}")
        dtype = torch.get_default_dtype()
        self.num_heads = num_heads
        freqs = geometric_freqs(num_freqs, freq_base).to(dtype)
        if learnable_freqs:
            self.freqs = nn.Parameter(freqs)
        else:
            self.register_buffer("freqs", freqs)
        self.alpha = nn.Parameter(torch.zeros(num_heads, num_freqs, dtype=dtype))
        self.beta = nn.Parameter(torch.zeros(num_heads, num_freqs, dtype=dtype))
        self.sink = GOATSink(num_heads, sink_freqs, sink_hidden, train_len, freq_base) if sink else None
        self.slope = nn.Parameter(torch.zeros(num_heads, dtype=dtype)) if slope else None
        self.max_slope = float(max_slope)
        self.by_lag = PositionTable(self, self.relative)
        if init == "recency":
            self._init_recency(train_len)

    @torch.no_grad()
    def _init_recency(self, fit_len: int) -> None:
        slopes = alibi_slopes(self.num_heads)
        if self.slope is not None:
            self.slope.copy_(slopes)
            return
        lag = torch.arange(fit_len, dtype=torch.float64)
        cos, sin = phases(lag, self.freqs.double())
        design = torch.cat([cos, sin, torch.ones(fit_len, 1, dtype=torch.float64)], dim=-1)
        target = -slopes[None, :] * lag[:, None]  # (fit_len, H); the constant column absorbs rows
        # SVD-based solve with a cut-off: low frequencies are nearly collinear, and a truncated
        # basis keeps the weights small enough to store in float32 without losing the fit.
        weights = torch.linalg.lstsq(design, target, rcond=1e-9, driver="gelsd").solution  # (2R+1, H)
        R = self.freqs.numel()
        self.alpha.copy_(weights[:R].T)
        self.beta.copy_(weights[R : 2 * R].T)

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        lag = q_pos[..., :, None] - k_pos[..., None, :]  # (..., Lq, Lk)
        K = self.by_lag(lag).movedim(0, -3)  # (..., H, Lq, Lk)
        if self.sink is not None:
            K = K + self.sink(k_pos)[..., :, None, :]
        return K

    def log_prior_of_runs(
        self, q_start: int, Lq: int, k_start: int, Lk: int, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        if self.sink is None:
            return self.by_lag.toeplitz(q_start, Lq, k_start, Lk, device, dtype)
        K = self.by_lag.toeplitz(q_start, Lq, k_start, Lk, device)  # (H, Lq, Lk)
        return (K + self.sink.by_position.run(k_start, Lk, 1, device)[:, None, :]).to(dtype)

    def relative(self, lag: Tensor) -> Tensor:
        """Terms of lag ``d = i - j``, ``(H, n)``: ``sum_r alpha cos(w_r d) + beta sin(w_r d) - m |d|``."""
        cos, sin = phases(lag, self.freqs)  # (n, R)
        with in_own_dtype(self.freqs.device):
            K = self.alpha @ cos.T + self.beta @ sin.T  # (H, n)
        if self.slope is not None:
            K = K - self.fold_slope()[:, None] * lag.to(self.alpha.dtype).abs()
        return K

    @property
    def is_relative(self) -> bool:
        return self.sink is None

    def can_fold(self, causal: bool) -> bool:
        return causal or self.slope is None

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        # seed 000 Eq. 17-18: spectral rotation of q, Fourier features of k.
        cos_q, sin_q = (t[..., None, :, :] for t in phases(q_pos, self.freqs))  # (..., 1, Lq, R)
        cos_k, sin_k = phases(k_pos, self.freqs)
        alpha, beta = self.alpha[:, None, :], self.beta[:, None, :]  # (H, 1, R)
        key_bias = None if self.sink is None else self.sink(k_pos)  # Eq. 19: <1, u_h(j)>
        return FoldLanes(
            torch.cat([alpha * cos_q + beta * sin_q, alpha * sin_q - beta * cos_q], dim=-1),
            torch.cat([cos_k, sin_k], dim=-1)[..., None, :, :],
            key_bias,
            self.fold_slope(),  # Prop. F.6: -m (i - j) = m j + row constant
        )

    def fold_slope(self) -> Tensor | None:
        """``m_h``: the parameter ``slope`` clamped to ``[-max_slope, max_slope]``; None without it."""
        return None if self.slope is None else self.slope.clamp(-self.max_slope, self.max_slope)

    def slope_bound(self) -> float:
        return 0.0 if self.slope is None else self.max_slope

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_freqs={self.alpha.shape[1]}, "
            f"sink={self.sink is not None}, slope={self.slope is not None}"
        )


register(
    "goat",
    GOAT,
    num_freqs="R, the relative part's geometric frequencies (2 lanes each when folded; 0: none)",
    sink="add the key-only sink u_h(j) of GOATSink (1 lane)",
    slope="add the recency term -m_h |i - j| (1 lane; folds under a causal mask only)",
    init=FromModel(
        "'uniform' (K = 0: standard attention) or 'recency' (ALiBi); a model starting at 'alibi' gives "
        "'recency'",
        "init",
        {"uniform": "uniform", "alibi": "recency"},
    ),
    learnable_freqs="train the frequencies w_r too (the paper's open question 2)",
    freq_base="the lowest frequency is 1 / freq_base radians per token (relative part and sink)",
    train_len=FromModel(
        "the length the sink's inputs are normalised by, and init='recency' fits", "train_len"
    ),
    sink_freqs="the sink MLP's sinusoidal input frequencies",
    sink_hidden="the sink MLP's hidden width",
    max_slope="m_h is clamped to [-max_slope, max_slope]",
)
