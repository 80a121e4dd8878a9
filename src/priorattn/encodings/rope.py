"""Rotary position embedding (Su et al., 2021), with position interpolation (Chen et al., 2023)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..checks import describe, is_integer_tensor

#: Positions in the rotation table a RoPE keeps per dtype and device (see :meth:`RoPE.rotations_of_run`).
TABLE_POSITIONS = 2048


@dataclass(frozen=True)
class RotationTable:
    """:meth:`RoPE.rotations` of positions ``start .. start + TABLE_POSITIONS - 1``."""

    start: int
    cos: Tensor  # (TABLE_POSITIONS, D)
    signed_sin: Tensor  # (TABLE_POSITIONS, D)

    def holds(self, start: int, length: int) -> bool:
        return self.start <= start and start + length <= self.start + self.cos.shape[0]


class RoPE(nn.Module):
    """Rotate lanes ``(r, r + D/2)`` of q or k by the angle ``theta_r * p / interpolation``.

    ``theta_r = base^(-2r / D)``, ``r = 0 .. D/2 - 1`` (rotate-half convention, as GPT-NeoX and
    LLaMA). A rotation depends only on the token's own position, so ``<rope(q, i), rope(k, j)>``
    depends only on ``i - j`` and a KV cache may store keys already rotated. ``interpolation > 1``
    squeezes positions into the trained range (position interpolation, Chen et al. 2023:
    ``p -> p / interpolation``). The other context extensions are subclasses that change
    :meth:`freqs` and :attr:`attention_factor` (:mod:`priorattn.encodings.rope_scaling`).

    Angles are formed in float64, then cast to the input's dtype: at position 10^5 a float32 angle
    is off by ~0.01 rad. No parameters, no buffers: the frequencies are formed in float64 with each
    rotation, so ``.float()`` or ``.half()`` on a parent module cannot round them. A layer makes the
    rotations of its positions once (:meth:`rotations`, or :meth:`rotations_of_run` for a run of
    positions, read from a table) and applies them to q and k (:meth:`rotate`).
    """

    def __init__(self, head_dim: int, base: float = 10_000.0, interpolation: float = 1.0):
        super().__init__()
        if not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"RoPE rotates lane pairs: head_dim must be even, got {head_dim!r}")
        if not base > 1.0:
            raise ValueError(f"base must be > 1, got {base!r}")
        if not interpolation > 0.0:
            raise ValueError(f"interpolation must be > 0, got {interpolation!r}")
        self.head_dim = head_dim
        self._base = float(base)
        self._interpolation = float(interpolation)
        # The sign of the sine that multiplies lane ``(r + D/2) mod D`` in a rotation: a plain
        # float64 tensor, not a buffer.
        half = torch.ones(head_dim // 2, dtype=torch.float64)
        self.sine_signs = torch.cat([-half, half])
        self._tables: dict[tuple[torch.dtype, torch.device], RotationTable] = {}

    # Read-only: the rotation tables are made from them (an edit would leave the tables behind).
    @property
    def base(self) -> float:
        return self._base

    @property
    def interpolation(self) -> float:
        return self._interpolation

    @property
    def attention_factor(self) -> float:
        """The factor a rotation multiplies q and k by, so the content logits by its square: 1 here
        (YaRN's ``sqrt(1/t)``: :class:`~priorattn.encodings.YaRNRoPE`)."""
        return 1.0

    def freqs(self, device: torch.device | None = None) -> Tensor:
        """``theta_r = base^(-2r / D)`` as ``(D/2,)`` float64: the angle per position of lanes ``r``
        and ``r + D/2``."""
        return rope_freqs(self.head_dim, self.base, device)

    def rotations(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``cos`` and signed ``sin`` per lane for integer ``positions`` ``(L,)`` or ``(B, L)``, each
        ``(L, D)`` or ``(B, 1, L, D)`` in ``dtype`` (times :attr:`attention_factor`): made once for a
        layer's q and k."""
        device = positions.device
        theta = self.freqs(device)
        lane_freqs = torch.cat([theta, theta])  # lanes r and r + D/2 turn together
        angle = (positions.to(torch.float64) / self.interpolation)[..., None] * lane_freqs
        if angle.dim() == 3:
            angle = angle[:, None]  # (B, 1, L, D)
        cos, sin = angle.cos(), angle.sin() * self.sine_signs.to(device)
        factor = self.attention_factor
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos.to(dtype), sin.to(dtype)

    def rotations_of_run(
        self, start: int, length: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[Tensor, Tensor]:
        """:meth:`rotations` of positions ``start .. start + length - 1``, each ``(length, D)``.

        A decode step would otherwise form a new token's angles, cosines and sines in float64 and
        cast them, ~10 small operations per layer for one position (RoPE's whole extra cost over
        NoPE in a decode step, docs/performance_log.md). Here a run of at most ``TABLE_POSITIONS`` is a
        view of a table of ``TABLE_POSITIONS`` positions kept per dtype and device, made again from
        ``start`` when the run leaves it (a generation makes one per ``TABLE_POSITIONS`` steps, a
        training run with one length one): the same values in memory that stays
        ``O(TABLE_POSITIONS)`` however long the generation. Longer runs are formed as they come.
        """
        if length > TABLE_POSITIONS or torch.compiler.is_compiling():  # tracing keeps no state
            return self.rotations(torch.arange(start, start + length, device=device), dtype)
        key = (dtype, device)
        table = self._tables.get(key)
        if table is None or not table.holds(start, length):
            # Not an inference tensor even under inference mode: a later training pass saves
            # views of the table for its backward.
            with torch.inference_mode(False):
                positions = torch.arange(start, start + TABLE_POSITIONS, device=device)
                table = self._tables[key] = RotationTable(start, *self.rotations(positions, dtype))
        offset = start - table.start
        return table.cos[offset : offset + length], table.signed_sin[offset : offset + length]

    def partners(self, x: Tensor) -> Tensor:
        """Lane ``(r + D/2) mod D`` of ``x`` at lane ``r``: the lane each lane turns with."""
        return x.roll(self.head_dim // 2, dims=-1)

    def rotate(self, x: Tensor, rotations: tuple[Tensor, Tensor]) -> Tensor:
        """``x`` ``(B, H, L, D)`` rotated by :meth:`rotations`: ``[x1, x2] -> [x1 c - x2 s, x2 c + x1 s]``,
        the halves swapped by :meth:`partners`."""
        cos, signed_sin = rotations
        return torch.addcmul(x * cos, self.partners(x), signed_sin)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x: (B, H, L, D)`` to integer ``positions: (L,)`` or ``(B, L)``."""
        if not isinstance(x, Tensor) or x.dim() != 4 or x.shape[-1] != self.head_dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, H, L, {self.head_dim}), got {shape}")
        B, _, L, _ = x.shape
        if not is_integer_tensor(positions) or positions.shape not in ((L,), (1, L), (B, L)):
            raise ValueError(
                f"positions must be an integer tensor of shape ({L},) or ({B}, {L}), "
                f"got {describe(positions)}"
            )
        return self.rotate(x, self.rotations(positions, x.dtype))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}, interpolation={self.interpolation:g}"


def rope_freqs(head_dim: int, base: float, device: torch.device | None = None) -> Tensor:
    """``base^(-2r / head_dim)``, ``r = 0 .. head_dim/2 - 1``, as ``(head_dim/2,)`` float64."""
    lanes = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
    return base ** (-lanes / head_dim)
