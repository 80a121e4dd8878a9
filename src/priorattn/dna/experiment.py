"""``priorattn dna``: nucleotide-level language models on a bacterial genome that differ only in how
position enters, trained alike and compared as seed 000 Fig. 4 does (GOAT vs RoPE, plus ALiBi).

Each model is the ``tiny`` preset trained with ``priorattn train`` in a child process on the regions
of one genome (:mod:`priorattn.data.fasta`; one byte token per base), so its peak memory is the
child's own. Measured per model: validation NLL and bits per base (Fig. 4a), training tokens/s and
peak resident memory (Fig. 4b), and sampled 200-nt continuations of held-out prompts scored by
base-wise match to the true sequence and by the Pearson correlation of their sliding-window GC%
with the truth's (Fig. 4c). A re-run reuses every model whose settings did not change.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data import read_data_record, run_documents
from ..eval.compare import models as positional_models
from ..files import prepare_out, read_json, write_json_atomic
from ..train import load_run
from ..train.runs import METRICS_JSONL, read_metrics

DEFAULT_GENOME = "~/.cache/priorattn/genomes/E.Coli/references/MG1655-K12.fasta.gz"
DEFAULT_MODELS = ("goat", "rope", "alibi")
RESULTS_JSON = "results.json"
MODEL_JSON = "dna.json"
BASES = "ACGT"


@dataclass
class DNAConfig:
    """What ``dna`` trains and measures; :meth:`for_budget` makes one from ``--budget``.

    The default (budget 1) trains each tiny model for 400 steps of 8 x 512 bases of E. coli K-12
    MG1655 (``make genomes``) and samples 3 continuations of 200 bases after 256-base prompts.
    """

    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    genome: str = DEFAULT_GENOME
    preset: str = "tiny"
    seq_len: int = 512
    steps: int = 400
    batch_size: int = 8
    seed: int = 0
    continuations: int = 3
    prompt_bases: int = 256
    new_bases: int = 200
    gc_window: int = 25  # seed 000 Fig. 4c
    temperature: float = 1.0

    def __post_init__(self):
        known = list(positional_models())
        unknown = [m for m in self.models if m not in known]
        if unknown or not self.models:
            raise ValueError(f"unknown model {unknown[0] if unknown else None!r}: use some of {known}")
        if not self.gc_window <= self.new_bases:
            raise ValueError(f"gc_window={self.gc_window} must be at most new_bases={self.new_bases}")

    @classmethod
    def for_budget(cls, budget: float = 1.0, models: Sequence[str] | None = None, **fields) -> DNAConfig:
        """Training steps scale with ``budget`` (at least 10)."""
        if not budget > 0 or not math.isfinite(budget):
            raise ValueError(f"budget must be a positive number, got {budget!r}")
        return cls(models=list(models or DEFAULT_MODELS), steps=max(10, round(400 * budget)), **fields)

    def train_argv(self, name: str, run_dir: Path, progress: bool) -> list[str]:
        """The ``priorattn train`` command line of model ``name``."""
        argv = ["train", "--preset", self.preset, "--seq-len", str(self.seq_len), "--data", self.source]
        argv += ["--batch-size", str(self.batch_size), "--steps", str(self.steps), "--seed", str(self.seed)]
        argv += ["--warmup", str(min(100, self.steps // 10)), "--eval-every", "0", "--save-every", "0"]
        for flag, value in positional_models()[name][1].items():
            argv += [f"--{flag}"] if value is True else [f"--{flag}", str(value)]
        return argv + ["--out", str(run_dir), "--resume"] + ([] if progress else ["--quiet"])

    @property
    def source(self) -> str:
        return f"fasta:{Path(self.genome).expanduser()}"


def dna(config: DNAConfig, out: str | Path, *, progress: bool = True, log=print) -> dict:
    """Train and measure every model of ``config`` into ``out``; write ``results.json`` and the
    figures; return the results."""
    genome = Path(config.genome).expanduser()
    if not genome.exists():
        raise FileNotFoundError(
            f"no genome at {genome}: `make genomes` fetches bacterial genomes (the Debian package "
            "ragout-examples) into ~/.cache/priorattn/genomes, or give a FASTA file with --genome"
        )
    out = prepare_out(out)
    settings = asdict(config) | {"models": None}  # what a model's results depend on
    models = {}
    for i, name in enumerate(config.models, 1):
        run_dir = out / "models" / name
        saved = run_dir / MODEL_JSON
        if saved.is_file() and read_json(saved)["settings"] == settings:
            log(f"[{i}/{len(config.models)}] {name}: reusing {saved}")
            models[name] = read_json(saved)
            continue
        log(f"[{i}/{len(config.models)}] {name}: training {config.steps} steps in {run_dir}")
        peak_rss = peak_memory_mb(config.train_argv(name, run_dir, progress))
        models[name] = measure(config, name, run_dir) | dict(peak_rss_mb=peak_rss, settings=settings)
        write_json_atomic(saved, models[name])
    results = dict(
        genome=str(genome),
        settings=settings,
        unigram_bits_per_base=read_data_record(out / "models" / config.models[0])["unigram_loss"]
        / math.log(2),
        import_rss_mb=peak_memory_mb([]),
        models={name: {k: v for k, v in m.items() if k != "settings"} for name, m in models.items()},
    )
    from .plots import plot_continuations, plot_efficiency, plot_nll

    plot_nll(results, out / "nll.png")
    plot_efficiency(results, out / "efficiency.png")
    plot_continuations(results, config, out / "continuations.png")
    write_json_atomic(out / RESULTS_JSON, results)
    return results


# What the child runs: the priorattn command line it is given (or, given none, only the imports a
# training run makes), then it writes its own peak resident memory to the file named first. VmHWM is
# the high-water mark of the memory map that exec started afresh; the child's ru_maxrss would not
# do: Linux carries the parent's resident size at fork into it.
_MEASURED_CHILD = """
import sys
from pathlib import Path
if sys.argv[2:]:
    from priorattn.cli import main
    code = main(sys.argv[2:])
