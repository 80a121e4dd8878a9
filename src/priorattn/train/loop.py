"""The training loop: ``train(model_config, train_config, run_dir)``, plain or under ``torchrun``.

A run directory holds ``config.json`` (the model and training configs), ``data.json`` and the
tokenizer (written by :func:`priorattn.data.prepare_data`), ``metrics.jsonl`` (one JSON object per
logged step) and the newest checkpoints (``checkpoint-<step>.json`` + ``.safetensors`` each, or
the ``checkpoint-<step>/`` shards of an FSDP run). How processes share the model, DDP or FSDP, is
:mod:`priorattn.train.parallel`'s.

Resuming is exact: batches are a pure function of the step (:class:`priorattn.data.Batches`), the
schedule is a function of the step, and the checkpoint holds model, optimizer, scheduler and every
process's RNG. A run killed at any moment and resumed logs the same losses as one never killed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..data import Batches, PackedSequences, document_positions, eval_batches, prepare_data, read_data_record
from ..data.packing import IGNORE_INDEX
from ..data.retrieval import RetrievalMix
from ..files import write_json_atomic
from ..mechanisms import AuxLosses
from ..models import GPT, GPTConfig
from ..models.gpt import token_cross_entropy
from . import checkpoint as ckpt
from .config import TrainConfig
from .distributed import Process, end_process, start_process
from .optim import build_optimizer, build_scheduler, lr_factor, optimizer_step
from .parallel import average_replicated_gradients, wrap
from .runs import (
    CONFIG_JSON,
    METRICS_JSONL,
    MetricsLog,
    check_run_dir,
    config_differences,
    last_logged,
    run_configs,
    truncate_metrics,
)


@dataclass
class TrainResult:
    """Where a finished run is and how it ended (losses in nats per token)."""

    run_dir: Path
    step: int
    train_loss: float
    val_loss: float
    unigram_loss: float
    tokens_per_s: float


def train(
    model_config: GPTConfig,
    config: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
) -> TrainResult:
    """Train a :class:`GPT` as ``config`` says, writing the run to ``run_dir``.

    ``resume=True`` continues the run in ``run_dir`` from its checkpoint (from the start if it was
    stopped before its first checkpoint, or if ``run_dir`` holds no run yet, so a job that may be
    interrupted can always pass it); the configs must be the ones the run started with, except that
    ``steps`` may be raised. Resuming a finished run only reports it, or continues it to the raised
    ``steps``. A run that stopped before its first checkpoint starts again in place, with or
    without ``resume``. Under ``torchrun`` every process calls this function; rank 0
    writes the run directory (each process its shard of an FSDP checkpoint).
    """
    process = start_process(group_alone=config.parallel == "fsdp")
    try:
        with reproducible_kernels(config, process):
            result = _train(model_config, config, Path(run_dir), resume, progress, process)
        # Rank 0 writes the last checkpoint alone: no rank tears the process group down while
        # another still works (a rank that left early aborted once in a gloo teardown).
        process.barrier()
        return result
    finally:
        end_process(process)


def _train(model_config, config, run_dir, resume, progress, process: Process) -> TrainResult:
    if model_config.backend == "flex" and process.device.type == "cpu":  # refused before any file
        raise ValueError(
            "backend='flex' cannot train on the CPU: FlexAttention has no backward here; train with "
            "backend='auto', 'sdpa' or 'memeff' (the routes give the same attention)"
        )
    continuing = resume and ckpt.has_checkpoint(run_dir)  # before any process writes one
    if config.parallel == "fsdp" and not process.distributed and not continuing:
        raise ValueError(
            "parallel='fsdp' shards the model over processes and this run has one: start it under "
            "torchrun with --nproc-per-node 2 or more, or use parallel='ddp' (an FSDP run may resume "
            "on one process)"
        )
    created = process.is_main and not run_dir.exists()
    seq_len = config.seq_len or model_config.seq_len
    try:  # everything that can refuse the input, before a step is taken
        data = _prepare(run_dir, model_config, config, continuing, process)
        micro_batch = _micro_batch(config, process)
        batches = Batches(data.train, config.batch_size // config.grad_accum, seed=config.seed)
        if config.retrieval_mix:  # checked before the run's config is written
            tokens = data.train.store.tokens
            batches = RetrievalMix(batches, config.retrieval_mix, data.tokenizer, tokens, seed=config.seed)
        torch.manual_seed(config.seed)  # the same initial weights on every process
        model = GPT(model_config).to(process.device)
        aux = model.aux_losses()
        if config.init_from is not None:
            _start_from(Path(config.init_from), model, data.tokenizer)
    except BaseException:
        if created:  # a refused input (no corpus, a mismatched tokenizer...) leaves no directory behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    wrapped = wrap(model, config, process)  # FSDP shards the model in place, before the optimizer
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    torch.manual_seed(config.seed + process.rank)  # dropout differs between processes
    step = 0
    if continuing:
        step = _restore(run_dir, model, optimizer, scheduler, model_config, config, process)
    if process.is_main:  # written again when continued: the run may have raised its steps
        write_json_atomic(run_dir / CONFIG_JSON, run_configs(model_config, config))
        truncate_metrics(run_dir / METRICS_JSONL, step)

    log = MetricsLog(run_dir, step, enabled=process.is_main)
    bar = tqdm(total=config.steps, initial=step, disable=not (progress and process.is_main), unit="step")
    tokens_per_step = config.batch_size * seq_len
    clock, clock_step = time.perf_counter(), step
    train_loss = val_loss = float("nan")
    tokens_per_s = 0.0
    while step < config.steps:
        micro_batches = [
            batches.batch(step * config.grad_accum + i, process.rank, process.world_size)
            for i in range(config.grad_accum)
        ]
        lr = optimizer.param_groups[0]["lr"]
        aux.start(step)
        train_loss, grad_norm = train_step(
            wrapped, micro_batches, optimizer, config, process, aux, scheduler=scheduler
        )
        step += 1
        bar.update(1)
        final = step == config.steps
        record = None
        if step % config.log_every == 0 or final:
            elapsed = time.perf_counter() - clock
            tokens_per_s = (step - clock_step) * tokens_per_step / max(elapsed, 1e-9)
            clock, clock_step = time.perf_counter(), step
            record = dict(
                step=step, train_loss=train_loss, lr=lr, grad_norm=grad_norm, tokens_per_s=tokens_per_s
            )
            record |= aux.logged()
        if (config.eval_every and step % config.eval_every == 0) or final:
            val_loss = evaluate(model, data.val, micro_batch, config, process)
            record = (record or dict(step=step, train_loss=train_loss)) | dict(val_loss=val_loss)
        if record is not None:
            log.write(record)
            bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tokens_per_s:,.0f}")
        if (config.save_every and step % config.save_every == 0) or final:
            _save(run_dir, step, model, optimizer, scheduler, config, process)
    bar.close()
    log.close()
    if process.is_main:  # the last logged values (a finished run that was resumed logs nothing new)
        logged = last_logged(run_dir / METRICS_JSONL)
        train_loss, val_loss = logged.get("train_loss", train_loss), logged.get("val_loss", val_loss)
        tokens_per_s = logged.get("tokens_per_s", tokens_per_s)
    return TrainResult(run_dir, step, train_loss, val_loss, data.unigram_loss, tokens_per_s)


@contextlib.contextmanager
def reproducible_kernels(config: TrainConfig, process: Process):
    """Deterministic kernels while a compiled run trains on the CPU: inductor's C++ sums the
    embedding's gradient with atomic adds, whose order varies from run to run (a gradient norm
    moved in its 8th digit), so a resumed run would not log what the uninterrupted one did; eager
    CPU training is reproducible without this. Elsewhere, and for eager runs, nothing changes
    (``warn_only``: an operator without a deterministic kernel warns rather than fails)."""
    if not (config.compile and process.device.type == "cpu"):
        yield
        return
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def train_step(
    model,
    micro_batches,
    optimizer,
    config: TrainConfig,
    process: Process,
    aux: AuxLosses | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> tuple[float, float]:
    """One optimizer step over this process's micro-batches; ``(loss, grad norm)`` of the step.

    The loss is the cross-entropy summed over every target token of the step (all micro-batches on
    all processes) divided by their count, so the update is the same however the global batch is
    split. DDP and FSDP average gradients over processes, hence the ``world_size`` factor; under
    FSDP every micro-step reduces its gradients, so the accumulated ones stay sharded. The model's
    auxiliary losses ``aux`` (each a mean per micro-batch, e.g. the scalar regularizers) add the mean
    over micro-batches of their sum; the returned loss is the cross-entropy alone. The update itself
    (clipping to ``config.grad_clip``, the step, ``scheduler``'s step) is :func:`optimizer_step`'s.
    """
    counts = torch.tensor(float(sum(int((t != IGNORE_INDEX).sum()) for _, t, _ in micro_batches)))
    n_targets = process.all_reduce_sum(counts).clamp_min(1.0)
    loss_sum = torch.zeros(())
    for i, (tokens, targets, doc_ids) in enumerate(micro_batches):
        sync = i == len(micro_batches) - 1 or not isinstance(model, DistributedDataParallel)
        with contextlib.nullcontext() if sync else model.no_sync():
            summed = _summed_loss(model, tokens, targets, doc_ids, config, process)
            objective = summed * (process.world_size / n_targets)
            extra = {} if aux is None else aux.losses()
            (objective + sum(extra.values()) / len(micro_batches) if extra else objective).backward()
        loss_sum += summed.detach().cpu()
    average_replicated_gradients(model, process)
    grad_norm = optimizer_step(model, optimizer, scheduler, config.grad_clip)
    return float(process.all_reduce_sum(loss_sum) / n_targets), grad_norm


@torch.no_grad()
def evaluate(
    model: GPT, packed: PackedSequences, batch_size: int, config: TrainConfig, process: Process
) -> float:
    """Mean cross-entropy per target token over the first ``eval_sequences`` validation sequences,
    the batches dealt out to the processes in turn.

    Every process runs as many forward passes (FSDP gathers parameters from all of them in each): one
    left without a batch in the last round scores its last one again and ignores it."""
    model.eval()
    totals = torch.zeros(2)  # summed loss, target count
    batches = list(eval_batches(packed, batch_size, config.eval_sequences))
    rounds = math.ceil(len(batches) / process.world_size)
    for i in range(rounds * process.world_size):
        if i % process.world_size != process.rank:
            continue
        tokens, targets, doc_ids = batches[min(i, len(batches) - 1)]
        summed = _summed_loss(model, tokens, targets, doc_ids, config, process).cpu()
        if i < len(batches):
            totals[0] += summed
            totals[1] += int((targets != IGNORE_INDEX).sum())
    model.train()
    loss, count = process.all_reduce_sum(totals)
    return float(loss / count.clamp_min(1.0))


def _summed_loss(model, tokens: Tensor, targets: Tensor, doc_ids: Tensor, config, process) -> Tensor:
    positions = _positions(model, doc_ids, config)  # from the host copy: no device synchronisation
    tokens, targets, doc_ids = (t.to(process.device) for t in (tokens, targets, doc_ids))
    if positions is not None:
        positions = positions.to(process.device)
    loss = compiled_loss() if config.compile and model.training else summed_token_loss
    with torch.autocast(process.device.type, dtype=torch.bfloat16, enabled=config.bf16):
        return loss(model, tokens, positions, doc_ids, targets)


def summed_token_loss(
    model, tokens: Tensor, positions: Tensor | None, doc_ids: Tensor, targets: Tensor
) -> Tensor:
    """The cross-entropy summed over the target tokens of ``tokens`` ``(B, L)``."""
    logits, _, _ = model(tokens, positions=positions, doc_ids=doc_ids)  # (B, L, V)
    return token_cross_entropy(logits, targets).sum()


@functools.cache
def compiled_loss():
    """:func:`summed_token_loss` under ``torch.compile`` (``TrainConfig.compile``), made once per
    process. The loss alone leaves the graph: the model's KV caches, views of its tensors, would
    come back from torch 2.13's AOTAutograd cache in a later process (a resumed run) with wrong
    sizes."""
    return torch.compile(summed_token_loss)


def _positions(model, doc_ids: Tensor, config: TrainConfig) -> Tensor | None:
    """Per-document positions of a packed batch, or None for the model's own (from the window start).

    A model whose position terms are all relative gives the same outputs with both (the document
    mask keeps attention inside a document), and window positions keep its routes' fast paths: a
    relative prior (GGD) is tabulated once per lag only on positions shared by the batch.
    """
    gpt = model.module if isinstance(model, DistributedDataParallel) else model
    if config.positions == "window" or not gpt.reads_absolute_positions:
        return None
    return document_positions(doc_ids)


def _prepare(run_dir: Path, model_config, config: TrainConfig, continuing: bool, process: Process):
    """The run directory checked and the data prepared."""
    if process.is_main:
        check_run_dir(run_dir, model_config, config, continuing)
    process.barrier()
    seq_len = config.seq_len or model_config.seq_len
    data = None
    for turn in ("main", "others"):  # rank 0 builds the tokenizer and token caches, then the rest read them
        if (turn == "main") == process.is_main:
            data = prepare_data(
                config.data,
                tokenizer=config.tokenizer,
                vocab_size=config.vocab_size,
                seq_len=seq_len,
                val_fraction=config.val_fraction,
                text_encoding=config.text_encoding,
                run_dir=run_dir,
                resume=continuing or not process.is_main,
            )
        process.barrier()
    if data.tokenizer.vocab_size > model_config.vocab_size:
        raise ValueError(
            f"the {config.tokenizer} tokenizer has {data.tokenizer.vocab_size} tokens but the model's "
            f"vocab_size is {model_config.vocab_size}: raise vocab_size (the CLI sets it from the tokenizer)"
        )
    return data


def _micro_batch(config: TrainConfig, process: Process) -> int:
    """Sequences per forward pass on this process."""
    per_step = config.batch_size // config.grad_accum
    if per_step % process.world_size:
        raise ValueError(
            f"batch_size / grad_accum = {per_step} sequences per micro-step cannot be split evenly "
            f"over {process.world_size} processes"
        )
    return per_step // process.world_size


def _start_from(source: Path, model: GPT, tokenizer) -> None:
    """Load the final weights of the run in ``source``, which must have used the same tokenizer."""
    used = read_data_record(source)["tokenizer"]
    if used != tokenizer.to_dict():
        raise ValueError(
            f"init_from={str(source)!r} used the tokenizer {used}, this run {tokenizer.to_dict()}: "
            "a model continues only with its own tokenizer"
        )
    _, tensors, state = ckpt.load_checkpoint(source)
    ckpt.load_module(model, tensors, state["model_aliases"], "model.")


def _save(run_dir, step, model, optimizer, scheduler, config: TrainConfig, process: Process) -> None:
    """The checkpoint at ``step``: one file written by rank 0, or under FSDP the shards every
    process writes (its own parts of the model and optimizer state)."""
    rng = process.all_gather(torch.get_rng_state())  # every process's dropout stream
    model_tensors, aliases = ckpt.module_tensors(model, "model.")
    optim_tensors, optim_state = ckpt.optimizer_tensors(optimizer)
    tensors = model_tensors | optim_tensors | {f"rng.{rank}": state for rank, state in enumerate(rng)}
    state = None  # what the JSON index holds, which rank 0 writes
    if process.is_main:
        state = dict(
            model_aliases=aliases,
            optimizer=optim_state,
            scheduler=scheduler.state_dict(),
            data_position=dict(step=step),  # batches are a function of the step alone
            world_size=process.world_size,  # each process draws dropout from its own stream
            configs=json.loads((run_dir / CONFIG_JSON).read_text()),
        )
    if config.parallel == "fsdp":
        ckpt.save_sharded_checkpoint(run_dir, step, tensors, state, config.keep_checkpoints, process)
    elif process.is_main:
        ckpt.save_checkpoint(run_dir, step, tensors, state, config.keep_checkpoints)


def _restore(run_dir, model, optimizer, scheduler, model_config, config, process: Process) -> int:
    if config.parallel == "fsdp":
        targets = functools.partial(_shard_targets, model, optimizer, process)
        step, tensors, state = ckpt.load_sharded_checkpoint(run_dir, targets)
    else:
        step, tensors, state = ckpt.load_checkpoint(run_dir)
    if "configs" not in state or config_differences(state["configs"], run_configs(model_config, config)):
        raise ckpt.CheckpointError(f"the checkpoint in {run_dir} was written by a run with other configs")
    ckpt.load_module(model, tensors, state["model_aliases"], "model.")
    ckpt.load_optimizer(optimizer, tensors, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    # The saved lr is the old schedule's; with raised steps the next step takes the new one's.
    for group, base_lr in zip(optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base_lr * lr_factor(step, config)
    rng = tensors.get(f"rng.{process.rank}")
    if rng is not None:
        torch.set_rng_state(rng)
    saved = state.get("world_size")  # None: a checkpoint written before it was recorded
    if model_config.dropout and saved not in (None, process.world_size) and process.is_main:
        warnings.warn(
            f"{run_dir}: a checkpoint of {saved} processes resumed on {process.world_size}: dropout draws "
            "from each process's own random stream, so its masks change with the number of processes and "
            "the losses leave those of a run never interrupted (2 -> 1 under FSDP, dropout 0.1: 2e-4 at "
            "the first step, up to 5e-3 in 20 steps; benchmarks/resume_drift.py); without dropout they "
            "stay within float tolerance",
            ckpt.ResumeWarning,
            stacklevel=2,
        )
    return step


def _shard_targets(model, optimizer, process: Process, stored: ckpt.Stored) -> dict[str, Tensor]:
    """What this process reads from a sharded checkpoint: the model's tensors and the optimizer's
    state, each shaped (and, where sharded, split) as this process holds it, and its own RNG state
    if the run that saved had a process of its rank. A model of other names is refused here."""
    model_tensors, _ = ckpt.module_tensors(model, "model.")
    saved = {name for name in stored if name.startswith("model.")}
    ckpt.mismatch(missing=sorted(set(model_tensors) - saved), unexpected=sorted(saved - set(model_tensors)))
    targets = {name: torch.empty_like(t) for name, t in model_tensors.items()}
    params = [p for group in optimizer.param_groups for p in group["params"]]  # as state_dict numbers them
    for name, (shape, dtype) in stored.items():
        if name.startswith("optimizer."):
            param = params[int(name.split(".")[1])]
            # the moments are shaped (and split) as their parameter; the step count is one number
            same = shape == param.shape
            targets[name] = torch.empty_like(param.detach()) if same else torch.empty(shape, dtype=dtype)
    rng = f"rng.{process.rank}"
    if rng in stored:
        targets[rng] = torch.empty(stored[rng][0], dtype=stored[rng][1])
    return targets
