"""The bandwidth ``tau > 0`` of scalar attention, learnable (seed 002 "Temperature").

``kind`` is one of ``TAU_KINDS``: ``"global"`` (one scalar shared by every head), ``"head"`` (one
per head) or ``"token"`` (per head and query token, from the input: a data-dependent bandwidth,
``raw = W x_i + b`` with ``W`` started at zero so every token starts at ``init``).

Positive by construction: ``tau = floor + softplus(raw)``, or with a cap ``tau = floor + (cap -
floor) sigmoid(raw)``, which stays below ``cap`` (seed 002 "Term 3": "a hard cap: tau =
softplus(tau_raw) with a max value"; the sigmoid form keeps a gradient at the cap, where clamping a
softplus would have none). ``floor = TAU_FLOOR`` keeps tau a positive float where softplus or
sigmoid would underflow to 0 (``softplus(-200) == 0`` in float32): a bandwidth of zero is undefined.

:func:`length_scaled_tau` is a rule for contexts longer than a length ``T``: a query that sees ``n >
T`` keys uses ``tau (T / n)^2``, added at inference with ``T`` the training length
(docs/scalar_decoding.md) or learned in training with ``T`` below it (:func:`rule_tau_init`,
docs/scalar_experiments.md section 8).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: How a scalar head's temperature is shared: one for every head, one per head, or one per token.
TAU_KINDS = ("global", "head", "token")
#: The smallest bandwidth (see the module docstring).
TAU_FLOOR = 1e-4


class Temperature(nn.Module):
    """``tau``: ``()`` (global), ``(H,)`` (per head) or ``(B, H, L)`` (per token) from ``x (B, L, d)``."""

    def __init__(
        self,
        num_heads: int,
        kind: str = "head",
        init: float = 0.1,
        cap: float | None = None,
        d_model: int | None = None,
    ):
        super().__init__()
        if kind not in TAU_KINDS:
            raise ValueError(f"tau kind must be one of {TAU_KINDS}, got {kind!r}")
        if not (isinstance(init, (int, float)) and math.isfinite(init) and init > TAU_FLOOR):
            raise ValueError(f"tau init must be a finite number > {TAU_FLOOR} (a bandwidth), got {init!r}")
        if cap is not None and not (math.isfinite(cap) and cap > init):
            raise ValueError(f"tau cap must be a finite number above init={init!r}, got {cap!r}")
        if kind == "token" and (not isinstance(d_model, int) or d_model < 1):
            raise ValueError(f"a per-token tau reads the input: give d_model, got {d_model!r}")
        self.kind, self.num_heads, self.cap = kind, num_heads, cap
        excess = init - TAU_FLOOR
        raw = math.log(excess / (cap - init)) if cap is not None else math.log(math.expm1(excess))
        if kind == "token":
            self.proj = nn.Linear(d_model, num_heads)
            nn.init.zeros_(self.proj.weight)
            nn.init.constant_(self.proj.bias, raw)
        else:
            self.raw = nn.Parameter(torch.full(() if kind == "global" else (num_heads,), raw))

    def positive(self, raw: Tensor) -> Tensor:
        if self.cap is None:
            return TAU_FLOOR + F.softplus(raw)
        return TAU_FLOOR + (self.cap - TAU_FLOOR) * torch.sigmoid(raw)

    def forward(self, x: Tensor | None = None) -> Tensor:
        if self.kind != "token":
            return self.positive(self.raw)
        if x is None:
            raise ValueError("a per-token tau is computed from the input: pass x (B, L, d_model)")
        return self.positive(self.proj(x)).transpose(1, 2)  # (B, H, L)

    def per_head(self, x: Tensor | None = None) -> Tensor:
        """tau broadcast to ``(H,)`` or ``(B, H, L)``: what ``L_tau`` sums over heads."""
        tau = self(x)
        return tau.expand(self.num_heads) if self.kind == "global" else tau

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kind={self.kind!r}, cap={self.cap}"


def check_train_length(train_len, name: str = "tau_length_scaling") -> None:
    """``train_len`` is ``None`` (no length scaling) or the positive int training length ``T``."""
    if train_len is not None and (
        isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 1
    ):
        raise ValueError(f"{name} must be None or the training length (a positive int), got {train_len!r}")


def length_scaled_tau(tau: Tensor, positions: Tensor, train_len: int) -> Tensor:
    """``tau min(1, (T / n_i)^2)`` ``(B, H, L)`` for queries at ``positions (B or 1, L)``, where
    ``n_i = position_i + 1`` keys are visible to query ``i`` of one causal sequence; ``tau`` is
    ``()``, ``(H,)`` or ``(B, H, L)`` (a :class:`Temperature`'s output).

    Why ``(T / n)^2``: over keys spread on a fixed range (``L_spread``), ``n`` keys lie ``n / T``
    times denser than ``T`` did, and the Gaussian kernel reaches ``sqrt(tau)`` in scalar distance,
    so the squared factor keeps as many keys within a query's reach as at the training length: the
    attention stays as local, in keys, as it was trained (seed 002 "Binary Search at Inference"
    bounds the window by that reach). It is a length rule in the spirit of SSMax's ``log n`` logit
    scale (seed 003); below ``T`` tau is unchanged.
    """
    n = (positions + 1).to(tau.dtype)
    shrink = (train_len / n).clamp(max=1.0) ** 2  # (B or 1, L)
    per_head = tau.view(1, -1, 1) if tau.dim() <= 1 else tau  # (1, H or 1, 1) or (B, H, L)
    return per_head * shrink[:, None, :]


def rule_tau_init(tau_init: float, seq_len: int, train_len: int) -> float:
    """The tau to start a model trained with the rule at ``T = train_len`` below its training length
    ``seq_len``: ``tau_init (seq_len / T)^2``, so the bandwidth at ``seq_len`` starts at ``tau_init``
    as a model without the rule starts. Started at ``tau_init`` instead, the rule's factor ``(T /
    seq_len)^2`` (1/16 to 1/64) must be learned back through the softplus, which takes thousands of
    steps: at 110 of 200 steps the tiny model at T = 32 of 256 trailed by 0.18 nats, its gradient
    norm at 36 (docs/scalar_experiments.md section 8)."""
    check_train_length(train_len)
    if not train_len < seq_len:
        raise ValueError(
            f"the rule's T={train_len} must be below the training length {seq_len} to train with it"
        )
    return tau_init * (seq_len / train_len) ** 2
