"""Put a prior into a ``transformers`` decoder (:func:`add_prior`), load it again (:func:`from_pretrained`).

The prior becomes a submodule of every attention layer (``model.layers.3.self_attn.prior`` in a
Llama), so its parameters are ordinary model parameters: the model's optimizer trains them,
``save_pretrained`` writes them next to the weights, and what :func:`add_prior` did is recorded in
``config.json`` under ``"priorattn"``, from which :func:`from_pretrained` re-attaches them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedModel

from ..functional.api import check_options
from ..models.gpt import GPTConfig, build_prior
from ..priors import Prior
from .attention import NAME

#: The GPTConfig fields that describe a prior beyond its name, as ``train`` takes them.
PRIOR_OPTIONS = (
    "shared_prior",
    "prior_init",
    "ggd_trainable",
    "goat_freqs",
    "goat_sink",
    "goat_slope",
    "goat_sink_freqs",
    "goat_sink_hidden",
)
CONFIG_KEY = "priorattn"  # where config.json records what add_prior did


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
    prior: str | Prior = "ggd",
    *,
    remove_rope: bool = False,
    seq_len: int | None = None,
    backend: str = "auto",
    **options,
) -> PreTrainedModel:
    """Attach a prior to every attention layer of ``model`` and switch it to the ``"priorattn"`` attention.

    - ``prior``: a name as ``train --prior`` takes it (``"uniform"``, ``"alibi"``, ``"ggd"``,
      ``"goat"`` or a sum such as ``"alibi+goat"``), built for the model's query heads, or a
      :class:`~priorattn.priors.Prior` module (copied into each layer).
    - ``options``: the prior's :class:`~priorattn.models.GPTConfig` fields (:data:`PRIOR_OPTIONS`):
      ``shared_prior=True`` puts one prior (one set of parameters) in every layer instead of one per
      layer; ``prior_init``, ``ggd_trainable`` and ``goat_*`` configure a named prior.
    - ``remove_rope``: turn the model's rotary embedding into the identity (NoPE + prior); by default
      RoPE stays and the prior adds to it.
    - ``seq_len``: the length the model is (fine-)tuned at, which GOAT's sink normalises key
      positions by; default ``config.max_position_embeddings``.
    - ``backend``: the route of :func:`priorattn.attention`.

    Returns ``model`` itself, changed in place; ``model.save_pretrained`` then records all of this.
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
    unknown = sorted(set(options) - set(PRIOR_OPTIONS))
    if unknown:
        raise TypeError(f"add_prior got unknown options {unknown}: the prior's options are {PRIOR_OPTIONS}")
    if isinstance(prior, str):
        config = GPTConfig(
            vocab_size=text_config.vocab_size,
            seq_len=seq_len,
            d_model=text_config.hidden_size,
            n_layers=len(layers),
            n_heads=heads,
            head_dim=text_config.hidden_size // heads,
            prior=prior,
            backend=backend,
            **options,
        )
        priors = _layer_priors(lambda: build_prior(config), len(layers), config.shared_prior)
    else:
        if set(options) - {"shared_prior"}:
            raise TypeError(
                f"options {sorted(options)} configure a named prior; a Prior module carries its own"
            )
        check_options(prior, heads, None, backend, heads=f"the model has {heads} query heads per layer")
        priors = _layer_priors(lambda: copy.deepcopy(prior), len(layers), options.get("shared_prior"))
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
    name = prior if isinstance(prior, str) else None
    model.config.priorattn = dict(
        prior=name,
        prior_module=None if name else type(prior).__name__,
        remove_rope=remove_rope,
        seq_len=seq_len,
        backend=backend,
        **options,
    )
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
    ``prior``: needed only if the model was given a Prior module rather than a name; pass one built
    the same way (its parameters are then loaded from ``path``).
    """
    path = model_dir(path)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    spec = dict(getattr(config, CONFIG_KEY, None) or {})
    if not spec:
        raise ValueError(
            f"{path}/config.json has no {CONFIG_KEY!r} entry: it was not saved after priorattn.hf.add_prior "
            "(load it with transformers, then call add_prior)"
        )
    del config.priorattn  # add_prior records it again
    name, module = spec.pop("prior"), spec.pop("prior_module")
    if name is None and not isinstance(prior, Prior):
        raise ValueError(
            f"{path} was saved with a {module} module given to add_prior: pass prior= a {module} built "
            "the same way (its parameters are loaded from the checkpoint)"
        )
    model = AutoModelForCausalLM.from_pretrained(path, config=config, local_files_only=True, **kwargs)
    add_prior(model, name or prior, **spec)
    _load_prior_tensors(model, path)
    return model


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
            saved |= {key: f.get_tensor(key) for key in f.keys() if key in wanted}
    missing = sorted(wanted - set(saved))
    if missing:
        raise ValueError(
            f"{path} holds no tensor for {missing[:3]}: its weights were saved without these priors"
        )
    model.load_state_dict(saved, strict=False)
