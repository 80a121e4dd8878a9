"""Context extension of a ``transformers`` model with a prior (seed 003 App. F.5), as one call.

:func:`extend` loads a local model (or builds a small one from a config, for a demo), adds a prior
(:func:`~priorattn.hf.add_prior`), fine-tunes the whole model at the longer ``seq_len`` on the
library's data pipeline (packed documents with per-document positions, the library's optimizer
groups and schedule) and writes it with ``save_pretrained``, with ``data.json``, the tokenizer and
``results.json`` (validation loss at ``seq_len`` before and after, time per step). Nothing downloads.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from ..data import Batches, ByteTokenizer, PackedSequences, Tokenizer, document_positions, eval_batches
from ..data.packing import IGNORE_INDEX
from ..data.prepare import prepare_data, read_data_record
from ..data.tokenizer import TOKENIZER_FILE, BPETokenizer, load_tokenizer
from ..files import prepare_out, write_json_atomic
from ..models.gpt import token_cross_entropy
from ..train import TrainConfig
from ..train.optim import build_optimizer, build_scheduler, optimizer_step
from .model import CONFIG_KEY, CachedLM, add_prior, from_pretrained, model_dir

RESULTS_JSON = "results.json"
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


@dataclass
class ExtendConfig(TrainConfig):
    """How :func:`extend` fine-tunes: a :class:`~priorattn.train.TrainConfig` with the defaults of a
    short fine-tune of a trained model (``hf-extend``'s); :data:`EXTEND_FIELDS` are the fields
    :func:`extend` reads.

    - ``seq_len``: the longer length the model is fine-tuned at (required).
    - ``steps``: optimizer steps of the fine-tune.
    - ``lr``: the peak learning rate of the model's own weights.
    - ``prior_lr``: the learning rate of the prior's parameters, which start as standard attention.
    """

    steps: int = 100
    batch_size: int = 4
    lr: float = 1e-4
    prior_lr: float | None = 1e-2
    warmup_steps: int = 10


#: The fields of :class:`ExtendConfig` that :func:`extend` reads (the rest are the LM loop's).
EXTEND_FIELDS = (
    "data",
    "text_encoding",
    "val_fraction",
    "seq_len",
    "steps",
    "batch_size",
    "optimizer",
    "lr",
    "prior_lr",
    "betas",
    "weight_decay",
    "warmup_steps",
    "min_lr_ratio",
    "grad_clip",
    "eval_sequences",
    "seed",
)


@dataclass(frozen=True)
class AddedPrior:
    """The prior :func:`extend` adds (:func:`~priorattn.hf.add_prior`'s arguments), as ``hf-extend``
    chooses it.

    - ``prior``: a prior spec, as ``train --prior`` takes it.
    - ``prior_init``: where the spec's learnable priors start: ``"uniform"`` (standard attention) or
      ``"alibi"`` (``PRIOR_INITS``).
    - ``shared_prior``: one prior (one set of parameters) for all layers; by default one per layer.
    - ``remove_rope``: drop the model's RoPE (NoPE + prior); by default RoPE stays and the prior adds
      to it.
    """

    prior: str = "ggd"
    prior_init: str = "uniform"
    shared_prior: bool = False
    remove_rope: bool = False


def load_model(source: str | Path) -> tuple[PreTrainedModel, Tokenizer]:
    """A causal LM and its tokenizer from a local model directory, or a fresh model from a config.

    ``source``: a directory holding ``config.json`` and weights (as ``save_pretrained`` writes), or a
    directory or ``.json`` file holding only a config, from which a randomly initialised model is
    built (a demo). The tokenizer is the directory's ``tokenizer.json``, else UTF-8 bytes. A
    directory that :func:`~priorattn.hf.add_prior` already changed is refused.
    """
    source = Path(source)
    if source.is_file() and source.suffix == ".json":
        return _from_config(json.loads(source.read_text(encoding="utf-8"))), ByteTokenizer()
    path = model_dir(source)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if CONFIG_KEY in config:
        raise ValueError(
            f"{path} already has priors (its config.json records {CONFIG_KEY!r}): hf-extend adds a "
            "prior to a model without one"
        )
    if any(path.glob(pattern) for pattern in WEIGHT_FILES):
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    else:
        model = _from_config(config)
    tokenizer = BPETokenizer.load(path) if (path / TOKENIZER_FILE).is_file() else ByteTokenizer()
    if tokenizer.vocab_size > model.config.get_text_config().vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
            f"{model.config.get_text_config().vocab_size}: give the model its own tokenizer.json"
        )
    return model, tokenizer


def _from_config(config: dict) -> PreTrainedModel:
    if "model_type" not in config:
        raise ValueError("the config has no model_type (e.g. 'llama'): it must be a transformers config.json")
    config = AutoConfig.for_model(**config)
    return AutoModelForCausalLM.from_config(config)


def extend(
    source: str | Path,
    out: str | Path,
    config: TrainConfig,
    *,
    prior: str = "ggd",
    remove_rope: bool = False,
    progress: bool = True,
    **prior_options,
) -> dict:
    """Fine-tune the model at ``source`` with ``prior`` at ``config.seq_len``; write it to ``out``.

    ``config`` gives the data, length, steps, batch, learning rates (``prior_lr`` for the prior's
    group) and schedule; ``prior``, ``remove_rope`` and ``prior_options`` go to
    :func:`~priorattn.hf.add_prior`. Returns what ``out/results.json`` records.
    """
    if config.seq_len is None:
        raise ValueError("seq_len must be given: the length to extend the model to")
    model, tokenizer = load_model(source)
    add_prior(model, prior, remove_rope=remove_rope, seq_len=config.seq_len, **prior_options)
    out = prepare_out(Path(out))
    data = prepare_data(
        config.data,
        tokenizer=tokenizer,
        seq_len=config.seq_len,
        val_fraction=config.val_fraction,
        text_encoding=config.text_encoding,
        run_dir=out,
    )
    torch.manual_seed(config.seed)
    batches = Batches(data.train, config.batch_size, seed=config.seed)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    val_before = evaluate(model, data.val, config)
    model.train()
    train_losses = []
    start = time.perf_counter()
    for step in tqdm(range(config.steps), disable=not progress, unit="step"):
        tokens, targets, doc_ids = batches.batch(step)
        loss = summed_loss(model, tokens, targets, doc_ids) / (targets != IGNORE_INDEX).sum().clamp_min(1)
        loss.backward()
        optimizer_step(model, optimizer, scheduler, config.grad_clip)
        train_losses.append(loss.item())
    seconds_per_step = (time.perf_counter() - start) / config.steps
    result = dict(
        source=str(source),
        prior=prior,
        remove_rope=remove_rope,
        seq_len=config.seq_len,
        steps=config.steps,
        val_loss_before=val_before,
        val_loss_after=evaluate(model, data.val, config),
        train_loss=train_losses[-1],
        unigram_loss=data.unigram_loss,
        seconds_per_step=seconds_per_step,
        train=config.to_dict(),
    )
    model.save_pretrained(out)
    write_json_atomic(out / RESULTS_JSON, result)
    return result


def summed_loss(model: PreTrainedModel, tokens: Tensor, targets: Tensor, doc_ids: Tensor) -> Tensor:
    """Cross-entropy summed over the targets of packed windows ``(B, L)``.

    Positions restart at every document (:func:`priorattn.data.document_positions`) and no cache is
    made, so the model treats each restart as a new document, as its own attention does.
    """
    # (1, L) when no window crosses a document: positions shared by the batch keep the routes' fast paths
    positions = document_positions(doc_ids).reshape(-1, tokens.shape[1])  # else (B, L)
    logits = model(input_ids=tokens, position_ids=positions, use_cache=False).logits  # (B, L, V)
    return token_cross_entropy(logits, targets).sum()


def load_extended(path: str | Path) -> tuple[CachedLM, Tokenizer, int]:
    """What ``priorattn eval`` scores in a directory :func:`extend` wrote: the model (eval mode,
    called as the library's GPT), the tokenizer it was tuned with, and the length it was tuned at."""
    path = Path(path)
    model = from_pretrained(path).eval()
    tokenizer = load_tokenizer(read_data_record(path)["tokenizer"], path)
    return CachedLM(model), tokenizer, model.config.priorattn["seq_len"]


@torch.no_grad()
def evaluate(model: PreTrainedModel, packed: PackedSequences, config: TrainConfig) -> float:
    """Mean cross-entropy per target token (nats) over the first ``eval_sequences`` windows."""
    model.eval()
    loss, count = 0.0, 0
    for tokens, targets, doc_ids in eval_batches(packed, config.batch_size, config.eval_sequences):
        loss += float(summed_loss(model, tokens, targets, doc_ids))
        count += int((targets != IGNORE_INDEX).sum())
    return loss / max(count, 1)
