"""``PriorMultiheadAttention``: drop-in self-attention with injected parts (a prior, RoPE, SSMax,
FoX's forget gate) and a KV cache; and the ``"standard"`` and ``"fox"`` attention mechanisms of a GPT
(:mod:`priorattn.mechanisms`), built from a ``GPTConfig``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from ..checks import check_doc_ids, check_key_padding_mask, check_positions, describe
from ..encodings import RoPE, Sinusoidal, scaled_rope
from ..functional import attention
from ..functional.api import check_normalizer, check_options
from ..functional.sdpa import is_decode_step, to_width
from ..mechanisms import register_mechanism
from ..priors import Prior
from ..ssmax import SSMax
from .forget_gate import ForgetGate
from .kv_cache import KVCache


class PriorMultiheadAttention(nn.Module):
    """Self-attention ``softmax_j(<q_i, k_j> / sqrt(d_q) + K_h(i, j)) v_j`` with a KV cache.

    Args:
        d_model: width of the input and output.
        num_heads: query heads ``H``. num_kv_heads: key/value heads ``Hkv`` (grouped-query
            attention), default ``H``.
        prior: a :class:`~priorattn.priors.Prior` with ``num_heads`` heads (or head-independent).
        encoding: ``None``, ``"rope"``, a :class:`~priorattn.encodings.RoPE` of width ``d_q``, or a
            function of ``d_q`` that builds one (for a RoPE whose width the layer decides, e.g.
            ``functools.partial(YaRNRoPE, scale=4.0, original_len=2048)``, or
            ``partial(RoPE, interpolation=4.0)``: a RoPE carries its own extension), applied to the
            content q/k at their positions.
        ssmax: ``None``, ``True`` (a new :class:`~priorattn.SSMax`) or an ``SSMax`` module.
        causal: key j is visible to query i iff ``pos[j] <= pos[i]``.
        head_dim: value width ``D`` per head, default ``d_model // num_heads``.
        window: sliding-window attention (with RoPE: "local RoPE").
        backend: passed to :func:`priorattn.attention`.
        normalizer: ``"softmax"``, ``"sparsemax"``, ``"entmax15"`` or an entmax ``alpha > 1``, passed
            to :func:`priorattn.attention` (maps other than softmax run on the reference route).
        forget_gate: ``None``, ``True`` (a new :class:`ForgetGate`) or a ``ForgetGate`` module: FoX's
            key-bias part, whose ``-F_j`` joins the logits as :func:`priorattn.attention`'s
            ``key_bias``; the KV cache keeps each key's ``F_j``, so cached decoding equals a full pass.

    When the prior folds into q/k lanes (``prior.can_fold(causal)``) the head keeps its width
    (seed 000 Sec. 4, Algorithm 1): content lanes ``d_q = head_dim - prior.fold_width``, so
    ``[q_c, q_prior]`` spans ``head_dim`` lanes, while values keep the full ``head_dim``. RoPE
    rotates lanes in pairs: if that ``d_q`` is odd, one more lane goes to the prior's subspace (the
    paper's "padded for alignment", a zero lane never built) and ``d_q`` drops by one. A prior that
    does not fold leaves ``d_q = head_dim``. The content scale is ``1 / sqrt(d_q)`` and the prior
    enters unscaled (Eq. 23).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        prior: Prior | None = None,
        encoding: RoPE | Callable[[int], RoPE] | str | None = None,
        ssmax: SSMax | bool | None = None,
        causal: bool = True,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        window: int | None = None,
        backend: str = "auto",
        normalizer: str | float = "softmax",
        forget_gate: ForgetGate | bool | None = None,
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        given_head_dim = head_dim
        head_dim = d_model // num_heads if head_dim is None and num_heads > 0 else head_dim
        sizes = dict(d_model=d_model, num_heads=num_heads, num_kv_heads=num_kv_heads)
        for name, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}: "
                "each key/value head serves a whole group of query heads"
            )
        if not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
        if given_head_dim is None and d_model % num_heads:
            # the default head_dim would silently drop d_model % num_heads lanes of every token
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}: choose another head "
                f"count or give head_dim explicitly"
            )
        check_options(prior, num_heads, window, backend, heads=f"num_heads={num_heads}")
        check_normalizer(normalizer, backend)

        content_dim = head_dim
        if prior is not None and prior.can_fold(causal) and prior.fold_width:
            content_dim = head_dim - prior.fold_width  # seed 000 Algorithm 1: d_c = d_h - d_p
            if encoding is not None and content_dim % 2:
                content_dim -= 1  # one padding lane so RoPE can rotate the content in pairs
            _check_content_lanes(prior, head_dim, content_dim)
        self.rope = layer_rope(encoding, content_dim)
        self.ssmax = _ssmax(ssmax, num_heads)
        self.forget_gate = _forget_gate(forget_gate, d_model, num_heads)

        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim, self.content_dim = head_dim, content_dim
        self.prior, self.causal, self.window, self.backend = prior, causal, window, backend
        self.normalizer = normalizer
        self.q_proj = nn.Linear(d_model, num_heads * content_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * content_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.out_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        doc_ids: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, KVCache]:
        """Attend ``x: (B, L, d_model)`` to itself and to ``cache``; return ``(y, cache)``.

        ``positions``: integer ``(L,)`` or ``(B, L)``; default ``len(cache) + arange(L)``.
        ``doc_ids``: ``(B, L)`` document ids of the new tokens; pass them on every call or on none.
        ``key_padding_mask``: ``(B, L)`` bool, True marks a new token that no query may attend to
        (now or in later calls: the mask is cached). The returned cache includes the new tokens.
        Feeding a sequence in pieces through the cache gives the same outputs as one full pass when
        ``causal`` (without it, earlier pieces cannot see later ones).
        """
        B, L = self._check_input(x, doc_ids, key_padding_mask, cache)
        # Without a cache, default positions are attention's own defaults: passing none lets it know
        # they are a run without reading them back (no host sync, no graph break).
        runs = positions is None and cache is None
        default_positions = positions is None  # a run from the cache's length
        past = 0 if cache is None else len(cache)
        positions = self._positions(positions, B, L, past, x.device)
        H, Hkv, Dq, D = self.num_heads, self.num_kv_heads, self.content_dim, self.head_dim
        q = self.q_proj(x).view(B, L, H, Dq).transpose(1, 2)  # (B, H, L, Dq)
        k = self.k_proj(x).view(B, L, Hkv, Dq).transpose(1, 2)  # (B, Hkv, L, Dq)
        v = self.v_proj(x).view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        if self.rope is not None:  # rotations made once for q and k; a run's read from a table
            if default_positions:
                rotations = self.rope.rotations_of_run(past, L, q.dtype, q.device)
            else:
                rotations = self.rope.rotations(positions, q.dtype)
            q, k = self.rope.rotate(q, rotations), self.rope.rotate(k, rotations)
        gate = self.forget_gate  # the key-bias part: its state of the new keys joins the cache
        key_state = None if gate is None else gate.key_state(x, doc_ids, cache)  # (B, H, L)
        new = KVCache(k, v, positions, doc_ids, key_padding_mask, key_state)
        cache = new if cache is None else cache.extend(new)
        keys = cache.k
        if self.backend == "auto" and is_decode_step(q, keys):
            # auto's decode route runs the CPU flash kernel, which wants one width for q, k and v:
            # the cache keeps its keys padded to the values' width (a view), so only q is padded
            keys = cache.padded_keys()
            q = to_width(q, keys.shape[-1])
        y = attention(
            q,
            keys,
            cache.v,
            prior=self.prior,
            causal=self.causal,
            scale=1.0 / math.sqrt(Dq),  # attention's default, taken before q was padded
            q_pos=None if runs else positions,
            k_pos=None if runs else cache.positions,
            doc_ids=None if doc_ids is None else (doc_ids, cache.doc_ids),
            key_padding_mask=cache.key_padding_mask,
            window=self.window,
            ssmax=self.ssmax,
            backend=self.backend,
            normalizer=self.normalizer,
            key_bias=None if gate is None else gate.key_bias(cache.key_state),
        )  # (B, H, L, D)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, H * D)), cache

    def _check_input(self, x, doc_ids, key_padding_mask, cache) -> tuple[int, int]:
        if not isinstance(x, Tensor) or x.dim() != 3:
            raise ValueError(f"x must be a 3-D tensor (B, L, d_model), got {describe(x)}")
        B, L, d_model = x.shape
        if d_model != self.d_model:
            raise ValueError(f"x has d_model={d_model} but the layer was built for {self.d_model}")
        if doc_ids is not None:
            check_doc_ids("doc_ids", doc_ids, B, L)
        if key_padding_mask is not None:
            check_key_padding_mask(key_padding_mask, B, L)
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
            expected = (B, self.num_kv_heads, len(cache), self.content_dim)
            if tuple(cache.k.shape) != expected:
                got = tuple(cache.k.shape)
                raise ValueError(f"cache keys are {got}, expected (B, Hkv, Lc, d_q) = {expected}")
        return B, L

    @staticmethod
    def _positions(positions: Tensor | None, B: int, L: int, past: int, device) -> Tensor:
        """``(B or 1, L)`` int64 positions of the new tokens."""
        if positions is None:
            return torch.arange(past, past + L, device=device)[None]
        return check_positions("positions", positions, B, L)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"content_dim={self.content_dim}, causal={self.causal}, window={self.window}, "
            f"backend={self.backend!r}, normalizer={self.normalizer!r}"
        )