else:
    import priorattn.train
    code = 0
status = Path("/proc/self/status").read_text().splitlines()
Path(sys.argv[1]).write_text(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
sys.exit(code)
"""


def peak_memory_mb(argv: list[str]) -> float:
    """Run ``python -m priorattn *argv`` in a child process to its end and return the child's own
    peak resident memory in MB; with ``argv=[]`` the child only imports what training imports. A
    failing command raises with its exit code. Linux only (``/proc``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "peak_kib"
        code = subprocess.call([sys.executable, "-c", _MEASURED_CHILD, str(report), *argv])
        if code != 0:
            raise RuntimeError(f"priorattn {' '.join(argv[:3])} ... failed with exit code {code}")
        return int(report.read_text()) / 1024


def measure(config: DNAConfig, name: str, run_dir: Path) -> dict:
    """Validation NLL, throughput and sampled continuations of model ``name`` trained in ``run_dir``."""
    records = read_metrics(run_dir / METRICS_JSONL)
    val_nll = next(r["val_loss"] for r in reversed(records) if "val_loss" in r)
    # The median over the logged windows but the first (start-up); the machine may be shared.
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    samples = continuations(config, run_dir)
    return dict(
        label=positional_models()[name][0],
        val_nll=val_nll,
        bits_per_base=val_nll / math.log(2),
        tokens_per_s=statistics.median(speeds[1:] or speeds),
        match_rate=statistics.mean(s["match_rate"] for s in samples),
        gc_pearson=nan_mean([s["gc_pearson"] for s in samples]),
        continuations=samples,
    )


def continuations(config: DNAConfig, run_dir: Path) -> list[dict]:
    """``config.continuations`` sampled continuations of prompts cut from held-out regions, each with
    the true bases that follow, its match rate and its GC% correlation with the truth."""
    run = load_run(run_dir)
    regions = [doc.read() for doc in run_documents(run_dir, "val")]
    span = config.prompt_bases + config.new_bases
    regions = [r for r in regions if len(r) >= span]
    if not regions:
        raise ValueError(f"no validation region holds {span} bases (prompt + continuation)")
    rng = np.random.default_rng(config.seed)
    # Every model samples with the same random numbers (common random numbers): where two models
    # predict alike they write alike, so the differences between continuations are the models'.
    generator = torch.Generator().manual_seed(config.seed)
    samples = []
    for _ in range(config.continuations):
        region = regions[rng.integers(len(regions))]
        start = int(rng.integers(len(region) - span + 1))
        prompt = region[start : start + config.prompt_bases]
        truth = region[start + config.prompt_bases : start + span]
        tokens = torch.tensor([run.tokenizer.encode(prompt)])
        with torch.no_grad():
            new = run.model.generate(
                tokens, config.new_bases, temperature=config.temperature, generator=generator
            )
        # One character per sampled token, so a byte that is no base (U+FFFD) is one mismatch.
        generated = "".join(run.tokenizer.decode([t]) for t in new[0, tokens.shape[1] :].tolist())
        gc_generated, gc_truth = (
            gc_trajectory(generated, config.gc_window),
            gc_trajectory(truth, config.gc_window),
        )
        samples.append(
            dict(
                prompt=prompt,
                truth=truth,
                generated=generated,
                match_rate=match_rate(generated, truth),
                gc_pearson=pearson(gc_generated, gc_truth),
            )
        )
    return samples


def match_rate(generated: str, truth: str) -> float:
    """The fraction of positions where ``generated`` has ``truth``'s base (seed 000 Fig. 4c colours)."""
    if len(generated) != len(truth) or not truth:
        raise ValueError(
            f"match_rate needs sequences of one non-zero length, got {len(generated)}, {len(truth)}"
        )
    return sum(a == b for a, b in zip(generated, truth)) / len(truth)


def gc_trajectory(sequence: str, window: int) -> np.ndarray:
    """GC% of each window of ``window`` bases sliding by one: ``len - window + 1`` values in [0, 100]."""
    if not 1 <= window <= len(sequence):
        raise ValueError(f"window must be in [1, {len(sequence)}] (the sequence's length), got {window}")
    gc = np.array([base in "GC" for base in sequence.upper()], dtype=np.float64)
    return 100 * np.convolve(gc, np.ones(window), mode="valid") / window


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson's r of two equally long series; ``None`` where one is constant (r is undefined)."""
    if x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def nan_mean(values: list[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return statistics.mean(defined) if defined else None
