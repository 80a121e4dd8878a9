"""GOAT's learnable spectral prior with a key-only sink (seed 000 Section 4, Algorithm 1)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_int
from .base import FoldLanes, PositionTable, Prior, in_own_dtype
from .math import alibi_slopes, angles, geometric_freqs, inverse_softplus, pairwise_lags, phases
from .registry import Choice, FromModel, register
from .score_mod import ScoreTerms

__all__ = ["GOAT", "PerHeadSink"]


class KeySink(nn.Module):
    """A key-only log-prior ``u_h(j)`` (seed 000 Eq. 19) over sinusoidal and length-normalised inputs
    of the key's position (the seed names the kinds of input, not the formulas):
    ``[cos(v_m j), sin(v_m j), j / train_len, sign(j) log(1 + |j|) / log(1 + train_len)]`` with
    ``num_freqs`` geometric frequencies ``v_m`` (base ``freq_base``), so it is defined at every
    length, including unseen ones. ``train_len`` only scales the two length-normalised inputs.

    Negative key positions (e.g. keys counted back from a query at 0): the sinusoids and ``j /
    train_len`` are defined there already; the log input is continued as an odd function, so ``u`` is
    finite at every integer position and unchanged at ``j >= 0``.

    ``u`` depends on the key's position alone: a decode step reads it from a :class:`PositionTable`.
    Subclasses give :meth:`evaluate`.
    """

    def __init__(self, num_heads: int, num_freqs: int, train_len: int, freq_base: float):
        super().__init__()
        if train_len < 1:
            raise ValueError(f"train_len must be >= 1, got {train_len}")
        self.num_heads = num_heads
        self.train_len = train_len
        self.register_buffer("freqs", geometric_freqs(num_freqs, freq_base).to(torch.get_default_dtype()))
        self.by_position = PositionTable(self, self.evaluate)

    def features(self, k_pos: Tensor) -> Tensor:
        """The MLP's inputs ``(..., Lk, 2 * sink_freqs + 2)`` for integer key positions ``(..., Lk)``,
        in ``freqs.dtype``: computed in float64 (the angles must be, :func:`angles`) and rounded once."""
        position = k_pos.to(torch.float64)[..., None]  # (..., Lk, 1), exact integers
        angle = position * self.freqs  # (..., Lk, R), float64: the product widens the frequencies
        # odd continuation of log(1 + j): log1p alone is NaN below j = -1
        log_position = torch.copysign(torch.log1p(position.abs()), position)
        inputs = [
            angle.cos(),
            angle.sin(),
            position / self.train_len,
            log_position / math.log1p(self.train_len),
        ]
        return torch.cat(inputs, dim=-1).to(self.freqs.dtype)

    def forward(self, k_pos: Tensor) -> Tensor:
        """``u_h(j)`` as ``(..., H, Lk)`` for integer key positions ``(..., Lk)``."""
        return self.by_position(k_pos).movedim(0, -2)

    def evaluate(self, k_pos: Tensor) -> Tensor:
        """``u_h(j)`` computed afresh, ``(..., H, Lk)``, in the parameters' dtype (:func:`in_own_dtype`)."""
        raise NotImplementedError


def rotation_phases(pos: Tensor, freqs: Tensor) -> Tensor:
    """``[cos(w_r pos), sin(w_r pos), -cos(w_r pos)]`` ``(..., L, 3R)`` in ``freqs.dtype`` (angles
    in float64, :func:`angles`): the first ``2R`` are the fold's key lanes, and the windows ``[cos,
    sin]`` and ``[sin, -cos]`` give its query lanes as two products with the spectral weights."""
    angle = angles(pos, freqs)
    cos = angle.cos()
    return torch.cat([cos, angle.sin(), -cos], dim=-1).to(freqs.dtype)


