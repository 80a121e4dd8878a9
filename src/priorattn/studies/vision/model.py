"""A small ViT (Dosovitskiy et al., 2021) whose attention takes one of four position mechanisms.

Pre-norm blocks ``x + attn(norm(x))``, ``x + SwiGLU(norm(x))`` (seed 000 App. H: "ViT-Small (SwiGLU
variant)"), a class token, RMSNorm and a linear head on the class token. Position enters as
``position``:

- ``"goat"``: :class:`~.priors.GOAT2D` inside every attention layer (folded into q/k lanes);
- ``"alibi"``: :class:`~.priors.ALiBi2D` inside every attention layer;
- ``"rope"``: :class:`~.rope.RoPE2D` on q/k;
- ``"learned"``: absolute embeddings added to the patches, learned on the training grid and
  resampled bicubically to other grids (as ViTs are fine-tuned at other resolutions).

Any image size that is a multiple of the patch size runs: the patch grid grows with the image.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import registry
from ...encodings import RoPE
from ...layers import PriorMultiheadAttention
from ...models.gpt import SwiGLU
from ...priors import Prior
from .positions import grid_positions
from .priors import GOAT2D, ALiBi2D
from .rope import RoPE2D


@dataclass
class ViTConfig:
    """Everything that defines a :class:`ViT`. ``image_size`` is the training resolution: it sets
    the grid of the learned embeddings and the grid side GOAT's sink normalises by. ``goat_*``:
    :class:`~.priors.GOAT2D`'s frequencies per axis, their base, and whether it has the key sink."""

    position: str
    image_size: int = 28
    patch_size: int = 7
    channels: int = 1
    num_classes: int = 10
    d_model: int = 96
    n_layers: int = 4
    n_heads: int = 3
    mlp_hidden: int = 256
    goat_freqs: int = 3
    goat_freq_base: float = 16.0
    goat_sink: bool = True
    rope_base: float = 100.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        registry.lookup("grid position", self.position)
        sizes = ("image_size", "patch_size", "channels", "num_classes", "d_model", "n_layers", "n_heads")
        for name in sizes + ("mlp_hidden", "goat_freqs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        check_image_size(self.image_size, self.patch_size)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    @property
    def grid_size(self) -> int:
        """Patches per side at the training resolution."""
        return self.image_size // self.patch_size

    def to_dict(self) -> dict:
        return asdict(self)


def check_image_size(size: int, patch_size: int) -> None:
    if size % patch_size:
        raise ValueError(f"image size {size} is not a multiple of patch_size={patch_size}")


@dataclass(frozen=True)
class GridPosition:
    """A position mechanism of the ViT (the ``"grid position"`` kind of :mod:`priorattn.registry`):
    ``parts(config)`` is what each attention layer takes, ``(prior, rope)`` (either ``None``), and
    ``embedded`` whether the patches get learned absolute embeddings instead."""

    parts: Callable[[ViTConfig], tuple[Prior | None, RoPE | None]]
    embedded: bool = False


def goat_parts(config: ViTConfig) -> tuple[Prior, None]:
    """GOAT in 2-D (seed 000 App. H): :class:`~.priors.GOAT2D` over the training grid."""
    prior = GOAT2D(
        config.n_heads,
        config.goat_freqs,
        sink=config.goat_sink,
        freq_base=config.goat_freq_base,
        grid_size=config.grid_size,
    )
    return prior, None


#: The ViT's position mechanisms by ``ViTConfig.position``, registered as grid positions.
GRID_POSITIONS = {
    "goat": GridPosition(goat_parts),
    "rope": GridPosition(lambda config: (None, RoPE2D(config.d_model // config.n_heads, config.rope_base))),
    "alibi": GridPosition(lambda config: (ALiBi2D(config.n_heads), None)),
    "learned": GridPosition(lambda config: (None, None), embedded=True),
}
for _name, _position in GRID_POSITIONS.items():
    registry.register("grid position", _name, _position)
#: Their names.
POSITIONS = tuple(GRID_POSITIONS)


def attention_layer(config: ViTConfig) -> PriorMultiheadAttention:
    """One layer's bidirectional attention with the config's position mechanism inside."""
    prior, rope = registry.lookup("grid position", config.position).parts(config)
    return PriorMultiheadAttention(config.d_model, config.n_heads, prior=prior, encoding=rope, causal=False)


class Block(nn.Module):
    """Pre-norm ViT block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = attention_layer(config)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = SwiGLU(config.d_model, config.mlp_hidden, 0.0)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x), positions=positions)[0]
        return x + self.mlp(self.mlp_norm(x))


class ViT(nn.Module):
    """``images (B, C, S, S) -> logits (B, num_classes)`` for any ``S`` that is a multiple of the patch."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        d, G = config.d_model, config.grid_size
        self.patch_embed = nn.Conv2d(config.channels, d, config.patch_size, stride=config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        learned = registry.lookup("grid position", config.position).embedded
        self.pos_embed = nn.Parameter(torch.randn(1, d, G, G) * 0.02) if learned else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(d, eps=config.norm_eps)
        self.head = nn.Linear(d, config.num_classes)
        for block in self.blocks:  # nanoGPT's scaling of residual projections
            for linear in (block.attn.out_proj, block.mlp.down):
                nn.init.normal_(linear.weight, std=0.02 / math.sqrt(2 * config.n_layers))

    def position_embedding(self, height: int, width: int) -> Tensor:
        """The learned embeddings on a ``height x width`` grid ``(1, height * width, d)``: bicubic
        resampling of the training grid's (Dosovitskiy et al. Sec. 3.2, "2D interpolation")."""
        pos_embed = self.pos_embed
        if pos_embed.shape[-2:] != (height, width):
            pos_embed = F.interpolate(pos_embed, size=(height, width), mode="bicubic", align_corners=False)
        return pos_embed.flatten(2).transpose(1, 2)

    def forward(self, images: Tensor) -> Tensor:
        if not isinstance(images, Tensor) or images.dim() != 4 or images.shape[1] != self.config.channels:
            got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"images must be (B, {self.config.channels}, S, S), got {got}")
        for size in images.shape[-2:]:
            check_image_size(size, self.config.patch_size)
        patches = self.patch_embed(images)  # (B, d, gh, gw)
        gh, gw = patches.shape[-2:]
        x = patches.flatten(2).transpose(1, 2)  # (B, gh * gw, d)
        if self.pos_embed is not None:
            x = x + self.position_embedding(gh, gw)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)  # (B, 1 + gh * gw, d)
        positions = grid_positions(gh, gw, device=x.device)
        for block in self.blocks:
            x = block(x, positions)
        return self.head(self.norm(x[:, 0]))

    def priors(self) -> list[GOAT2D | ALiBi2D]:
        """The prior of every layer, first to last (empty without one)."""
        return [block.attn.prior for block in self.blocks if block.attn.prior is not None]
