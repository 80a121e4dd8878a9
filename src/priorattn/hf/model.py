"""Put a prior into a ``transformers`` decoder (:func:`add_prior`), load it again (:func:`from_pretrained`).

The prior becomes a submodule of every attention layer (``model.layers.3.self_attn.prior`` in a
Llama), so its parameters are ordinary model parameters: the model's optimizer trains them,
``save_pretrained`` writes them next to the weights, and what :func:`add_prior` did is recorded in
``config.json`` under ``"priorattn"`` (the prior as its spec), from which :func:`from_pretrained`
re-attaches them. A plain ``AutoModelForCausalLM.from_pretrained`` would build the model without
them (and drop their tensors as unexpected), so ``config.json`` also names an attention
implementation that does not exist, :data:`PLAIN_LOAD_REFUSAL`, which makes that load fail.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from ..functional.api import check_options
from ..models.gpt import PRIOR_INITS
from ..models.legacy import LEGACY_PRIOR_FIELDS, legacy_spec
from ..models.named import prior_of_model
from ..priors import GOAT, Prior, Uniform, build_prior
from ..priors.registry import UnregisteredPrior
from .attention import NAME

CONFIG_KEY = "priorattn"  # where config.json records what add_prior did
#: The ``"attn_implementation"`` that ``config.json`` gives a model with priors. No attention goes by
#: this name (priorattn's own is :data:`~priorattn.hf.NAME`), so ``transformers`` refuses to load the
#: directory by itself, whether ``priorattn.hf`` is imported or not, with an error quoting this
#: string: ``Specified `attn_implementation="priorattn (load ...)"` is not supported``.
PLAIN_LOAD_REFUSAL = "priorattn (load this model with priorattn.hf.from_pretrained)"
#: The priors' tensors in a saved model's weights: ``transformers`` builds the model without priors
#: and would list these as unexpected; :func:`from_pretrained` loads them itself afterwards.
PRIOR_TENSORS = r"\.prior\."
#: A learned GOAT slope below this cannot train: its gradient is ``sigmoid(raw)`` times the loss's,
#: under AdamW's ``eps`` (docs/priors.md, GOAT's starts).
UNTRAINABLE_SLOPE = 1e-8


class FrozenSlopeWarning(UserWarning):
    """A GOAT prior's learned slope starts too small to train (GOAT started ``"uniform"``)."""


class WithoutRotation(nn.Module):
    """A model's rotary embedding turned into the identity: ``cos = 1``, ``sin = 0`` at every position,
    so q and k carry no position and it enters attention only through the prior (NoPE + prior, the
    seeds' setting). The wrapped module keeps its (non-persistent) buffers; checkpoints are unchanged."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        self.rotary = rotary

    def forward(self, x: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        cos, sin = self.rotary(x, *args, **kwargs)  # (B, L, D_rot) each
        return torch.ones_like(cos), torch.zeros_like(sin)


class CachedLM(nn.Module):
    """A ``transformers`` causal LM called as the library's :class:`~priorattn.models.GPT` is, so the
    evaluations (:mod:`priorattn.eval`) score it: ``lm(tokens (B, L), caches=None)`` returns
    ``(logits (B, L, V), None, caches)``. As the GPT's caches, a cache is never changed in place (a
    copy is extended), so several continuations may branch from one prefix."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model
        self.config = model.config.get_text_config()  # vocab_size sizes the scoring chunks

    def forward(self, tokens: Tensor, *, caches: DynamicCache | None = None):
        cache = DynamicCache(config=self.model.config) if caches is None else copy.deepcopy(caches)
        out = self.model(input_ids=tokens, past_key_values=cache, use_cache=True)
        return out.logits, None, out.past_key_values


