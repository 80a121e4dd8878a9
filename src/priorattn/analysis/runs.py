"""Pictures of training runs: train and validation loss against step, with the unigram baseline."""

from __future__ import annotations

from pathlib import Path

from ..data.prepare import DATA_FILE, read_data_record
from ..figures import captioned_figure, save
from ..train.runs import METRICS_JSONL, read_metrics, run_label


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    """Train loss (left) and validation loss (right) of each run against step, as one PNG."""
    missing = [str(d) for d in run_dirs if not (Path(d) / METRICS_JSONL).exists()]
    if missing:
        raise FileNotFoundError(f"no {METRICS_JSONL} in {', '.join(missing)}")
    caption = (
        "Each line is one training run (the legend names its positional mechanism). Left: the loss "
        "on each training batch; right: the loss on held-out text, one dot per evaluation of the run. "
        "Loss is the cross-entropy of predicting the next token, in nats per token: lower is better. "
        "The dashed line is the unigram baseline, the loss of always predicting each token's overall "
        "frequency while ignoring the context: a run below it has learnt to use the context.\n\n"
        "Look for: which run falls fastest and ends lowest, a gap between left and right "
        "(overfitting), and flat stretches (plateaus), where a run has not yet learnt to use "
        "positions."
    )
    fig, panel = captioned_figure((11, 4.6), caption)
    train_ax, val_ax = panel.subplots(1, 2, sharey=True)
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
            label = f"unigram baseline ({baseline:.3f}): no use of context"
            ax.axhline(baseline, color="0.4", linestyle="--", linewidth=1, label=label)
    for ax, title in ((train_ax, "Loss on training batches"), (val_ax, "Loss on held-out text")):
        ax.set_title(title)
        ax.set(xlabel="training step", ylabel="loss (nats per token; lower is better)")
        ax.grid(alpha=0.3)
    val_ax.legend(fontsize=8)
    panel.suptitle("Training curves")
    return save(fig, Path(out))
