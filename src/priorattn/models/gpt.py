"""A decoder-only language model whose attention layers come from the mechanism registry.

Llama-shaped (seed 003 App. C): token embedding, ``n_layers`` pre-norm blocks
``x + attn(norm(x))``, ``x + SwiGLU(norm(x))``, a final RMSNorm and a linear head (optionally tied to
the embedding). Position enters in one of four ways: a prior inside attention (``prior``), RoPE on
q/k (``encoding="rope"``; ``"local_rope"`` adds a sliding ``window``), sinusoids added to the token
embeddings (``encoding="sinusoidal"``), or not at all (NoPE: ``prior="uniform", encoding="none"``).
``token_shift`` adds each token's predecessor's embedding through a learned matrix
(:mod:`priorattn.token_shift`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import priors, registry
from ..checks import describe, is_integer_tensor
from ..data.packing import IGNORE_INDEX
from ..encodings import ROPE_SCALINGS, Sinusoidal
from ..functional import BACKENDS
from ..functional.api import check_normalizer
from ..layers import KVCache
from ..mechanisms import AuxLosses, aux_losses, check_attention_config, legacy_fields, mechanism
from ..mechanisms import decoding as decoding_path
from ..priors import Prior, Uniform
from ..token_shift import LayerCaches, TokenShift
from .legacy import LEGACY_PRIOR_FIELDS, upgraded, with_attention_options
from .named import prior_of_model

PRIOR_INITS = ("uniform", "alibi")


@dataclass
class GPTConfig:
    """Everything that defines a :class:`GPT`; plain data, saved with :meth:`to_dict`.

    - ``vocab_size``, ``d_model``, ``n_layers``, ``n_heads``: the token vocabulary, the residual
      width, the number of blocks and the query heads of each attention layer.
    - ``seq_len``: the training length. Nothing crops to it, but GOAT's sink normalises key positions
      by it (``j / seq_len``), so keep it unchanged when evaluating a trained model at other lengths.
    - ``n_kv_heads``: key/value heads (grouped-query attention), default ``n_heads``.
    - ``head_dim``: value width per head, default ``d_model // n_heads``. A folding prior (ALiBi,
      GOAT) takes its lanes out of each q/k head, not in addition (seed 000 Algorithm 1).
    - ``tie_embeddings``: the output head is the token embedding's matrix (GPT-2's choice; the BAM
      sizes untie it, seed 003 App. C).
    - ``norm_eps``: the epsilon of every RMSNorm.
    - ``dropout``: the dropout rate on the embeddings and on each block's attention and MLP outputs,
      in training only.
    - ``mlp_hidden``: SwiGLU hidden width; ``None`` becomes Llama's ``8/3 d_model`` rounded up to a
      multiple of 64, resolved when the config is made (so a saved config records the width).
    - ``prior``: a prior spec (:mod:`priorattn.priors.spec`): a registered prior's name
      (``priorattn.priors.names()``), with options, or a sum: ``"goat(num_freqs=3, slope=none)+alibi"``,
      or its dict or list form; or a named model that is a prior alone
      (:func:`~priorattn.models.named.prior_of_model`: ``"bam"`` is ``"ggd"``). Kept as its
      canonical string (only the options that differ from the defaults), so equal priors give equal
      configs. A config saved with the flattened fields of
      earlier versions (``goat_freqs``, ``goat_sink``, ``goat_slope``, ``goat_sink_freqs``,
      ``goat_sink_hidden``, ``ggd_trainable``) loads with them as the options of its GOAT and GGD
      (:meth:`from_dict`).
    - ``encoding``: the position encoding, a registered one (:data:`priorattn.encodings.ENCODINGS`);
      ``"local_rope"`` is RoPE with a sliding ``window`` (required).
    - ``window``: the sliding window in keys (required by ``encoding="local_rope"``); with another
      encoding, plain sliding-window attention.
    - ``rope_interpolation``: RoPE's context-extension factor ``s`` (1: none), applied as
      ``rope_scaling`` says. A context extension from length ``L`` to ``L'`` sets it to ``L' / L``.
      Only with ``encoding="rope"`` or ``"local_rope"`` (the window still counts unscaled positions).
    - ``rope_scaling``: how RoPE reaches ``s`` times its training length
      (:func:`priorattn.encodings.scaled_rope`): ``"pi"``, position interpolation (Chen et al., 2023;
      a baseline of seed 003), rotates position ``p`` as ``p / s``; ``"ntk"`` raises RoPE's base to
      ``base s^(D / (D - 2))`` (NTK-aware); ``"yarn"`` is YaRN (Peng et al., 2023): NTK-by-parts
      frequencies over the training length ``seq_len`` and q, k scaled by ``0.1 ln s + 1``. ``"ntk"``
      and ``"yarn"`` take ``s >= 1``; at ``s = 1`` each is plain RoPE. A config saved before the
      field existed loads as ``"pi"``.
    - ``ssmax``: Scalable-Softmax in every layer (:mod:`priorattn.ssmax`).
    - ``shared_prior``: one prior module (one set of parameters) for every layer. ``None`` is the
      papers' choice, which for every prior here is one prior per layer: BAM has "three learnable
      parameters for each attention head in each layer" (seed 003 Sec. 3, 576 for the 120M model in
      App. C), and GOAT replaces each layer's attention (seed 000 Algorithm 1).
    - ``prior_init``: ``None`` (the default) starts each prior as its own default does: GGD as
      standard attention (BAM's best, seed 003 App. F.1), GOAT ``"seeded"`` (its learned slope at the
      ALiBi slopes, as goat-attention's GPTs start: a softplus slope started at 0 never trains);
      ``"uniform"`` starts every learnable prior as standard attention; ``"alibi"`` starts GGD at
      ALiBi and GOAT at its ALiBi-equivalent recency. The model's choice for every part of ``prior``
      (the ``init`` its priors take from the model, :class:`~priorattn.priors.FromModel`); a spec's
      own ``init=`` overrides it for that prior.
    - ``backend``: the attention route of :func:`priorattn.attention` (``"auto"`` picks one per call).
    - ``normalizer``: the map from logits to attention weights in every layer: ``"softmax"``,
      ``"sparsemax"``, ``"entmax15"`` or an entmax ``alpha > 1`` (seed 004 Sec. 4; not softmax runs
      on the reference route).
    - ``attention``: the attention mechanism of every block, a name in the registry
      (:mod:`priorattn.mechanisms`): ``"standard"``, ``"fox"``, or ``"scalar"``, ``"hybrid"`` or
      ``"mixed"`` heads (seed 002).
    - ``attention_options``: the options of ``attention``, an instance of the dataclass its
      mechanism registered (``"scalar"``, ``"hybrid"`` and ``"mixed"``:
      :class:`~priorattn.scalar.ScalarOptions`), given as one or as a dict of some of them (the
      others at their defaults), or ``None`` for all defaults; a mechanism without options takes
      ``None``. Saved nested; a config saved with them flattened (``scalar_heads``, ...) loads
      with them here (:meth:`from_dict`).
    - ``token_shift``: each token embedding ``e_t`` becomes ``e_t + W e_{t-1}`` before anything else
      (sinusoids included), with ``W`` a learned ``d_model x d_model`` matrix starting at zero
      (:class:`~priorattn.token_shift.TokenShift`; RWKV's token shift, Olsson et al. 2022's smeared
      keys): an induction head becomes one attention hop. ``e_{t-1}`` is zero at a sequence's first
      token and at a document's first token in a packed row. A config saved before the field
      existed loads as ``False``.
    """

    vocab_size: int
    seq_len: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    mlp_hidden: int | None = None
    tie_embeddings: bool = True
    prior: str = "uniform"
    encoding: str = "none"
    window: int | None = None
    rope_interpolation: float = 1.0
    rope_scaling: str = "pi"
    ssmax: bool = False
    shared_prior: bool | None = None
    prior_init: str | None = None
    norm_eps: float = 1e-5
    dropout: float = 0.0
    backend: str = "auto"
    normalizer: str | float = "softmax"
    attention: str = "standard"
    attention_options: object | None = None
    token_shift: bool = False

    def __post_init__(self):
        sizes = ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads")
        for name in sizes + ("n_kv_heads", "head_dim", "mlp_hidden", "window"):
            value = getattr(self, name)
            if (value is not None or name in sizes) and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                "choose another head count or give head_dim"
            )
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if isinstance(self.prior, str) and (named := prior_of_model(self.prior)) is not None:
            self.prior = named  # a named model that is a prior alone: "bam"
        try:
            self.prior = priors.canonical_spec(self.prior)
        except ValueError as error:
            raise ValueError(f"prior={self.prior!r}: {error}") from None
        registry.lookup("encoding", self.encoding)
        if self.encoding == "local_rope" and self.window is None:
            raise ValueError("encoding='local_rope' is RoPE with a sliding window: give window=")
        interpolation = self.rope_interpolation
        if isinstance(interpolation, bool) or not isinstance(interpolation, (int, float)):
            raise ValueError(f"rope_interpolation must be a number, got {interpolation!r}")
        if not 0.0 < interpolation < math.inf:
            raise ValueError(f"rope_interpolation must be a finite number > 0, got {interpolation!r}")
        if interpolation != 1.0 and self.encoding not in ("rope", "local_rope"):
            raise ValueError(
                f"rope_interpolation={interpolation!r} interpolates RoPE positions: it needs "
                f"encoding='rope' or 'local_rope', got encoding={self.encoding!r}"
            )
        self.rope_interpolation = float(interpolation)
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(f"rope_scaling must be one of {tuple(ROPE_SCALINGS)}, got {self.rope_scaling!r}")
        if self.rope_scaling != "pi" and self.encoding not in ("rope", "local_rope"):
            raise ValueError(
                f"rope_scaling={self.rope_scaling!r} scales RoPE: it needs encoding='rope' or "
                f"'local_rope', got encoding={self.encoding!r}"
            )
        if self.rope_scaling != "pi" and interpolation < 1.0:
            raise ValueError(
                f"rope_scaling={self.rope_scaling!r} extends the context: rope_interpolation must be "
                f">= 1, got {interpolation!r}"
            )
        if self.encoding == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal encoding needs an even d_model, got {self.d_model}")
        if self.prior_init is not None and self.prior_init not in PRIOR_INITS:
            raise ValueError(f"prior_init must be one of {PRIOR_INITS}, got {self.prior_init!r}")
        if not isinstance(self.token_shift, bool):
            raise ValueError(f"token_shift must be True or False, got {self.token_shift!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not isinstance(self.normalizer, str | int | float) or isinstance(self.normalizer, bool):
            raise ValueError(f"normalizer must be a name or an entmax alpha, got {self.normalizer!r}")
        check_normalizer(self.normalizer, self.backend)
        if self.mlp_hidden is None:
            self.mlp_hidden = 64 * math.ceil(8 * self.d_model / 3 / 64)  # Llama's SwiGLU width
        self.shared_prior = bool(self.shared_prior)  # None: one prior per layer, as both papers
        check_attention_config(self)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GPTConfig:
        """The config :meth:`to_dict` gave, or one saved by an earlier version: fields added since
        take their defaults, the flattened prior fields become the options of ``prior``, and the
        flattened options of a mechanism (``scalar_heads``) its ``attention_options``
        (:func:`~priorattn.models.legacy.with_attention_options`)."""
        legacy = set(LEGACY_PRIOR_FIELDS) | set(legacy_fields())
        unknown = set(data) - {f.name for f in fields(cls)} - legacy
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {sorted(unknown)}")
        return cls(**with_attention_options(upgraded(data)))


def build_prior(config: GPTConfig) -> Prior | None:
    """One attention layer's prior: ``config.prior`` built for the layer's prior heads, with the
    model's training length (``seq_len``) and start (``prior_init``) as its context
    (:func:`priorattn.priors.build_prior`); ``None`` for uniform (standard attention)."""
    prior = priors.build_prior(
        config.prior, prior_heads(config), train_len=config.seq_len, init=config.prior_init
    )
    return None if isinstance(prior, Uniform) else prior


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer, 2020)."""

    def __init__(self, d_model: int, hidden: int, dropout: float):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(F.silu(self.gate(x)) * self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: GPTConfig, prior: Prior | None):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = mechanism(config.attention).build(config, prior)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = SwiGLU(config.d_model, config.mlp_hidden, config.dropout)

    def forward(self, x: Tensor, positions: Tensor | None, doc_ids: Tensor | None, cache: KVCache | None):
        y, cache = self.attn(self.attn_norm(x), positions=positions, doc_ids=doc_ids, cache=cache)
        x = x + self.attn_dropout(y)
        x = x + self.mlp(self.mlp_norm(x))
        return x, cache


class GPT(nn.Module):
    """Decoder-only LM: ``tokens (B, L) -> logits (B, L, V)``, with a KV cache per layer."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.token_shift = TokenShift(config.d_model) if config.token_shift else None
        self.sinusoidal = Sinusoidal(config.d_model) if config.encoding == "sinusoidal" else None
        self.dropout = nn.Dropout(config.dropout)
        if config.shared_prior:
            priors = [build_prior(config)] * config.n_layers  # one module: one set of parameters
        else:
            priors = [build_prior(config) for _ in range(config.n_layers)]
        self.blocks = nn.ModuleList(Block(config, prior) for prior in priors)
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """nanoGPT's init: N(0, 0.02), residual projections scaled by ``1/sqrt(2 n_layers)``.

        The projections are those of every module inside a block's attention that has ``q_proj``,
        ``k_proj``, ``v_proj`` and ``out_proj`` (a mixed layer's dot-product and scalar heads, in
        that order). Priors and SSMax keep their own init (uniform prior, zero sink output,
        ``s = 1``), and so does the token shift (``W = 0``).
        """
        std = 0.02
        nn.init.normal_(self.embed.weight, std=std)
        if not self.config.tie_embeddings:
            nn.init.normal_(self.head.weight, std=std)
        for block in self.blocks:
            attns, mlp = [m for m in block.attn.modules() if _has_projections(m)], block.mlp
            for linear in (*(p for a in attns for p in (a.q_proj, a.k_proj, a.v_proj)), mlp.gate, mlp.up):
                nn.init.normal_(linear.weight, std=std)
            for linear in (*(a.out_proj for a in attns), mlp.down):  # each adds to the residual stream
                nn.init.normal_(linear.weight, std=std / math.sqrt(2 * self.config.n_layers))

    def aux_losses(self) -> AuxLosses:
        """The auxiliary losses this model adds to its training loss, weighed and scheduled by its
        ``attention_options``: those of every package registered in :mod:`priorattn.mechanisms`
        (scalar heads' regularizers, seed 002)."""
        return aux_losses(self)

    @property
    def reads_absolute_positions(self) -> bool:
        """Whether outputs depend on token positions beyond their differences: a sinusoidal encoding
        or a prior with an absolute term (GOAT's sink ``u(j)``). RoPE and relative priors do not."""
        priors = [block.attn.prior for block in self.blocks if block.attn.prior is not None]
        return self.sinusoidal is not None or not all(prior.is_relative for prior in priors)

    def forward(
        self,
        tokens: Tensor,
        *,
        positions: Tensor | None = None,
        doc_ids: Tensor | None = None,
        targets: Tensor | None = None,
        caches: LayerCaches | list[KVCache] | None = None,
        reduction: str = "mean",
    ) -> tuple[Tensor, Tensor | None, LayerCaches]:
        """Logits ``(B, L, V)`` for ``tokens: (B, L)``, the loss if ``targets`` is given, the caches.

        ``positions``: ``(L,)`` or ``(B, L)``, default ``past + arange(L)`` with ``past`` the cached
        length. ``doc_ids``: ``(B, L)`` document of each token (packed sequences; pass on every call
        or none). ``targets``: ``(B, L)`` next tokens, ``-100`` where no loss is taken.
        ``reduction="mean"``: the loss is their mean cross-entropy; ``"none"``: the loss of every
        token, ``(B, L)`` in nats (0 where the target is ``-100``), for evaluation and analysis.
        Either is computed in at least float32. ``caches``: the :class:`LayerCaches` of an earlier
        call (one :class:`KVCache` per layer; a plain list of them without ``token_shift``); the
        returned caches include these tokens and, with ``token_shift``, the last one's embedding.
        """
        B, L = self._check_input(tokens, targets, caches)
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        past = 0 if caches is None else len(caches[0])
        given = positions  # None lets each layer use (and know) its default run of positions
        if positions is None:
            positions = torch.arange(past, past + L, device=tokens.device)  # (L,)
        x = self.embed(tokens)  # (B, L, d_model)
        shift = None
        if self.token_shift is not None:
            x, shift = self.token_shift(x, doc_ids, None if caches is None else caches.shift)
        if self.sinusoidal is not None:
            # Vaswani et al. Sec. 3.4: embeddings times sqrt(d_model), so the unit-amplitude
            # sinusoids do not drown the token identity (embeddings start at std 0.02).
            x = x * math.sqrt(self.config.d_model) + self.sinusoidal(positions, dtype=x.dtype)
        x = self.dropout(x)
        new_caches = LayerCaches(shift=shift)
        for i, block in enumerate(self.blocks):
            x, cache = block(x, given, doc_ids, None if caches is None else caches[i])
            new_caches.append(cache)
        logits = self.head(self.norm(x))  # (B, L, V)
        loss = None
        if targets is not None:
            loss = token_cross_entropy(logits, targets)  # (B, L)
            if reduction == "mean":
                loss = loss.sum() / (targets != IGNORE_INDEX).sum()
        return logits, loss, new_caches

    def _check_input(self, tokens, targets, caches) -> tuple[int, int]:
        if not is_integer_tensor(tokens) or tokens.dim() != 2:
            raise ValueError(f"tokens must be an integer tensor (B, L), got {describe(tokens)}")
        if targets is not None and (not is_integer_tensor(targets) or targets.shape != tokens.shape):
            shape = tuple(tokens.shape)
            raise ValueError(f"targets must be an integer tensor of shape {shape}, got {describe(targets)}")
        if caches is not None and (not isinstance(caches, list | tuple) or len(caches) != len(self.blocks)):
            got = len(caches) if isinstance(caches, list | tuple) else type(caches).__name__
            raise ValueError(
                f"caches must be a list of {len(self.blocks)} KVCache (one per layer), got {got}"
            )
        if caches is not None and self.token_shift is not None and getattr(caches, "shift", None) is None:
            raise ValueError(
                "caches carry no token-shift state (token_shift=True): pass back the LayerCaches "
                "that GPT.forward returned"
            )
        return tokens.shape

    @torch.no_grad()
    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        decoding: str | None = None,
        decoding_options: Mapping | object | None = None,
    ) -> Tensor:
        """Extend ``tokens: (B, L)`` by ``max_new_tokens``: ``(B, L + max_new_tokens)``.

        The prompt is prefilled once, then each step feeds one token through the KV caches. Nothing
        is cropped to ``seq_len``: priors and encodings are defined at every position, so prompts and
        generations may run past the training length (how well the model extrapolates is the
        experiment, not a limit here). Call ``model.eval()`` first if ``dropout > 0``.

        ``decoding``: ``None`` decodes through the layers' own caches; else the name of a decoding
        a mechanism package registered (:func:`priorattn.mechanisms.register_decoding`), whose path
        replaces the caches after the prefill, with ``decoding_options`` its options (an instance
        of its options class, or a dict of them). ``"sorted"``, options
        :class:`priorattn.scalar.SortedDecoding` (``window`` required): scalar heads read a cache
        sorted by scalar key and attend over the ``window`` keys nearest each query (seed 002
        "Binary Search at Inference", :func:`priorattn.scalar.model.sorted_caches`; one sequence,
        B = 1). Scalar heads whose tau is length-scaled (the option ``tau_length_scaling``, set by
        :func:`priorattn.scalar.model.set_tau_length_scaling`) apply it in both caches alike.
        """
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0 (or use greedy=True), got {temperature!r}")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
        if decoding is None and decoding_options is not None:
            raise ValueError("decoding_options are the options of a decoding: name it with decoding=")
        path = None if decoding is None else decoding_path(decoding, decoding_options)
        logits, _, caches = self(tokens)  # prefill: (B, L, V)
        if path is not None:
            entry, options = path
            caches = entry.caches(self, caches, options)
        for step in range(max_new_tokens):
            if greedy:
                next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                next_token = sample(logits[:, -1] / temperature, top_k, generator)  # (B, 1)
            tokens = torch.cat([tokens, next_token], dim=1)
            if step + 1 < max_new_tokens:
                logits, _, caches = self(next_token, caches=caches)  # (B, 1, V)
        return tokens

    def num_parameters(self, embedding: bool = True) -> int:
        """Parameters, each counted once (a tied head or a shared prior is one set).

        ``embedding=False`` leaves out the token embedding (an untied head stays counted, as in
        seed 003 App. C's "Parameters transformer").
        """
        total = sum(p.numel() for p in self.parameters())
        return total if embedding else total - self.embed.weight.numel()


def prior_heads(config: GPTConfig) -> int:
    """How many heads of a layer its prior serves, as the config's attention mechanism says."""
    return mechanism(config.attention).prior_heads(config)


def _has_projections(module: nn.Module) -> bool:
    return all(hasattr(module, name) for name in ("q_proj", "k_proj", "v_proj", "out_proj"))


def token_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of each target ``(B, L)`` under ``logits: (B, L, V)``, in nats, 0 where the
    target is ``IGNORE_INDEX``; bfloat16 logits are widened first (in bfloat16 a loss near 2 keeps
    only two decimals)."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(wide.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")


def sample(logits: Tensor, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """One token per row of ``logits: (B, V)``, from the softmax restricted to the ``top_k`` largest."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)  # (B, 1)
