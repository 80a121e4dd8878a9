"""A run directory: its configs, its metrics, and loading the model it trained.

``config.json`` holds the model and training configs, ``metrics.jsonl`` one JSON object per logged
step, ``data.json`` and the tokenizer what :func:`priorattn.data.prepare_data` used, and the
checkpoints the latest weights (:mod:`priorattn.train.checkpoint`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..data import Tokenizer, load_tokenizer, read_data_record
from ..files import as_saved, prepare_out, read_json, write_atomic
from ..models import GPT, GPTConfig, build_prior
from ..models.legacy import run_with_attention_options
from ..priors import read_spec, registered
from . import checkpoint as ckpt
from .config import TrainConfig

CONFIG_JSON = "config.json"
METRICS_JSONL = "metrics.jsonl"


@dataclass
class TrainedRun:
    """A run's model (in eval mode, at its checkpoint's weights), tokenizer and configs."""

    model: GPT
    tokenizer: Tokenizer
    model_config: GPTConfig
    train_config: TrainConfig
    step: int


def read_run_configs(path: Path) -> dict:
    """A run's ``config.json``: ``{"model": {GPTConfig fields}, "train": {TrainConfig fields}}``; a
    file of another structure is a ValueError naming it and what it should hold, where a reader
    would fail on it with a bare TypeError or KeyError."""
    configs = read_json(path)
    shape = '{"model": {GPTConfig fields}, "train": {TrainConfig fields}}'
    if not isinstance(configs, dict):
        raise ValueError(
            f"{path} holds a JSON {type(configs).__name__}, not a run's configs: it should be {shape}"
        )
    for part in ("model", "train"):
        if not isinstance(configs.get(part), dict):
            found = "nothing" if part not in configs else f"a JSON {type(configs[part]).__name__}"
            raise ValueError(f"{path} holds {found} under {part!r}: a run's config.json is {shape}")
    return run_with_attention_options(configs)


def configs_of(configs: dict, path: Path) -> tuple[GPTConfig, TrainConfig]:
    """The configs ``path`` held (:func:`read_run_configs`); a required field missing or a value of the
    wrong type is a ValueError naming the file."""
    try:
        return GPTConfig.from_dict(configs["model"]), TrainConfig.from_dict(configs["train"])
    except TypeError as error:  # a field missing, or a value its config cannot compare or size
        raise ValueError(f"{path} holds no valid run configs: {error}") from None


def load_run(run_dir: str | Path) -> TrainedRun:
    """The trained model of ``run_dir`` with its tokenizer, ready for ``model.generate``."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_JSON
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} holds no run ({CONFIG_JSON} is missing)")
    model_config, train_config = configs_of(read_run_configs(path), path)
    step, tensors, state = ckpt.load_checkpoint(run_dir)
    model = GPT(model_config)
    ckpt.load_module(model, tensors, state["model_aliases"], "model.")
    tokenizer = load_tokenizer(read_data_record(run_dir)["tokenizer"], run_dir)
    return TrainedRun(model.eval(), tokenizer, model_config, train_config, step)


def export_run(run_dir: str | Path, out: str | Path) -> Path:
    """Copy the run in ``run_dir`` to ``out`` with its newest intact checkpoint as one safetensors
    file (the usual checkpoint, :func:`~priorattn.train.checkpoint.save_checkpoint`): an FSDP run's
    shards put together, for tools that read one file. The run's other files (configs, data record,
    tokenizer, metrics) are copied as they are; ``out`` must hold no run. Returns the tensor file."""
    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / CONFIG_JSON).exists():
        raise FileNotFoundError(f"{run_dir} holds no run ({CONFIG_JSON} is missing)")
    if out.resolve() == run_dir.resolve():
        raise ValueError(f"out={str(out)!r} is the run itself: export to another directory")
    if out.exists() and ckpt.has_checkpoint(out):
        raise FileExistsError(f"{out} already holds a run: export to another directory")
    step, tensors, state = ckpt.load_checkpoint(run_dir)
    prepare_out(out)
    for path in run_dir.iterdir():  # the run's files; its checkpoints are written anew below
        if path.is_file() and not path.name.startswith(("checkpoint", ".")):
            shutil.copy2(path, out / path.name)
    return ckpt.save_checkpoint(out, step, tensors, state, keep=1)


def run_configs(model_config: GPTConfig, config: TrainConfig) -> dict:
    return as_saved(dict(model=model_config.to_dict(), train=config.to_dict()))


def saved_configs(configs: dict) -> dict:
    """Configs read from a run, with fields added to the library since it was written at their
    defaults, so a run from an earlier version still resumes."""
    configs = run_with_attention_options(configs)
    return run_configs(GPTConfig.from_dict(configs["model"]), TrainConfig.from_dict(configs["train"]))


