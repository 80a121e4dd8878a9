"""Checkpoints: every tensor in one safetensors file, the rest in a small JSON, both written atomically.

A checkpoint is a pair, ``checkpoint-<step>.safetensors`` and ``checkpoint-<step>.json``, which names
that file and its sha256. The tensor file is written first (to a temporary name, then renamed), then
the JSON that points at it, then checkpoints beyond the newest ``keep`` are removed (JSON first): a
crash at any moment leaves JSONs that point at complete files. Loading takes the newest checkpoint
that is intact and warns when it had to skip a newer one, so one damaged file does not lose the run.
Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..files import sha256_of, write_atomic, write_json_atomic

# The single index of runs written before several checkpoints were kept; still read.
LEGACY_JSON = "checkpoint.json"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupted, or not matching the model."""


class CheckpointWarning(UserWarning):
    """The newest checkpoint was unusable and an older one was loaded instead."""


def checkpoint_json(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"checkpoint-{step:08d}.json"


def save_checkpoint(run_dir: Path, step: int, tensors: dict[str, Tensor], state: dict, keep: int = 2) -> Path:
    """Write ``tensors`` and the JSON-able ``state`` as the run's checkpoint at ``step``; keep the
    newest ``keep`` checkpoints and remove the rest."""
    run_dir = Path(run_dir)
    path = run_dir / f"checkpoint-{step:08d}.safetensors"
    tensors = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp)))
    index = dict(version=FORMAT_VERSION, step=step, file=path.name, sha256=sha256_of(path), state=state)
    write_json_atomic(checkpoint_json(run_dir, step), index)
    (run_dir / LEGACY_JSON).unlink(missing_ok=True)
    indexes = checkpoint_indexes(run_dir)
    for old in indexes[keep:]:
        old.unlink()
    kept = {index.with_suffix(".safetensors").name for index in indexes[:keep]}
    for old in run_dir.glob("checkpoint-*.safetensors"):  # also those a crash left without a JSON
        if old.name not in kept:
            old.unlink()
    return path


def checkpoint_indexes(run_dir: Path) -> list[Path]:
    """The checkpoint JSONs of ``run_dir``, newest first (zero-padded steps sort by name)."""
    run_dir = Path(run_dir)
    legacy = [run_dir / LEGACY_JSON] if (run_dir / LEGACY_JSON).exists() else []
    return sorted(run_dir.glob("checkpoint-*.json"), reverse=True) + legacy


def has_checkpoint(run_dir: Path) -> bool:
    return bool(checkpoint_indexes(run_dir))


def load_checkpoint(run_dir: Path) -> tuple[int, dict[str, Tensor], dict]:
    """``(step, tensors, state)`` of the newest intact checkpoint, after checking its sha256.

    A newer checkpoint that is damaged (unreadable JSON, missing or altered tensor file) is skipped
    with a :class:`CheckpointWarning`; if none is intact, :class:`CheckpointError` names each fault.
    """
    run_dir = Path(run_dir)
    indexes = checkpoint_indexes(run_dir)
    if not indexes:
        raise CheckpointError(f"no checkpoint in {run_dir} (no checkpoint-<step>.json)")
    faults = []
    for index_path in indexes:
        try:
            step, tensors, state = _load_one(run_dir, index_path)
        except CheckpointError as e:
            faults.append(str(e))
            continue
        if faults:
            warnings.warn(
                f"{'; '.join(faults)}: loading the older checkpoint {index_path.name} (step {step})",
                CheckpointWarning,
                stacklevel=2,
            )
        return step, tensors, state
    raise CheckpointError("no intact checkpoint: " + "; ".join(faults))


def _load_one(run_dir: Path, index_path: Path) -> tuple[int, dict[str, Tensor], dict]:
    try:
        index = json.loads(index_path.read_text())
        step, name, digest, state = index["step"], index["file"], index["sha256"], index["state"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index_path} is corrupted ({e})") from None
    if index.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{index_path} has format version {index.get('version')}, expected 1")
    path = run_dir / name
    if not path.exists():
        raise CheckpointError(f"{index_path} names {name}, which is missing")
    if sha256_of(path) != digest:
        raise CheckpointError(f"{path} is corrupted: its sha256 differs from {index_path.name}'s")
    try:
        tensors = load_file(str(path))
    except SafetensorError as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None
    return step, tensors, state


# Model, optimizer and RNG states as named tensors plus JSON.


def module_tensors(module: nn.Module, prefix: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """A module's state as ``{prefix + name: tensor}``, each shared tensor once, and the aliases.

    A tied head or a prior shared by all layers appears under several names in ``state_dict``;
    safetensors stores each tensor once, so later names become aliases of the first.
    """
    tensors, aliases, first = {}, {}, {}
    for name, t in module.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride())
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            tensors[prefix + name] = t
    return tensors, aliases


def load_module(module: nn.Module, tensors: dict[str, Tensor], aliases: dict[str, str], prefix: str) -> None:
    """Load :func:`module_tensors`' output into ``module``; names a mismatch instead of failing deep."""
    state = {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}
    state.update({alias: state[name] for alias, name in aliases.items() if name in state})
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{n} {tuple(state[n].shape)} vs model {tuple(t.shape)}"
        for n, t in expected.items()
        if n in state and state[n].shape != t.shape
    ]
    if missing or unexpected or wrong:
        raise CheckpointError(
            "checkpoint does not match the model: "
            + "; ".join(
                f"{what}: {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}"
                for what, items in (("missing", missing), ("unexpected", unexpected), ("shapes", wrong))
                if items
            )
        )
    module.load_state_dict(state)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict]:
    """The optimizer's per-parameter state as tensors ``optimizer.<param>.<key>``; groups as JSON."""
    full = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entries in full["state"].items():
        for key, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer.{index}.{key}"] = value
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, dict(param_groups=full["param_groups"], scalars=scalars)


def load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], state: dict) -> None:
    entries: dict[int, dict] = {}
    for name, t in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            entries.setdefault(int(index), {})[key] = t
    for index, values in state["scalars"].items():
        entries.setdefault(int(index), {}).update(values)
    groups = state["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        raise CheckpointError("checkpoint's optimizer groups do not match this model's parameters")
    optimizer.load_state_dict(dict(state=entries, param_groups=groups))