def sink_mlp(in_features: int, hidden: int, out_features: int) -> nn.Sequential:
    """One SiLU layer of ``hidden`` units; the output layer starts at zero (``u = 0``)."""
    mlp = nn.Sequential(nn.Linear(in_features, hidden), nn.SiLU(), nn.Linear(hidden, out_features))
    nn.init.zeros_(mlp[2].weight)
    nn.init.zeros_(mlp[2].bias)
    return mlp


class SharedSink(KeySink):
    """GOAT's sink as its authors' package ``goat-attention`` 0.1.1 defines it:

    ``u_h(j) = gain_h * u(j) + bump_h * [j = 0]``

    one MLP ``u(j)`` over the inputs of :class:`KeySink` shared by every head, a per-head ``gain``
    (starting at 1) and a per-head ``bump`` at position 0 (starting at 0): an explicit BOS sink, the
    attention sink of seed 000 Sec. 5. The MLP's output layer starts at zero, so a new sink is
    ``u = 0`` (standard attention).
    """

    def __init__(
        self,
        num_heads: int,
        num_freqs: int = 8,
        hidden: int = 16,
        train_len: int = 2048,
        freq_base: float = 10_000.0,
    ):
        super().__init__(num_heads, num_freqs, train_len, freq_base)
        dtype = torch.get_default_dtype()
        self.mlp = sink_mlp(2 * num_freqs + 2, hidden, 1)
        self.gain = nn.Parameter(torch.ones(num_heads, dtype=dtype))
        self.bump = nn.Parameter(torch.zeros(num_heads, dtype=dtype))

    def evaluate(self, k_pos: Tensor) -> Tensor:
        with in_own_dtype(self.freqs.device):
            u = self.mlp(self.features(k_pos)) * self.gain  # (..., Lk, H)
            u = torch.where((k_pos == 0)[..., None], u + self.bump, u)
        return u.transpose(-1, -2)


class PerHeadSink(KeySink):
    """GOAT's per-head sink, ``GOAT(sink="per_head")``: a learnable linear decay plus an MLP with one
    output per head (seed 000 Eq. 19: "a learnable linear decay plus an MLP over sinusoidal and
    length-normalized scalar inputs"):

    ``u_h(j) = -decay_h * j / train_len + MLP_h(inputs of KeySink)``

    The decay is a second unbounded learned trend beside GOAT's slope, free to cancel it, which is why
    the default sink (:class:`SharedSink`) has none; this one loads the runs trained with it. The
    MLP's output layer and ``decay`` start at zero (``u = 0``).
    """

    def __init__(
        self,
        num_heads: int,
        num_freqs: int = 8,
        hidden: int = 16,
        train_len: int = 2048,
        freq_base: float = 10_000.0,
    ):
        super().__init__(num_heads, num_freqs, train_len, freq_base)
        self.decay = nn.Parameter(torch.zeros(num_heads, dtype=torch.get_default_dtype()))
        self.mlp = sink_mlp(2 * num_freqs + 2, hidden, num_heads)

    def evaluate(self, k_pos: Tensor) -> Tensor:
        with in_own_dtype(self.freqs.device):
            u = (
                self.mlp(self.features(k_pos)) - self.decay * k_pos[..., None] / self.train_len
            )  # (..., Lk, H)
        return u.transpose(-1, -2)


#: The sinks by ``GOAT(sink=...)``.
SINKS = {"shared": SharedSink, "per_head": PerHeadSink}
SLOPES = ("learned", "fixed", "none")
#: GOAT's starts, ``GOAT(init=...)``.
INITS = ("seeded", "uniform", "alibi")
#: GOAT's earlier names of its starts: ``"recency"`` is ``"alibi"``, as GGD and ``GPTConfig.prior_init``
#: name the ALiBi start (so specs and configs saved with it still build).
EARLIER_INITS = {"recency": "alibi"}
#: What ``sink`` and ``slope`` given as True or False (switched on or off) read as: the arguments, a
#: spec's ``true``/``false`` and a JSON spec's or saved config's booleans alike.
SINK_OF_BOOL = {True: "shared", False: "none"}
SLOPE_OF_BOOL = {True: "learned", False: "none"}
#: ``softplus(UNIFORM_SLOPE_RAW)`` (1e-13): the learned slope of ``init="uniform"``, as goat-attention
#: starts it; ``softplus`` never reaches 0.
UNIFORM_SLOPE_RAW = -30.0


