"""The ``"priorattn"`` attention of a ``transformers`` model: ``priorattn.attention`` with the layer's prior.

A ``transformers`` attention layer projects q, k, v, applies its RoPE, updates its KV cache and then
calls the function registered under ``config._attn_implementation`` in ``AttentionInterface``
(``module, query (B, H, Lq, D), key / value (B, Hkv, Lk, D), attention_mask, scaling=...,
position_ids=..., sliding_window=...``). This module registers two functions under ``"priorattn"``:

- :func:`key_mask`, in ``AttentionMaskInterface``: what the model builds as its ``attention_mask``.
  Masks of ``priorattn.attention`` are defined on positions (causal keeps ``k_pos <= q_pos``), so
  the only thing the model must hand down is which keys are padding: the 2-D padding mask cut to
  the keys of this layer, ``(B, Lk)`` True at real tokens, or None when nothing is padding. No
  ``(Lq, Lk)`` mask is ever built.
- :func:`prior_attention`, in ``AttentionInterface``: finds the positions of queries and keys,
  the documents of a packed batch and the padding, and calls ``priorattn.attention``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, find_packed_sequence_indices

from ..checks import describe
from ..functional import attention
from ..functional.masks import values_are_free

#: The name priorattn's attention is registered under in ``transformers.AttentionInterface``: the
#: ``attn_implementation`` of a model after :func:`~priorattn.hf.add_prior`.
NAME = "priorattn"


def key_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    attention_mask: Tensor | None = None,
    **kwargs,
) -> Tensor | None:
    """The model's mask for the ``"priorattn"`` attention: ``(B, Lk)`` bool, True at the real
    tokens among this layer's keys, or None when no key is padding.

    ``attention_mask`` is the 2-D padding mask of everything seen so far (``(B, kv_offset + Lk)``,
    1 at real tokens); a sliding-window cache keeps only its last ``Lk`` keys (``kv_offset > 0``).
    The keys must end at the queries, as in a ``DynamicCache`` (``generate``'s default): a cache
    with room after them (``StaticCache``) is refused.
    """
    if kv_offset + kv_length != q_offset + q_length:
        raise ValueError(
            f"the cache holds {kv_length} key slots from {kv_offset} but the queries end at "
            f"{q_offset + q_length}: priorattn's attention needs keys that end at the queries, as in "
            "a DynamicCache (generate's default); use cache_implementation='dynamic', not 'static'"
        )
    if attention_mask is None:
        return None
    mask = attention_mask[:, kv_offset : kv_offset + kv_length].bool()  # (B, Lk)
    if values_are_free(mask) and bool(mask.all()):
        return None  # no padding: keeps the mask-free kernels of the routes
    return mask


def prior_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: Tensor | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """``priorattn.attention`` of ``query (B, H, Lq, D)`` over ``key``/``value (B, Hkv, Lk, D)``
    with ``module.prior``; returns ``(B, Lq, H, D)`` and no attention weights.

    Positions: queries are at ``position_ids``; without cached keys (``Lk == Lq``) the keys are the
    queries, with them the keys are the ``Lk`` consecutive positions ending at the last query, as
    in a ``DynamicCache`` (left padding only adds masked keys before the real ones). As the
    model's own masks, a batch without ``attention_mask`` whose positions restart is packed: each
    restart begins a document. ``sliding_window`` becomes ``window`` (keys with ``q - k < window``).
    """
    if not hasattr(module, "prior"):
        raise ValueError(
            f"{type(module).__name__} has no prior: load a saved priorattn model with "
            "priorattn.hf.from_pretrained, and call priorattn.hf.add_prior(model) instead of setting "
            f"attn_implementation={NAME!r} by hand (models built from one config object share it, and "
            "with it the attention add_prior sets: build each from its own config)"
        )
    _refuse_unsupported(dropout, kwargs)
    B, H, Lq, _ = query.shape
    Lk = key.shape[2]
    q_pos = _query_positions(position_ids, B, Lq)  # (B or 1, Lq)
    if Lk == Lq:
        k_pos = q_pos
    else:  # cached keys: the positions just before the first query
        k_pos = q_pos[:, -1:] - (Lk - 1) + torch.arange(Lk, device=q_pos.device)  # (B or 1, Lk)
    doc_ids = None
    if attention_mask is None and Lk == Lq and Lq > 1:
        doc_ids = find_packed_sequence_indices(q_pos.expand(B, Lq))  # (B, L) or None
    out = attention(
        query,
        key,
        value,
        prior=module.prior,
        causal=module.is_causal if is_causal is None else is_causal,
        scale=scaling,
        q_pos=q_pos,
        k_pos=k_pos,
        doc_ids=doc_ids,
        key_padding_mask=_key_padding(attention_mask, B, Lk),
        window=sliding_window,
        backend=module.prior_backend,
    )  # (B, H, Lq, D)
    return out.transpose(1, 2).contiguous(), None


def _refuse_unsupported(dropout: float, kwargs: dict) -> None:
    if dropout:
        raise ValueError(
            f"attention dropout {dropout} is not supported by priorattn's attention: set "
            "config.attention_dropout = 0.0"
        )
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"this model passes {name}= to its attention, which priorattn's attention does not "
                "implement: the architecture is not supported (see docs/hf.md)"
            )


def _query_positions(position_ids: Tensor | None, B: int, Lq: int) -> Tensor:
    if position_ids is None:
        raise ValueError(
            "the model passed no position_ids to its attention function: priorattn's attention places "
            "the prior by position, so the architecture must forward position_ids (Llama, Qwen2/3, "
            "Mistral and GPT-NeoX do; see docs/hf.md)"
        )
    if position_ids.dim() != 2 or position_ids.shape[-1] != Lq or position_ids.shape[0] not in (1, B):
        raise ValueError(
            f"position_ids must be (B, L) = ({B}, {Lq}) or (1, {Lq}), got {describe(position_ids)} "
            "(multi-axis positions such as M-RoPE's are not supported)"
        )
    return position_ids.long()


def _key_padding(attention_mask: Tensor | None, B: int, Lk: int) -> Tensor | None:
    """``(B, Lk)`` True at padding keys, from :func:`key_mask`'s output."""
    if attention_mask is None:
        return None
    if attention_mask.shape != (B, Lk):
        raise ValueError(
            f"priorattn's attention takes the (B, Lk) = ({B}, {Lk}) padding mask its mask function "
            f"builds, got attention_mask {describe(attention_mask)}: pass a 2-D attention_mask "
            "(1 at real tokens) to the model, not a 4-D mask"
        )
    return ~attention_mask.bool()


def register() -> None:
    """Make ``attn_implementation="priorattn"`` known to every ``transformers`` model."""
    AttentionInterface.register(NAME, prior_attention)
    AttentionMaskInterface.register(NAME, key_mask)