def add_prior(
    model: PreTrainedModel,
    prior: str | dict | list | Prior = "ggd",
    *,
    remove_rope: bool = False,
    seq_len: int | None = None,
    backend: str = "auto",
    shared_prior: bool = False,
    prior_init: str | None = None,
) -> PreTrainedModel:
    """Attach a prior to every attention layer of ``model`` and switch it to the ``"priorattn"`` attention.

    - ``prior``: a prior spec as ``train --prior`` takes it (:mod:`priorattn.priors.spec`:
      ``"ggd"``, ``"goat(num_freqs=4)+alibi"``, or the dict or list form, or a named model that is
      a prior alone, ``"bam"``), built for the model's query heads; or a
      :class:`~priorattn.priors.Prior` module (copied into each layer).
    - ``shared_prior=True`` puts one prior (one set of parameters) in every layer instead of one per
      layer.
    - ``prior_init``: where a spec's learnable priors start, as ``GPTConfig.prior_init``:
      ``"uniform"`` (the default: standard attention) or ``"alibi"``. A module carries its own.
    - ``remove_rope``: turn the model's rotary embedding into the identity (NoPE + prior); by default
      RoPE stays and the prior adds to it.
    - ``seq_len``: the length the model is (fine-)tuned at, the ``train_len`` a spec's priors take
      (GOAT's sink normalises key positions by it); default ``config.max_position_embeddings``.
    - ``backend``: the route of :func:`priorattn.attention`.

    Returns ``model`` itself, changed in place; ``model.save_pretrained`` then records all of this in
    ``config.json``, the prior as its ``spec()`` (every option), so :func:`from_pretrained` builds
    it again, whether it was given as a spec or as a module of a registered prior; and records
    :data:`PLAIN_LOAD_REFUSAL` as the attention implementation, so a plain
    ``AutoModelForCausalLM.from_pretrained`` of that directory fails instead of losing the priors.
    """
    layers = attention_layers(model)
    if any("prior" in vars(layer) or "prior" in layer._modules for layer in layers):
        raise ValueError(
            f"{type(model).__name__} already has priors: add_prior once per model (load a fresh copy "
            "to change them)"
        )
    text_config = model.config.get_text_config()
    heads = text_config.num_attention_heads
    seq_len = text_config.max_position_embeddings if seq_len is None else seq_len
    if isinstance(prior, Prior):
        if prior_init is not None:
            raise TypeError("prior_init starts a prior built from a spec; a Prior module carries its own")
        priors = _layer_priors(lambda: copy.deepcopy(prior), len(layers), shared_prior)
    else:
        if prior_init is not None and prior_init not in PRIOR_INITS:
            raise ValueError(f"prior_init must be one of {PRIOR_INITS}, got {prior_init!r}")
        init = prior_init or "uniform"
        spec = (isinstance(prior, str) and prior_of_model(prior)) or prior  # "bam" is GGD
        priors = _layer_priors(
            lambda: build_prior(spec, heads, train_len=seq_len, init=init), len(layers), shared_prior
        )
    _warn_of_frozen_slopes(priors[0])
    heads_are = f"the model has {heads} query heads per layer"
    check_options(priors[0], heads, None, backend, heads=heads_are)
    record = dict(prior=None, shared_prior=bool(shared_prior), remove_rope=remove_rope, seq_len=seq_len)
    try:
        record["prior"] = priors[0].spec()
    except UnregisteredPrior:  # it cannot describe itself: from_pretrained needs one given again
        record["prior_module"] = type(priors[0]).__name__
    if not isinstance(prior, Prior):  # a spec's uniform prior is standard attention: no prior at all
        priors = [None if isinstance(p, Uniform) else p for p in priors]
    rotary = _rotary_embeddings(model) if remove_rope else []
    device = next(model.parameters()).device
    for i, (layer, layer_prior) in enumerate(zip(layers, priors)):
        if layer_prior is not None and layer_prior in priors[:i]:
            # A shared prior is registered (so trained and saved) once, in the first layer; transformers
            # refuses to save one tensor under several names it does not know to be tied.
            layer.__dict__["prior"] = layer_prior
        else:
            layer.prior = None if layer_prior is None else layer_prior.to(device)
        layer.prior_backend = backend
    for parent, name, child in rotary:
        setattr(parent, name, WithoutRotation(child))
    model.set_attn_implementation(NAME)
    model.config.priorattn = record | dict(backend=backend)
    # Saved as config.json's "attn_implementation" (the attention itself lives in the config's
    # _attn_implementation, which is not saved): what a plain transformers load reads and refuses.
    model.config.attn_implementation = PLAIN_LOAD_REFUSAL
    return model


