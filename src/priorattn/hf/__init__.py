"""Priors inside Hugging Face ``transformers`` decoders (``pip install priorattn[hf]``, transformers 5).

``add_prior(model, "ggd")`` (any prior spec or Prior module) attaches a prior to every attention
layer of a loaded model and switches it to the ``"priorattn"`` attention registered here with
``transformers.AttentionInterface``;
``from_pretrained(dir)`` loads what ``save_pretrained`` wrote, priors included (a plain
``AutoModelForCausalLM.from_pretrained`` of it fails, naming this function); ``extend`` fine-tunes
such a model at a longer length (``python -m priorattn hf-extend``). See docs/hf.md.
"""

try:
    import transformers  # noqa: F401
except ModuleNotFoundError as error:  # pragma: no cover - the message is the point
    raise ModuleNotFoundError(
        "priorattn.hf needs Hugging Face transformers 5: pip install 'priorattn[hf]'"
    ) from error

from .attention import NAME, key_mask, prior_attention, register
from .model import (
    PLAIN_LOAD_REFUSAL,
    CachedLM,
    WithoutRotation,
    add_prior,
    attention_layers,
    from_pretrained,
)

register()

__all__ = [
    "CachedLM",
    "NAME",
    "PLAIN_LOAD_REFUSAL",
    "WithoutRotation",
    "add_prior",
    "attention_layers",
    "from_pretrained",
    "key_mask",
    "prior_attention",
    "register",
]
