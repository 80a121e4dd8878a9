"""Checkpoints: the tensors in safetensors files, the rest in a small JSON, written atomically.

A checkpoint is a JSON index, ``checkpoint-<step>.json``, and the tensors it names with their
sha256: one file, ``checkpoint-<step>.safetensors`` (:func:`save_checkpoint`, written by one
process), or a directory ``checkpoint-<step>/`` of shards, one written by each process of an FSDP
run through ``torch.distributed.checkpoint`` (:func:`save_sharded_checkpoint`; each shard a
safetensors file whose header says where its pieces lie in the whole tensors). The tensors are
written first, then the JSON that points at them (to a temporary name, then renamed), then
checkpoints beyond the newest ``keep`` are removed (JSON first): a crash at any moment leaves JSONs
that point at complete files. Loading takes the newest checkpoint that is intact and warns when it
had to skip a newer one, so one damaged file does not lose the run. :func:`load_checkpoint` reads
either kind as whole tensors; :func:`load_sharded_checkpoint` reads a sharded one into the shards
of the processes that load it, however many they are. Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..files import sha256_of, write_atomic, write_json_atomic
from .distributed import Process

# The single index of runs written before several checkpoints were kept; still read.
LEGACY_JSON = "checkpoint.json"
FORMAT_VERSION = 1  # an index naming one tensor file
SHARDED_VERSION = 2  # an index naming a directory of shards

#: ``{name: (shape, dtype)}`` of the tensors a checkpoint stores.
Stored = dict[str, tuple[torch.Size, torch.dtype]]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupted, or not matching the model."""


class CheckpointWarning(UserWarning):
    """The newest checkpoint was unusable and an older one was loaded instead."""


class ResumeWarning(UserWarning):
    """A checkpoint resumed where the run cannot continue as the one that saved it would have."""


def checkpoint_json(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"checkpoint-{step:08d}.json"


def save_checkpoint(run_dir: Path, step: int, tensors: dict[str, Tensor], state: dict, keep: int = 2) -> Path:
    """Write ``tensors`` and the JSON-able ``state`` as the run's checkpoint at ``step``, one tensor
    file; keep the newest ``keep`` checkpoints and remove the rest."""
    run_dir = Path(run_dir)
    path = run_dir / f"checkpoint-{step:08d}.safetensors"
    tensors = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp)))
    index = dict(version=FORMAT_VERSION, step=step, file=path.name, sha256=sha256_of(path), state=state)
    _commit(run_dir, step, index, keep)
    return path


def save_sharded_checkpoint(
    run_dir: Path, step: int, tensors: dict[str, Tensor], state: dict, keep: int, process: Process
) -> Path:
    """Every process of the group calls this with its ``tensors``: its shards (DTensors) and the
    tensors all hold whole (written once); each process writes its shard file into
    ``checkpoint-<step>/``, then rank 0 indexes them with the JSON-able ``state`` (its own is the
    one kept) and keeps the newest ``keep`` checkpoints."""
    run_dir = Path(run_dir)
    shards = run_dir / f"checkpoint-{step:08d}"
    if process.is_main:  # what a crash in an earlier save of this step left
        checkpoint_json(run_dir, step).unlink(missing_ok=True)
        shutil.rmtree(shards, ignore_errors=True)
    process.barrier()
    tensors = {name: t.detach() for name, t in tensors.items()}
    # Returns once every process has written (and synced) its file.
    dcp.save(tensors, storage_writer=dcp.HuggingFaceStorageWriter(str(shards), save_distributed=True))
    if process.is_main:
        files = sorted(shards.glob("*.safetensors"))
        index = dict(
            version=SHARDED_VERSION,
            step=step,
            directory=shards.name,
            shards={f.name: sha256_of(f) for f in files},
            sha256=sha256_of(*files),
            state=state,
        )
        _commit(run_dir, step, index, keep)
    return shards


def _commit(run_dir: Path, step: int, index: dict, keep: int) -> None:
    """Write the index of the checkpoint at ``step``, then remove the checkpoints beyond the newest
    ``keep`` (their JSONs first), and tensor files or shard directories no kept JSON names."""
    write_json_atomic(checkpoint_json(run_dir, step), index)
    (run_dir / LEGACY_JSON).unlink(missing_ok=True)
    indexes = checkpoint_indexes(run_dir)
    for old in indexes[keep:]:
        old.unlink()
    kept = {index.stem for index in indexes[:keep]}
    for old in run_dir.glob("checkpoint-*"):  # also those a crash left without a JSON
        if old.suffix == ".safetensors" and old.stem not in kept:
            old.unlink()
        elif old.is_dir() and old.name not in kept:
            shutil.rmtree(old)


def checkpoint_indexes(run_dir: Path) -> list[Path]:
    """The checkpoint JSONs of ``run_dir``, newest first (zero-padded steps sort by name)."""
    run_dir = Path(run_dir)
    legacy = [run_dir / LEGACY_JSON] if (run_dir / LEGACY_JSON).exists() else []
    return sorted(run_dir.glob("checkpoint-*.json"), reverse=True) + legacy


def has_checkpoint(run_dir: Path) -> bool:
    return bool(checkpoint_indexes(run_dir))


def load_checkpoint(run_dir: Path) -> tuple[int, dict[str, Tensor], dict]:
    """``(step, tensors, state)`` of the newest intact checkpoint, after checking its sha256s; the
    tensors whole, a sharded checkpoint's gathered from its shards (in this process alone).

    A newer checkpoint that is damaged (unreadable JSON, missing or altered tensor file or shard) is
    skipped with a :class:`CheckpointWarning`; if none is intact, :class:`CheckpointError` names
    each fault.
    """
    return _newest_intact(Path(run_dir), _read_whole)