def attention_layers(model: PreTrainedModel) -> list[nn.Module]:
    """The modules of ``model`` that call ``transformers.AttentionInterface``: its attention layers.

    Refuses models whose attention does not go through the interface, and encoder (bidirectional)
    attention, naming what to do.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    kind = type(model).__name__
    recorded = getattr(model, "_can_record_outputs", None) or {}
    layer_class = getattr(recorded.get("attentions"), "target_class", recorded.get("attentions"))
    if not model._can_set_attn_implementation() or not isinstance(layer_class, type):
        raise ValueError(
            f"{kind} does not route its attention through transformers.AttentionInterface, so a prior "
            "cannot reach it: use an architecture that does (Llama, Qwen2/3, Mistral, GPT-NeoX; "
            "docs/hf.md lists those tried)"
        )
    layers = [m for m in model.modules() if isinstance(m, layer_class)]
    bidirectional = [m for m in layers if not getattr(m, "is_causal", True)]
    if bidirectional:
        raise ValueError(
            f"{kind} has bidirectional (encoder) attention layers ({type(bidirectional[0]).__name__}): "
            "priorattn.hf supports decoder-only causal models"
        )
    return layers


def _layer_priors(make, n_layers: int, shared: bool | None) -> list[Prior | None]:
    if shared:
        return [make()] * n_layers  # one module: one set of parameters
    return [make() for _ in range(n_layers)]


def _rotary_embeddings(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """``(parent, name, module)`` of every rotary embedding (a class named ``*RotaryEmbedding``)."""
    rotary = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child).__name__.endswith("RotaryEmbedding")
    ]
    if not rotary:
        raise ValueError(
            f"remove_rope=True but {type(model).__name__} has no rotary embedding module (a class "
            "named *RotaryEmbedding): leave remove_rope=False"
        )
    return rotary


def from_pretrained(path: str | Path, prior: Prior | None = None, **kwargs) -> PreTrainedModel:
    """Load a model that :func:`add_prior` changed and ``save_pretrained`` wrote, priors included.

    ``kwargs`` go to ``AutoModelForCausalLM.from_pretrained`` (local files only: nothing downloads).
    The prior is built again from the spec ``config.json`` records and its parameters loaded from
    ``path``. ``prior``: a module to use instead, needed only where the model was given a module of
    an unregistered class (one that cannot describe itself), or saved by a version that recorded
    only the class of a module; pass one built the same way. ``config.json`` files written before
    the prior registry (a name and flattened ``GPTConfig`` fields) load as well.
    """
    path = model_dir(path)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    record = dict(getattr(config, CONFIG_KEY, None) or {})
    if not record:
        raise ValueError(
            f"{path}/config.json has no {CONFIG_KEY!r} entry: it was not saved after priorattn.hf.add_prior "
            "(load it with transformers, then call add_prior)"
        )
    del config.priorattn  # add_prior records it again
    config._attn_implementation = None  # PLAIN_LOAD_REFUSAL, read from config.json; add_prior sets ours
    spec, module = record.pop("prior"), record.pop("prior_module", None)
    if isinstance(spec, str):  # a name, its options flattened beside it (before the prior registry)
        flattened = {key: record.pop(key) for key in LEGACY_PRIOR_FIELDS if key in record}
        spec = legacy_spec(spec, flattened)
    if prior is not None:
        record.pop("prior_init", None)  # a module carries its own start
    elif spec is None:
        raise ValueError(
            f"{path} was saved with a {module} module given to add_prior, which cannot describe itself: "
            f"pass prior= a {module} built the same way (its parameters are loaded from the checkpoint)"
        )
    with _prior_tensors_expected(config):
        model = AutoModelForCausalLM.from_pretrained(path, config=config, local_files_only=True, **kwargs)
    with warnings.catch_warnings():  # the saved slope is loaded below: what it started at is moot
        warnings.simplefilter("ignore", FrozenSlopeWarning)
        add_prior(model, spec if prior is None else prior, **record)
    _load_prior_tensors(model, path)
    return model


@contextlib.contextmanager
def _prior_tensors_expected(config):
    """While ``transformers`` loads a saved model with priors: its load report leaves out the priors'
    tensors, which it would list as UNEXPECTED on every correct reload (they are loaded afterwards,
    and a missing one is an error there). The patterns are a class attribute, which the model copies
    when it is built; the class's own are restored afterwards."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if model_class is None:  # a class outside the mapping (remote code): its report stays as it is
        yield
        return
    own = model_class.__dict__.get("_keys_to_ignore_on_load_unexpected", _ABSENT)
    model_class._keys_to_ignore_on_load_unexpected = [
        *(model_class._keys_to_ignore_on_load_unexpected or []),
        PRIOR_TENSORS,
    ]
    try:
        yield
    finally:
        if own is _ABSENT:
            del model_class._keys_to_ignore_on_load_unexpected
        else:
            model_class._keys_to_ignore_on_load_unexpected = own


_ABSENT = object()


def _warn_of_frozen_slopes(prior: Prior | None) -> None:
    """Warn where a GOAT's learned slope starts where it cannot train (``init="uniform"``, the start a
    spec's GOAT takes from ``prior_init="uniform"``): it would stay a constant 0 however long the
    model is tuned."""
    goats = [m for m in prior.modules() if isinstance(m, GOAT)] if prior is not None else []
    if any(
        g.slope_raw is not None and bool(F.softplus(g.slope_raw.detach()).max() < UNTRAINABLE_SLOPE)
        for g in goats
    ):
        warnings.warn(
            "GOAT's learned recency slope starts at softplus(-30) = 1e-13 (GOAT started 'uniform', as "
            "prior_init='uniform' starts a spec's GOAT) and never trains from there: give "
            "prior_init='alibi' or the spec 'goat(init=seeded)' for a slope that learns, or "
            "'goat(slope=none)' for none (docs/priors.md)",
            FrozenSlopeWarning,
            stacklevel=3,
        )


def model_dir(path: str | Path) -> Path:
    """``path`` as a directory holding a ``config.json``, or a clear error."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no transformers model at {path} (a directory with config.json, as save_pretrained writes): "
            "give a local model directory; nothing is downloaded"
        )
    return path


def _load_prior_tensors(model: nn.Module, path: Path) -> None:
    """Copy the priors' tensors from the safetensors files in ``path``."""
    wanted = {name for name in model.state_dict() if ".prior." in name}
    saved = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            # GOAT's slope m_h, saved as "slope" by earlier versions, loads into "slope_raw"
            saved |= {key: f.get_tensor(key) for key in f.keys() if key in wanted or key + "_raw" in wanted}
    missing = sorted(wanted - set(saved) - {key + "_raw" for key in saved})
    if missing:
        raise ValueError(
            f"{path} holds no tensor for {missing[:3]}: its weights were saved without these priors"
        )
    model.load_state_dict(saved, strict=False)