def check_run_dir(run_dir: Path, model_config: GPTConfig, config: TrainConfig, continuing: bool) -> None:
    """A new run needs a directory without a checkpoint (a run that failed before its first one
    starts again in place); a continued one the configs it started with."""
    saved_path = run_dir / CONFIG_JSON
    prepare_out(run_dir)  # created if missing; a file there is refused
    if not continuing:
        if ckpt.has_checkpoint(run_dir):
            raise FileExistsError(
                f"{run_dir} already holds a run: pass resume=True to continue it, or choose another directory"
            )
        return
    differences = config_differences(read_json(saved_path), run_configs(model_config, config))
    if differences:
        raise OtherSettings(
            f"resume=True needs the arguments {run_dir} was started with (see {saved_path}; only "
            "steps may be raised); differences: " + "; ".join(differences),
            differences,
        )


class OtherSettings(ValueError):
    """A run directory holds a run started with other configs than those given to continue it;
    ``differences`` names each field (``"model.prior: run has 'ggd', given 'goat'"``)."""

    def __init__(self, message: str, differences: list[str]):
        super().__init__(message)
        self.differences = differences


def config_differences(saved: dict, given: dict) -> list[str]:
    """How ``given`` configs differ from a run's ``saved`` ones; ``train.steps`` may be raised (a
    finished run then continues to the new total)."""
    saved = saved_configs(saved)

    def differs(part: str, key: str, value) -> bool:
        if (part, key) == ("train", "steps"):
            return value < saved[part][key]
        if (part, key) == ("model", "prior_init"):  # a difference only where a prior starts otherwise
            return prior_start(saved[part]) != prior_start(given[part])
        return saved[part].get(key) != value

    return [
        f"{part}.{key}: run has {saved[part].get(key)!r}, given {value!r}"
        for part in ("model", "train")
        for key, value in given[part].items()
        if differs(part, key, value)
    ]


def prior_start(model: dict) -> dict | list | None:
    """The spec of the prior a model config's layers build, every option as the model fills it
    (``init`` among them): equal for configs whose ``prior_init`` differs where no prior reads it
    (NoPE, ALiBi, RoPE), or reads it to the same start (``None`` and ``"uniform"`` for GGD)."""
    prior = build_prior(GPTConfig.from_dict(model))
    return None if prior is None else prior.spec()


class MetricsLog:
    """``metrics.jsonl`` (and TensorBoard event files when ``tensorboard`` is installed)."""

    def __init__(self, run_dir: Path, step: int, enabled: bool):
        self.path = run_dir / METRICS_JSONL
        self.enabled = enabled
        self.board = None
        if enabled:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self.board = SummaryWriter(run_dir / "tensorboard", purge_step=step)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.board is not None:
            for key, value in record.items():
                if key != "step":
                    self.board.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.board is not None:
            self.board.close()


def read_metrics(path: Path) -> list[dict]:
    """The records of ``metrics.jsonl``; a last line cut short by a crash is skipped."""
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    return records


def last_logged(path: Path) -> dict:
    """The latest logged value of every metric."""
    return {key: value for record in read_metrics(path) for key, value in record.items()}


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records logged after the checkpoint ``step``: the resumed run logs them again."""
    if path.exists():
        kept = "".join(json.dumps(r) + "\n" for r in read_metrics(path) if r["step"] <= step)
        write_atomic(path, lambda tmp: tmp.write_text(kept))


#: Legend words for the names a run's config uses.
PRIOR_WORDS = {"ggd": "GGD (BAM)"}  # legend words of the priors not called by their class's name
ENCODING_WORDS = {"rope": "RoPE", "sinusoidal": "sinusoidal encoding", "local_rope": "local RoPE"}


def run_label(run_dir: Path) -> str:
    """The run's positional mechanism in words, from its config ("GOAT prior", "RoPE + SSMax",
    "no positional encoding (NoPE)", "llama + GGD (BAM) prior" for a model from ``hf-extend``);
    the directory name if it has no config."""
    path = run_dir / CONFIG_JSON
    if not path.exists():
        return run_dir.name
    config = read_json(path)
    if "model_type" in config:  # a transformers model
        record = config.get("priorattn") or {}
        parts = [config["model_type"], *prior_words(record.get("prior") or "uniform")]
        return " + ".join(parts) + (" without RoPE" if record.get("remove_rope") else "")
    model = config["model"]
    parts = prior_words(model["prior"])
    if model["encoding"] != "none":
        parts.append(ENCODING_WORDS[model["encoding"]])
    if model["ssmax"]:
        parts.append("SSMax")
    return " + ".join(parts) if parts else "no positional encoding (NoPE)"


def prior_words(spec) -> list[str]:
    """``["GGD (BAM) + GOAT prior"]`` for the spec ``"ggd+goat(num_freqs=3)"`` (or its dict or list
    form); nothing for ``"uniform"``; the spec itself for a prior not registered here."""
    try:
        names = _names(read_spec(spec))
    except ValueError:
        return [f"{spec} prior"]
    words = [PRIOR_WORDS.get(name, registered(name).cls.__name__) for name in names if name != "uniform"]
    return [" + ".join(words) + " prior"] if words else []


def _names(data) -> list[str]:
    return [n for part in data for n in _names(part)] if isinstance(data, list) else [data["name"]]