class GOAT(Prior):
    """``K_h(i, j) = sum_r alpha[h,r] cos(w_r (i-j)) + beta[h,r] sin(w_r (i-j)) + u_h(j) - m_h |i-j|``,
    for query ``i`` times ``g_h(q_i)`` with the query-norm gate.

    - Relative part (seed 000 Eq. 12): ``num_freqs`` fixed geometric frequencies in buffer ``freqs``
      (a parameter with ``learnable_freqs=True``, the paper's open question 2).
    - ``sink``: the key-only ``u_h(j)`` (Eq. 19): ``"shared"`` (:class:`SharedSink`, the authors'
      package's), ``"per_head"`` (:class:`PerHeadSink`: a per-head MLP and linear decay) or ``"none"``.
    - ``slope``: the recency term ``-m_h |i - j|`` with ``m_h >= 0`` (App. F.3, Theorem 3 and Prop.
      F.6: the least-committal recency prior is exponential in the lag, so ``m`` cannot turn into an
      anti-recency): ``"learned"`` (``m_h = softplus(slope_raw_h)``, parameter ``slope_raw``),
      ``"fixed"`` (the ALiBi slopes in buffer ``slopes``: "the fixed inductive bias term" of App. F)
      or ``"none"``. It folds only under a causal mask, where it is the key-linear lane ``m_h j``.
      ``m_h`` is capped at ``max_slope`` (default 1: a recency weight of at least ``e^-1`` per token
      of lag), so its size is known without reading it: the SDPA route sizes its re-centred runs of
      queries by ``max_slope`` where reading the slope would stall an accelerator or break a
      compiled graph (``functional/prior_inputs.py``).
    - ``gate``: the query-norm prior gate of goat-attention, ``g_h(q_i) = sigmoid(gate_bias_h -
      softplus(gate_scale_raw_h) ||q_i||)`` of the query's content ``q_i`` (:meth:`query_gate`),
      multiplying query i's whole log-prior (seed 000 Thm 5.1: the prior sheds as the content signal
      grows). It starts as goat-attention's, ``sigmoid(10 - 4.5e-5 ||q||)``, about 1.

    ``num_freqs=0`` keeps only the sink and the slope (no relative spectral part).

    Folded into a head (:class:`~priorattn.PriorMultiheadAttention`), GOAT takes ``fold_width`` of
    its query/key lanes from the content: ``2 num_freqs`` + 1 for a sink + 1 for a slope.

    Starts (``init``; the spectral weights, the sink's output and the gate start as below in each):

    - ``"seeded"`` (the default, goat-attention's ``prior_init="seeded"``): a learned slope starts at
      the ALiBi slopes, every other term at 0. A softplus slope cannot start at 0 and learn: from
      ``softplus(-30)`` its gradient is ``sigmoid(-30)`` ~ 1e-13 of the loss's, below AdamW's ``eps``,
      and it stays there (docs/priors.md).
    - ``"uniform"``: standard attention, every term 0, a learned slope at ``softplus(-30)`` = 1e-13
      (goat-attention's ``prior_init="uniform"``; in practice a constant 0, as above).
    - ``"alibi"``: ALiBi (``"recency"`` is its earlier name). A learned slope takes the ALiBi slopes
      (as ``"seeded"``); with
      ``slope="none"`` the spectral weights are fitted by least squares to ``-m_h d`` over lags ``d``
      in ``[0, train_len)`` (so it matches ALiBi under a causal mask; future keys are not fitted).

    A fixed slope is ALiBi's whatever ``init`` says.

    Folding (Eq. 17-21): ``q`` lanes ``[alpha cos(w i) + beta sin(w i), alpha sin(w i) - beta cos(w i)]``,
    ``k`` lanes ``[cos(w j), sin(w j)]`` (2R lanes shared by every head), then one sink lane
    ``1 . u_h(j)`` and one slope lane ``m_h . (j - centre)``; the routes multiply a query's lanes by
    its gate.

    A state dict holding the slope as parameter ``slope`` (``m_h`` itself, of either sign) loads into
    ``slope="learned"`` (``slope_raw = softplus^-1(m_h)``) unless a head's ``m_h`` is negative, which
    no slope of this GOAT can be: the message says so.
    """

    def __init__(
        self,
        num_heads: int,
        num_freqs: int = 8,
        *,
        sink: str = "shared",
        slope: str = "learned",
        gate: bool = False,
        init: str = "seeded",
        learnable_freqs: bool = False,
        freq_base: float = 10_000.0,
        train_len: int = 2048,
        sink_freqs: int = 8,
        sink_hidden: int = 16,
        max_slope: float = 1.0,
    ):
        super().__init__()
        sink = SINK_OF_BOOL[sink] if isinstance(sink, bool) else sink
        slope = SLOPE_OF_BOOL[slope] if isinstance(slope, bool) else slope
        if not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if not isinstance(num_freqs, int) or num_freqs < 0:
            raise ValueError(f"num_freqs must be an int >= 0, got {num_freqs!r}")
        if sink not in (*SINKS, "none"):
            raise ValueError(f"sink must be one of {', '.join([*SINKS, 'none'])}, got {sink!r}")
        if slope not in SLOPES:
            raise ValueError(f"slope must be one of {', '.join(SLOPES)}, got {slope!r}")
        if num_freqs == 0 and sink == "none" and slope == "none":
            raise ValueError(
                "GOAT with num_freqs=0, sink='none' and slope='none' has no term left: it is standard "
                "attention (use Uniform() or prior=None), or give num_freqs >= 1"
            )
        for name, value, low in (
            ("train_len", train_len, 1),
            ("sink_freqs", sink_freqs, 0),
            ("sink_hidden", sink_hidden, 1),
        ):
            check_int(name, value, low=low)
        for name, value in (("gate", gate), ("learnable_freqs", learnable_freqs)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if isinstance(freq_base, bool) or not (
            isinstance(freq_base, int | float) and 1 < freq_base < math.inf
        ):
            raise ValueError(f"freq_base must be a finite number > 1, got {freq_base!r}")
        if not (isinstance(max_slope, int | float) and 0 < max_slope < math.inf):
            raise ValueError(f"max_slope must be a positive finite number, got {max_slope!r}")
        init = EARLIER_INITS.get(init, init)
        if init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, got {init!r}")
        dtype = torch.get_default_dtype()
        self.num_heads = num_heads
        freqs = geometric_freqs(num_freqs, freq_base).to(dtype)
        if learnable_freqs:
            self.freqs = nn.Parameter(freqs)
        else:
            self.register_buffer("freqs", freqs)
        self.alpha = nn.Parameter(torch.zeros(num_heads, num_freqs, dtype=dtype))
        self.beta = nn.Parameter(torch.zeros(num_heads, num_freqs, dtype=dtype))
        self.sink = None
        if sink != "none":
            self.sink = SINKS[sink](num_heads, sink_freqs, sink_hidden, train_len, freq_base)
        self.slope_kind = slope
        learned = torch.full((num_heads,), UNIFORM_SLOPE_RAW, dtype=dtype)
        self.slope_raw = nn.Parameter(learned) if slope == "learned" else None
        self.register_buffer("slopes", alibi_slopes(num_heads).to(dtype) if slope == "fixed" else None)
        # goat-attention's start: softplus(-10) = 4.5e-5 per unit of ||q||, bias 10
        self.gate_scale_raw = nn.Parameter(torch.full((num_heads,), -10.0, dtype=dtype)) if gate else None
        self.gate_bias = nn.Parameter(torch.full((num_heads,), 10.0, dtype=dtype)) if gate else None
        self.max_slope = float(max_slope)
        self.by_lag = PositionTable(self, self.relative)
        if self.slope_raw is not None and init != "uniform":
            with torch.no_grad():
                self.slope_raw.copy_(inverse_softplus(alibi_slopes(num_heads)))
        elif self.slope_kind == "none" and init == "alibi":
            self._fit_recency(train_len)

    @torch.no_grad()
    def _fit_recency(self, fit_len: int) -> None:
        """The spectral weights that best match ALiBi's ``-m_h d`` over lags ``[0, fit_len)``."""
        slopes = alibi_slopes(self.num_heads)
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

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        old = state_dict.get(prefix + "slope")
        if old is not None and self.slope_raw is not None and prefix + "slope_raw" not in state_dict:
            state_dict[prefix + "slope_raw"] = self.raw_of_saved_slope(old)
            del state_dict[prefix + "slope"]
        if (
            self.sink is not None
            and prefix + "sink.decay" in state_dict
            and isinstance(self.sink, SharedSink)
        ):
            raise ValueError(
                f"{prefix or 'the state'} holds GOAT's per-head sink of an earlier priorattn version "
                "(sink.decay, one MLP output per head), which the shared sink cannot represent: build "
                "the prior with goat(sink=per_head) to load it"
            )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)

    def raw_of_saved_slope(self, old: Tensor) -> Tensor:
        """``slope_raw`` of a state dict holding ``m_h`` as its parameter ``slope`` (clamped to
        ``[-max_slope, max_slope]``); a ValueError where a head's ``m_h`` is negative."""
        m = old.clamp(-self.max_slope, self.max_slope)
        if (m < 0).any():
            raise ValueError(
                f"this GOAT was saved with recency slopes {[round(x, 4) for x in m.tolist()]}: a negative "
                "one rewards distance (anti-recency), which GOAT's slope, softplus(slope_raw) "
                ">= 0, cannot represent; load it into goat(slope=none) after dropping 'slope' to run "
                "without it, or with the priorattn version that saved it"
            )
        raw = inverse_softplus(m.double()).clamp(min=UNIFORM_SLOPE_RAW)  # m = 0: the uniform start
        return raw.to(old.dtype)

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        K = self.by_lag(pairwise_lags(q_pos, k_pos)).movedim(0, -3)  # (..., H, Lq, Lk)
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
        m = self.fold_slope()
        if m is not None:
            K = K - m[:, None].to(K.dtype) * lag.to(self.alpha.dtype).abs()
        return K

    def score_terms(self, q_pos: Tensor, k_pos: Tensor, lags: Tensor) -> ScoreTerms:
        """The relative part (spectral and slope) by lag, the sink by key: no ``Lq x Lk`` values."""
        return ScoreTerms(by_lag=self.relative(lags), by_key=None if self.sink is None else self.sink(k_pos))

    def query_gate(self, q: Tensor) -> Tensor | None:
        """``g_h(q_i) = sigmoid(gate_bias_h - softplus(gate_scale_raw_h) ||q_i||)`` ``(B, H, Lq, 1)``
        for content queries ``q`` ``(B, H, Lq, Dk)`` (before any scale), in ``q``'s dtype or float32 if
        wider; None without a gate."""
        if self.gate_bias is None:
            return None
        dtype = torch.promote_types(q.dtype, torch.float32)
        norm = torch.linalg.vector_norm(q.to(dtype), dim=-1, keepdim=True)  # (B, H, Lq, 1)
        scale = F.softplus(self.gate_scale_raw).to(dtype)[:, None, None]
        return torch.sigmoid(self.gate_bias.to(dtype)[:, None, None] - scale * norm)

    @property
    def gated(self) -> bool:
        return self.gate_bias is not None

    @property
    def is_relative(self) -> bool:
        return self.sink is None

    def can_fold(self, causal: bool) -> bool:
        return causal or self.slope_kind == "none"

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        # seed 000 Eq. 17-18: spectral rotation of q, Fourier features of k; one set of phases where
        # the queries' positions are the keys' (self-attention without a cache)
        R = self.alpha.shape[-1]
        k_phases = rotation_phases(k_pos, self.freqs)  # (..., Lk, 3R)
        q_phases = k_phases if q_pos is k_pos else rotation_phases(q_pos, self.freqs)
        cos_sin = q_phases[..., None, :, : 2 * R].unflatten(-1, (2, R))  # (..., 1, Lq, 2, R)
        sin_neg_cos = q_phases[..., None, :, R:].unflatten(-1, (2, R))
        alpha, beta = self.alpha[:, None, None, :], self.beta[:, None, None, :]  # (H, 1, 1, R)
        # [alpha cos + beta sin, alpha sin - beta cos], (..., H, Lq, 2R)
        q_lanes = torch.addcmul(alpha * cos_sin, beta, sin_neg_cos).flatten(-2)
        key_bias = None if self.sink is None else self.sink(k_pos)  # Eq. 19: <1, u_h(j)>
        return FoldLanes(
            q_lanes,
            k_phases[..., None, :, : 2 * R],  # [cos, sin]
            key_bias,
            self.fold_slope(),  # Prop. F.6: -m (i - j) = m j + row constant
        )

    def fold_slope(self) -> Tensor | None:
        """``m_h >= 0``: ``softplus(slope_raw)`` (learned) or the buffer ``slopes`` (fixed), capped at
        ``max_slope``; None without a slope."""
        if self.slope_raw is not None:
            return F.softplus(self.slope_raw).clamp(max=self.max_slope)
        return None if self.slopes is None else self.slopes.clamp(max=self.max_slope)

    def slope_bound(self) -> float:
        return 0.0 if self.slope_kind == "none" else self.max_slope

    def extra_repr(self) -> str:
        kind = "none" if self.sink is None else next(k for k, c in SINKS.items() if type(self.sink) is c)
        return (
            f"num_heads={self.num_heads}, num_freqs={self.alpha.shape[1]}, sink={kind}, "
            f"slope={self.slope_kind}, gate={self.gate_bias is not None}"
        )


