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
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from ...data import read_data_record, run_documents
from ...files import prepare_out, read_json, write_json_atomic
from ...train import load_run
from ...train.runs import METRICS_JSONL, read_metrics
from ..styles import mechanism_label
from .config import DNAConfig
from .measures import gc_trajectory, match_rate, nan_mean, pearson

RESULTS_JSON = "results.json"
MODEL_JSON = "dna.json"


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
    settings = asdict(config) | {"models": None, "budget": None}  # what a model's results depend on
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
        scale=config.scale.record(),
        settings=settings,
        unigram_bits_per_base=read_data_record(out / "models" / config.models[0])["unigram_loss"]
        / math.log(2),
        import_rss_mb=peak_memory_mb([]),
        models={name: {k: v for k, v in m.items() if k != "settings"} for name, m in models.items()},
    )
    from .plots import plot_continuations, plot_efficiency, plot_nll

    plot_nll(results, out / "nll.png", run=config.scale)
    plot_efficiency(results, out / "efficiency.png", run=config.scale)
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
        label=mechanism_label(name),
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
