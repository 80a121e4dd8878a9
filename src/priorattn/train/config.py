"""``TrainConfig``: everything about a training run that is not the model, as plain data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..checks import check_int
from ..data import KINDS as TOKENIZERS
from ..files import check_text_encoding
from ..mechanisms import legacy_fields

OPTIMIZERS = ("adamw", "radam")
POSITIONS = ("document", "window")
PARALLEL = ("ddp", "fsdp")

#: Fields whose value in a config saved before the field existed is not today's default: that run
#: trained the old way, and must resume (and load) with it. Before ``positions``, windows were
#: counted from their first token.
BEFORE_FIELD_EXISTED = {"positions": "window"}


@dataclass
class TrainConfig:
    """How to train: data, batch, optimizer, schedule, and how often to log, evaluate and save.

    The defaults train the ``tiny`` preset on the embedded corpus in about 6 minutes on 2 CPU cores
    (1200 steps of 16 x 256 bytes, peak lr 3e-3); larger models want a lower ``lr`` and more steps.

    - ``data``: corpus source for :func:`priorattn.data.load_corpus`: a text folder, glob, file or
      ``hf:PATH[:COLUMN]`` (``None``: the embedded Shakespeare works).
    - ``text_encoding``: how ``data``'s text files are decoded.
    - ``tokenizer``: one of ``TOKENIZERS``.
    - ``vocab_size``: the size of a trained BPE (``None``: ``DEFAULT_BPE_VOCAB`` of
      :mod:`priorattn.data.tokenizer`).
    - ``val_fraction``: the fraction of documents held out for validation.
    - ``seq_len``: training sequence length, ``None`` for the model's ``seq_len``. Longer than the
      model's, from ``init_from``, is BAM's context extension (seed 003 App. F.5).
    - ``retrieval_mix``: the fraction of training sequences replaced by synthetic passkey and needle
      samples at the training length (:class:`priorattn.data.retrieval.RetrievalMix`, seed 000's
      retrieval experiments), so a small model learns the retrieval formats that evaluation then
      probes far beyond that length. 0 trains on the corpus alone.
    - ``steps``: optimizer steps.
    - ``positions``: ``"document"`` restarts token positions at every document boundary of a packed
      window (:func:`priorattn.data.document_positions`), so absolute position terms (GOAT's sink,
      sinusoidal encodings) see each document as they would alone; ``"window"`` counts them from
      the window's first token (every run before this option; relative priors and RoPE give the
      same outputs either way, since the document mask keeps attention inside a document).
    - ``batch_size``: sequences per optimizer step over all processes and accumulation steps, so a
      run gives the same updates on one process or several (``batch_size`` must divide evenly by
      ``grad_accum * world_size``).
    - ``grad_accum``: micro-steps (forward and backward passes) per optimizer step.
    - ``optimizer``: ``"adamw"`` or ``"radam"`` (RAdam with decoupled weight decay, as BAM, seed 003
      App. C).
    - ``lr``: the peak learning rate.
    - ``prior_lr``: learning rate of the prior and SSMax parameters (own group, no weight decay, as
      the BAM code), ``None`` for ``lr``.
    - ``weight_decay``: decoupled weight decay of the matrices (not of norms, biases, priors).
    - ``betas``: ``(beta1, beta2)``, the decay rates of the optimizer's first and second moment
      estimates (AdamW and RAdam alike).
    - ``warmup_steps``, ``min_lr_ratio``: the schedule, a linear warmup over ``warmup_steps``, then
      a cosine decay to ``min_lr_ratio * lr`` at ``steps`` (seed 003 App. C: cosine to 0.1x).
    - ``grad_clip``: the largest gradient norm; ``None`` (the flag's 0) clips nothing.
    - ``bf16``: autocast matrix products to bfloat16 (faster where the hardware has bfloat16 units);
      master weights and the loss stay float32.
    - ``compile``: train through ``torch.compile`` of the model's forward and loss (its backward
      too), one graph per step's shapes; the first step compiles. Losses match an eager run's to
      float rounding, not bit for bit; evaluation stays eager.
    - ``seed``: the seed of the model's initial weights and of the batches.
    - ``parallel``: how the processes of a ``torchrun`` run share the model. ``"ddp"``: each
      holds all of it (DistributedDataParallel; on one process, the plain model). ``"fsdp"``: each
      transformer block and the whole model are sharded over the processes (FSDP2's
      ``fully_shard``), so each holds ``1 / world_size`` of the parameters, gradients and optimizer
      state; prior and SSMax parameters stay whole on every process (few, float32, their own
      optimizer group). Checkpoints are then sharded (each process writes its shard) and resume
      on any number of processes; a new FSDP run needs two or more.
    - ``mixed_precision``: under ``parallel="fsdp"``, each block computes with its parameters
      gathered in bfloat16 and reduces gradients in float32 (the shards, and the prior and SSMax
      parameters, stay float32).
    - ``checkpoint_activations``: keep only each block's input during the forward pass and
      recompute the block's activations in the backward (activation checkpointing per block):
      less memory for about one more forward pass; the same losses.
    - ``log_every``, ``eval_every``, ``save_every``: in optimizer steps; 0 turns evaluation or
      intermediate checkpoints off (the last step is always evaluated and saved).
    - ``eval_sequences``: the validation sequences of each evaluation (``None``: all of them).
    - ``keep_checkpoints``: how many of the newest checkpoints stay on disk; resuming falls back to
      an older one when the newest is damaged.
    - ``init_from``: a run directory whose final model weights start this run (the optimizer starts
      fresh), e.g. to continue training at a longer ``seq_len``.

    The auxiliary losses a model adds (the scalar heads' regularizers) are options of its attention
    mechanism (``GPTConfig.attention_options``), not fields here.
    """

    data: str | None = None
    text_encoding: str = "utf-8"
    tokenizer: str = "byte"
    vocab_size: int | None = None
    val_fraction: float = 0.1
    seq_len: int | None = None
    retrieval_mix: float = 0.0
    positions: str = "document"
    steps: int = 1200
    batch_size: int = 16
    grad_accum: int = 1
    optimizer: str = "adamw"
    lr: float = 3e-3
    prior_lr: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    bf16: bool = False
    compile: bool = False
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200
    eval_sequences: int | None = 128
    save_every: int = 200
    keep_checkpoints: int = 2
    init_from: str | None = None
    parallel: str = "ddp"
    mixed_precision: bool = False
    checkpoint_activations: bool = False

    def __post_init__(self):
        for name in ("steps", "batch_size", "grad_accum", "keep_checkpoints"):
            check_int(name, getattr(self, name), low=1)
        for name in ("warmup_steps", "log_every", "eval_every", "save_every", "seed"):
            check_int(name, getattr(self, name), low=0)
        for name in ("seq_len", "vocab_size", "eval_sequences"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), low=1)
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"batch_size={self.batch_size} must be a multiple of grad_accum={self.grad_accum}"
            )
        check_text_encoding(self.text_encoding)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {PARALLEL}, got {self.parallel!r}")
        if self.mixed_precision and self.parallel != "fsdp":
            raise ValueError(
                "mixed_precision=True gathers FSDP's parameters in bfloat16: it needs parallel='fsdp' "
                "(with DDP, bf16=True autocasts)"
            )
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if not 0.0 <= self.retrieval_mix <= 1.0:
            raise ValueError(f"retrieval_mix must be in [0, 1], got {self.retrieval_mix!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
        for name in ("lr", "prior_lr"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.betas = tuple(self.betas)  # a list after a JSON round trip
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """A saved config; fields it predates take :data:`BEFORE_FIELD_EXISTED` or their defaults.
        Fields that are now options of an attention mechanism (the ``reg_*`` of scalar heads) are
        read with the run's model config (:func:`priorattn.train.runs.read_run_configs`)."""
        unknown = set(data) - {f.name for f in fields(cls)}
        moved = sorted(unknown & set(legacy_fields()))
        if moved:
            raise ValueError(
                f"TrainConfig fields {moved} are now options of the attention mechanism "
                "(GPTConfig.attention_options): read a run's config.json with read_run_configs"
            )
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {sorted(unknown)}")
        return cls(**(BEFORE_FIELD_EXISTED | data))
