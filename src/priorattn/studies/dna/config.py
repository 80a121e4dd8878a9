"""What the DNA study trains and measures (:class:`DNAConfig`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...figures import RunScale
from ...models.named import mechanism_fields, split_mechanism

DEFAULT_GENOME = "~/.cache/priorattn/genomes/E.Coli/references/MG1655-K12.fasta.gz"
DEFAULT_MODELS = ("goat", "rope", "alibi")
BASES = "ACGT"
#: Each model's training steps at budget 1.
STEPS = 400


@dataclass
class DNAConfig:
    """What ``dna`` trains and measures; :meth:`for_budget` makes one from ``--budget``.

    The default (budget 1) trains each tiny model for 400 steps of 8 x 512 bases of E. coli K-12
    MG1655 (``make genomes``) and samples 3 continuations of 200 bases after 256-base prompts.

    - ``models``: the mechanisms trained (:mod:`priorattn.models.named`).
    - ``genome``: a FASTA file or directory (``make genomes`` fetches them).
    - ``preset``: the model size every mechanism is trained at (:data:`priorattn.models.PRESETS`).
    - ``seq_len``, ``steps``, ``batch_size``: the training length in bases, each model's optimizer
      steps, and sequences per step.
    - ``seed``: the seed of every model's weights and batches, and of the samples.
    - ``continuations``, ``prompt_bases``, ``new_bases``: how many continuations are sampled from
      held-out regions, each of ``new_bases`` after a prompt of ``prompt_bases``.
    - ``gc_window``: the window of the GC% curves correlated between a continuation and the truth
      (seed 000 Fig. 4c); at most ``new_bases``.
    - ``temperature``: the sampling temperature of the continuations.
    - ``budget``: the one these settings were made for (:attr:`scale`).
    """

    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    genome: str = DEFAULT_GENOME
    preset: str = "tiny"
    seq_len: int = 512
    steps: int = STEPS
    batch_size: int = 8
    seed: int = 0
    continuations: int = 3
    prompt_bases: int = 256
    new_bases: int = 200
    gc_window: int = 25
    temperature: float = 1.0
    budget: float = 1.0

    def __post_init__(self):
        if not self.models:
            raise ValueError(f"models must name at least one mechanism, e.g. {','.join(DEFAULT_MODELS)}")
        for name in self.models:
            split_mechanism(name)
        if not self.gc_window <= self.new_bases:
            raise ValueError(f"gc_window={self.gc_window} must be at most new_bases={self.new_bases}")

    @classmethod
    def for_budget(cls, budget: float = 1.0, models: Sequence[str] | None = None, **fields) -> DNAConfig:
        """Training steps scale with ``budget`` (at least 10)."""
        if not budget > 0 or not math.isfinite(budget):
            raise ValueError(f"budget must be a positive number, got {budget!r}")
        steps = max(10, round(STEPS * budget))
        return cls(models=list(models or DEFAULT_MODELS), steps=steps, budget=budget, **fields)

    @property
    def scale(self) -> RunScale:
        """The budget and steps that ``results.json`` and every figure state."""
        return RunScale(self.steps, STEPS, self.budget)

    def train_argv(self, name: str, run_dir: Path, progress: bool) -> list[str]:
        """The ``priorattn train`` command line of model ``name``."""
        argv = ["train", "--preset", self.preset, "--seq-len", str(self.seq_len), "--data", self.source]
        argv += ["--batch-size", str(self.batch_size), "--steps", str(self.steps), "--seed", str(self.seed)]
        argv += ["--warmup", str(min(100, self.steps // 10)), "--eval-every", "0", "--save-every", "0"]
        for flag, value in mechanism_fields(name).items():
            argv += [f"--{flag}"] if value is True else [f"--{flag}", str(value)]
        return argv + ["--out", str(run_dir), "--resume"] + ([] if progress else ["--quiet"])

    @property
    def source(self) -> str:
        return f"fasta:{Path(self.genome).expanduser()}"
