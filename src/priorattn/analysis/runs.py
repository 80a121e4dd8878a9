"""Pictures of training runs: train and validation loss against step, with the unigram baseline."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..data.prepare import DATA_FILE, read_data_record
from ..files import read_json
from ..train.runs import CONFIG_JSON, METRICS_JSONL, read_metrics
from .plots import save


def run_label(run_dir: Path) -> str:
    """``prior / encoding`` (and ``+ssmax``) from the run's config, else the directory name."""
    path = run_dir / CONFIG_JSON
    if not path.exists():
        return run_dir.name
    model = read_json(path)["model"]
    return f"{model['prior']} / {model['encoding']}" + (" + ssmax" if model["ssmax"] else "")


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    """Train loss (left) and validation loss (right) of each run against step, as one PNG."""
    missing = [str(d) for d in run_dirs if not (Path(d) / METRICS_JSONL).exists()]
    if missing:
        raise FileNotFoundError(f"no {METRICS_JSONL} in {', '.join(missing)}")
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    train_ax, val_ax = fig.subplots(1, 2, sharey=True)
    baselines = set()
    for run_dir in map(Path, run_dirs):
        records = read_metrics(run_dir / METRICS_JSONL)
        label = run_label(run_dir)
        train_ax.plot([r["step"] for r in records], [r["train_loss"] for r in records], label=label)
        evaluated = [r for r in records if "val_loss" in r]
        val_ax.plot(
            [r["step"] for r in evaluated], [r["val_loss"] for r in evaluated], marker="o", label=label
        )
        if (run_dir / DATA_FILE).exists():
            baselines.add(round(read_data_record(run_dir)["unigram_loss"], 4))
    for baseline in sorted(baselines):
        for ax in (train_ax, val_ax):
            ax.axhline(baseline, color="0.4", linestyle="--", linewidth=1, label=f"unigram {baseline:.3f}")
    for ax, title in ((train_ax, "train loss"), (val_ax, "validation loss")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    train_ax.set_ylabel("nats / token")
    val_ax.legend(fontsize=8)
    return save(fig, Path(out))