register(
    "goat",
    GOAT,
    num_freqs="R, the relative part's geometric frequencies (2 lanes each when folded; 0: none)",
    sink=Choice(
        "the key-only sink u_h(j): shared (goat-attention's: shared MLP x per-head gain + BOS bump), "
        "per_head (a per-head MLP + linear decay) or none (1 lane)",
        (*SINKS, "none"),
        SINK_OF_BOOL,
    ),
    slope=Choice(
        "the recency term -m_h |i - j|, m_h >= 0: learned (softplus), fixed (ALiBi's) or none "
        "(1 lane; folds under a causal mask only)",
        SLOPES,
        SLOPE_OF_BOOL,
    ),
    gate="goat-attention's query-norm gate sigmoid(b_h - softplus(s_h) ||q_i||) on query i's log-prior",
    init=FromModel(
        "'seeded' (goat-attention's: a learned slope at ALiBi's, the rest 0), 'uniform' (K = 0: "
        "standard attention; a learned slope then stays ~0) or 'alibi' (ALiBi; 'recency' is its "
        "earlier name); a model starting at 'uniform' or 'alibi' gives the same",
        "init",
        {"uniform": "uniform", "alibi": "alibi"},  # the model's two starts, GOAT's words for them
    ),
    learnable_freqs="train the frequencies w_r too (the paper's open question 2)",
    freq_base="the lowest frequency is 1 / freq_base radians per token (relative part and sink)",
    train_len=FromModel("the length the sink's inputs are normalised by, and init='alibi' fits", "train_len"),
    sink_freqs="the sink MLP's sinusoidal input frequencies",
    sink_hidden="the sink MLP's hidden width",
    max_slope="m_h is capped at max_slope",
)