def _check_content_lanes(prior: Prior, head_dim: int, content_dim: int) -> None:
    """Refuse a fold that leaves no content lanes; warn when content keeps less than half the head."""
    lanes = (
        f"{type(prior).__name__} folds into {prior.fold_width} of the {head_dim} query/key lanes of each head"
    )
    if content_dim < 1:
        raise ValueError(
            f"head_dim={head_dim} leaves no content lanes: {lanes}; use a wider head or a prior "
            "with fewer lanes (GOAT with R frequencies takes 2R + 2)"
        )
    if 2 * content_dim < head_dim:
        warnings.warn(
            f"{lanes}, leaving {content_dim} for the content score (less than half): use a wider "
            "head or fewer GOAT frequencies (R frequencies take 2R + 2 lanes)",
            stacklevel=3,
        )


def layer_rope(encoding: RoPE | Callable[[int], RoPE] | str | None, content_dim: int) -> RoPE | None:
    """The RoPE a layer's ``encoding`` argument names for its ``content_dim`` rotated lanes (see
    :class:`PriorMultiheadAttention`), or ``None``; a one-line error for anything else."""
    if encoding is None:
        return None
    if isinstance(encoding, str):
        if encoding != "rope":
            raise ValueError(f"encoding must be None, 'rope' or a RoPE module, got {encoding!r}")
        return RoPE(content_dim)
    if isinstance(encoding, Sinusoidal):
        raise TypeError("Sinusoidal is added to the token embeddings, not inside attention")
    if callable(encoding) and not isinstance(encoding, nn.Module):
        encoding = encoding(content_dim)  # a RoPE for the content width
    if not isinstance(encoding, RoPE):
        kind = type(encoding).__name__
        raise TypeError(
            f"encoding must be None, 'rope', a RoPE module or a function of the content width giving "
            f"one, got {kind}"
        )
    if encoding.head_dim != content_dim:
        raise ValueError(f"encoding rotates {encoding.head_dim} lanes but q/k have {content_dim}")
    return encoding


