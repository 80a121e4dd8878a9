"""The configs a run trains with, from the fields a caller gives: a fresh run's, a resumed run's
(the fields not given are the run's), or a context extension's (the model is the earlier run's)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..data import vocab_size_of
from ..models import GPTConfig
from ..models import preset as preset_config
from .config import TrainConfig
from .runs import CONFIG_JSON, read_run_configs

#: The fields a context extension takes from the earlier run unless given: it trains on the
#: same data, split and tokenized the same way.
SAME_DATA = ("data", "text_encoding", "tokenizer", "vocab_size", "val_fraction")
#: The model fields a context extension may replace: RoPE's factor and how it applies it.
EXTENSION_FIELDS = ("rope_interpolation", "rope_scaling")
#: The model preset of a fresh run that names none.
DEFAULT_PRESET = "tiny"


def resolve_configs(
    run_dir: str | Path,
    model: Mapping | None = None,
    train: Mapping | None = None,
    *,
    preset: str | None = None,
    resume: bool = False,
) -> tuple[GPTConfig, TrainConfig]:
    """``(GPTConfig, TrainConfig)`` of a run in ``run_dir`` from the fields given in ``model`` and
    ``train`` (the others keep their defaults), as :func:`priorattn.train.train` then takes them:

    - ``resume=True`` where ``run_dir`` holds a run: the run's configs with the given fields
      replaced, and of given ``attention_options`` those they name (``train`` then refuses a field
      that differs from the run's, except a raised ``steps``). With ``preset``, the model is built
      as for a fresh run instead.
    - ``train["init_from"]``, a run directory: a context extension. The model is that run's, with
      only :data:`EXTENSION_FIELDS` replaceable (to extend RoPE to the longer context); no other
      ``model`` field and no ``preset`` may be given. The data fields (:data:`SAME_DATA`) are that
      run's unless given.
    - else a fresh run: ``TrainConfig(**train)``, and the model preset ``preset`` (default
      :data:`DEFAULT_PRESET`)
      with the ``model`` fields, its ``vocab_size`` the tokenizer's and its ``seq_len`` the
      training length where ``train`` gives one (a ``model`` field of the same name wins).
    """
    model, train = dict(model or {}), dict(train or {})
    saved_path = Path(run_dir) / CONFIG_JSON
    if resume and saved_path.is_file():  # what is not given is the run's
        saved = read_run_configs(saved_path)
        config = TrainConfig.from_dict(saved["train"] | train)
        if preset is None:
            return GPTConfig.from_dict(with_given(saved["model"], model)), config
    elif train.get("init_from") is not None:
        return extension_configs(Path(train["init_from"]), model, train, preset)
    else:
        config = TrainConfig(**train)
    sizes = dict(vocab_size=vocab_size_of(config.tokenizer, config.vocab_size))
    if config.seq_len is not None:
        sizes["seq_len"] = config.seq_len
    return preset_config(preset or DEFAULT_PRESET, **sizes | model), config


def with_given(saved: dict, model: dict) -> dict:
    """A saved model config with the ``model`` fields given replacing its own; given
    ``attention_options`` replace only the options they name."""
    merged = saved | model
    if isinstance(model.get("attention_options"), Mapping):
        merged["attention_options"] = dict(saved.get("attention_options") or {}) | model["attention_options"]
    return merged


def extension_configs(
    earlier_dir: Path, model: dict, train: dict, preset: str | None
) -> tuple[GPTConfig, TrainConfig]:
    """The configs of a run continuing the run in ``earlier_dir``: its model (:data:`EXTENSION_FIELDS`
    replaceable) on its data (:data:`SAME_DATA`, unless given in ``train``)."""
    extension = {name: model.pop(name, None) for name in EXTENSION_FIELDS}
    if model or preset is not None:
        names = ", ".join(f"{name}=" for name in model) or "preset="
        allowed = " and ".join(f"{name}=" for name in EXTENSION_FIELDS)
        raise ValueError(
            f"{names} cannot be combined with init_from= (the model is that run's; only {allowed} may change)"
        )
    earlier = read_run_configs(earlier_dir / CONFIG_JSON)
    # RoPE extended to the longer context
    earlier["model"].update({name: value for name, value in extension.items() if value is not None})
    earlier_config = TrainConfig.from_dict(earlier["train"])
    same_data = {name: getattr(earlier_config, name) for name in SAME_DATA}
    return GPTConfig.from_dict(earlier["model"]), TrainConfig(**same_data | train)