def load_sharded_checkpoint(
    run_dir: Path, targets: Callable[[Stored], dict[str, Tensor]]
) -> tuple[int, dict[str, Tensor], dict]:
    """``(step, tensors, state)`` of the newest intact sharded checkpoint, called by every process
    of the group: ``targets(stored)`` gives the tensors this process reads, by name, each whole or
    a DTensor whose shard is read (from shards written by any number of processes); they are
    filled and returned. A name the checkpoint lacks or stores with another shape is a
    :class:`CheckpointError`. Damaged checkpoints, and those of one file (which a sharded run does
    not write), are skipped as :func:`load_checkpoint` skips damaged ones."""

    def read(index_path: Path, tensors: Path) -> dict[str, Tensor]:
        if not tensors.is_dir():
            raise CheckpointError(f"{index_path} is a single-file checkpoint, not a sharded one")
        reader = dcp.HuggingFaceStorageReader(str(tensors))
        stored = _stored(reader)
        wanted = targets(stored)
        missing = sorted(set(wanted) - set(stored))
        wrong = [
            f"{n} {tuple(stored[n][0])} vs model {tuple(t.shape)}"
            for n, t in wanted.items()
            if n in stored and stored[n][0] != t.shape
        ]
        mismatch(missing=missing, shapes=wrong)
        dcp.load(wanted, storage_reader=reader)
        return wanted

    return _newest_intact(Path(run_dir), read)


def _read_whole(index_path: Path, tensors: Path) -> dict[str, Tensor]:
    """The tensors of a checkpoint, whole: its one file's, or its shards' put together."""
    if tensors.is_dir():
        reader = dcp.HuggingFaceStorageReader(str(tensors))
        whole = {name: torch.empty(shape, dtype=dtype) for name, (shape, dtype) in _stored(reader).items()}
        with warnings.catch_warnings():  # that it loads in this process alone, as asked
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(whole, storage_reader=reader, no_dist=True)
        return whole
    try:
        return load_file(str(tensors))
    except SafetensorError as e:
        raise CheckpointError(f"{tensors} is not a readable safetensors file ({e})") from None


def _stored(reader: dcp.HuggingFaceStorageReader) -> Stored:
    """Name, whole shape and dtype of each tensor in a shard directory (from the shards' headers)."""
    metadata = reader.read_metadata().state_dict_metadata
    return {name: (m.size, m.properties.dtype) for name, m in metadata.items()}


def _newest_intact(run_dir: Path, read: Callable[[Path, Path], dict[str, Tensor]]):
    """``(step, tensors, state)`` of the newest checkpoint whose files are intact and that ``read``
    (given its index and its tensor file or shard directory) reads without a
    :class:`CheckpointError`; warns for each one skipped."""
    indexes = checkpoint_indexes(run_dir)
    if not indexes:
        raise CheckpointError(f"no checkpoint in {run_dir} (no checkpoint-<step>.json)")
    faults = []
    for index_path in indexes:
        try:
            step, location, state = _check_one(run_dir, index_path)
            tensors = read(index_path, location)
        except CheckpointError as e:
            faults.append(str(e))
            continue
        if faults:
            warnings.warn(
                f"{'; '.join(faults)}: loading the older checkpoint {index_path.name} (step {step})",
                CheckpointWarning,
                stacklevel=3,
            )
        return step, tensors, state
    raise CheckpointError("no intact checkpoint: " + "; ".join(faults))


def _check_one(run_dir: Path, index_path: Path) -> tuple[int, Path, dict]:
    """``(step, tensor file or shard directory, state)`` of one checkpoint, after checking that its
    index reads and that each file it names is there with the sha256 it records."""
    try:
        index = json.loads(index_path.read_text())
        step, version, state = index["step"], index.get("version"), index["state"]
        if version == SHARDED_VERSION:
            location = index["directory"]
            files = {f"{location}/{name}": digest for name, digest in index["shards"].items()}
        else:
            location, files = index["file"], {index["file"]: index["sha256"]}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index_path} is corrupted ({e})") from None
    if version not in (FORMAT_VERSION, SHARDED_VERSION):
        raise CheckpointError(
            f"{index_path} has format version {version}, expected {FORMAT_VERSION} or {SHARDED_VERSION}"
        )
    for name, digest in files.items():
        path = run_dir / name
        if not path.is_file():
            raise CheckpointError(f"{index_path} names {name}, which is missing")
        if sha256_of(path) != digest:
            raise CheckpointError(f"{path} is corrupted: its sha256 differs from {index_path.name}'s")
    return step, run_dir / location, state


# Model, optimizer and RNG states as named tensors plus JSON.


def module_tensors(module: nn.Module, prefix: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """A module's state as ``{prefix + name: tensor}``, each shared tensor once, and the aliases.

    A tied head or a prior shared by all layers appears under several names in ``state_dict``, as
    one parameter; safetensors stores each tensor once, so later names become aliases of the first.
    Under FSDP the tensors are the module's shards (DTensors).
    """
    tensors, aliases, first = {}, {}, {}
    for name, t in module.state_dict(keep_vars=True).items():  # the parameters, shared ones as one
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
            tensors[prefix + name] = t.detach()
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
    mismatch(missing=missing, unexpected=unexpected, shapes=wrong)
    module.load_state_dict(state)


def mismatch(**faults: list[str]) -> None:
    """A :class:`CheckpointError` naming the first few of each kind of fault, if there is one."""
    if any(faults.values()):
        raise CheckpointError(
            "checkpoint does not match the model: "
            + "; ".join(
                f"{what}: {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}"
                for what, items in faults.items()
                if items
            )
        )


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