def _ssmax(ssmax: SSMax | bool | None, num_heads: int) -> SSMax | None:
    if ssmax is None or ssmax is False:
        return None
    if ssmax is True:
        return SSMax(num_heads)
    if not isinstance(ssmax, SSMax):
        raise TypeError(f"ssmax must be None, True or an SSMax module, got {type(ssmax).__name__}")
    if ssmax.num_heads != num_heads:
        raise ValueError(f"ssmax has {ssmax.num_heads} heads but num_heads={num_heads}")
    return ssmax


def _forget_gate(forget_gate: ForgetGate | bool | None, d_model: int, num_heads: int) -> ForgetGate | None:
    if forget_gate is None or forget_gate is False:
        return None
    if forget_gate is True:
        return ForgetGate(d_model, num_heads)
    if not isinstance(forget_gate, ForgetGate):
        raise TypeError(f"forget_gate must be None, True or a ForgetGate, got {type(forget_gate).__name__}")
    if forget_gate.num_heads != num_heads:
        raise ValueError(f"forget_gate has {forget_gate.num_heads} heads but num_heads={num_heads}")
    return forget_gate


def config_rope(config) -> Callable[[int], RoPE] | None:
    """The RoPE of a ``GPTConfig``'s layers as a function of their content width: RoPE extended by
    ``config.rope_interpolation`` as ``config.rope_scaling`` says, from the training length
    ``config.seq_len`` (:func:`~priorattn.encodings.scaled_rope`); None without a RoPE encoding."""
    if config.encoding not in ("rope", "local_rope"):
        return None
    return partial(
        scaled_rope, config.rope_scaling, factor=config.rope_interpolation, original_len=config.seq_len
    )


def standard_attention(config, prior: Prior | None, forget_gate: bool = False) -> PriorMultiheadAttention:
    """One block's attention for a ``GPTConfig`` with ``attention="standard"``: every head
    dot-product, with the config's RoPE (:func:`config_rope`; ``"local_rope"``'s window is
    ``config.window``), SSMax, grouped key/value heads, window, route and normalizer."""
    return PriorMultiheadAttention(
        config.d_model,
        config.n_heads,
        prior=prior,
        encoding=config_rope(config),
        ssmax=config.ssmax,
        num_kv_heads=config.n_kv_heads,
        head_dim=config.head_dim,
        window=config.window,
        backend=config.backend,
        normalizer=config.normalizer,
        forget_gate=forget_gate,
    )


def fox_attention(config, prior: Prior | None) -> PriorMultiheadAttention:
    """``attention="fox"``: the standard layer with FoX's forget gate in every head (Lin et al. 2025;
    the paper's FoX uses no positional encoding: ``encoding="none"``, while a prior or RoPE still
    combine with it)."""
    return standard_attention(config, prior, forget_gate=True)


register_mechanism("standard", standard_attention)
register_mechanism("fox", fox_attention)
