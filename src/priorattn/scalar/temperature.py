"""The bandwidth ``tau > 0`` of scalar attention, learnable (seed 002 "Temperature").

``kind`` is one of ``TAU_KINDS``: ``"global"`` (one scalar shared by every head), ``"head"`` (one
per head) or ``"token"`` (per head and query token, from the input: a data-dependent bandwidth,
``raw = W x_i + b`` with ``W`` started at zero so every token starts at ``init``).

Positive by construction: ``tau = floor + softplus(raw)``, or with a cap ``tau = floor + (cap -
floor) sigmoid(raw)``, which stays below ``cap`` (seed 002 "Term 3": "a hard cap: tau =
softplus(tau_raw) with a max value"; the sigmoid form keeps a gradient at the cap, where clamping a
softplus would have none). ``floor = TAU_FLOOR`` keeps tau a positive float where softplus or
sigmoid would underflow to 0 (``softplus(-200) == 0`` in float32): a bandwidth of zero is undefined.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
