"""Pictures of training runs: train and validation loss against step, with the unigram baseline."""

from __future__ import annotations

from pathlib import Path

from ..data.prepare import DATA_FILE, read_data_record
from ..files import read_json
from ..priors import read_spec, registered
from ..train.runs import CONFIG_JSON, METRICS_JSONL, read_metrics
from .plots import captioned_figure, save

#: Legend words for the priors not called by their class's name.
PRIOR_WORDS = {"ggd": "GGD (BAM)"}
ENCODING_WORDS = {"rope": "RoPE", "sinusoidal": "sinusoidal encoding", "local_rope": "local RoPE"}


def run_label(run_dir: Path) -> str:
    """The run's positional mechanism in words, from its config ("GOAT prior", "RoPE + SSMax",
    "no positional encoding (NoPE)", "llama + GGD (BAM) prior" for a model from ``hf-extend``);
    the directory name if it has no config."""
    path = run_dir / CONFIG_JSON
    if not path.exists():
        return run_dir.name
    config = read_json(path)
    if "model_type" in config:  # a transformers model
        record = config.get("priorattn") or {}
        parts = [config["model_type"], *prior_words(record.get("prior") or "uniform")]
        return " + ".join(parts) + (" without RoPE" if record.get("remove_rope") else "")
    model = config["model"]
    parts = prior_words(model["prior"])
    if model["encoding"] != "none":
        parts.append(ENCODING_WORDS[model["encoding"]])
    if model["ssmax"]:
        parts.append("SSMax")
    return " + ".join(parts) if parts else "no positional encoding (NoPE)"


def prior_words(spec) -> list[str]:
    """``["GGD (BAM) + GOAT prior"]`` for the spec ``"ggd+goat(num_freqs=3)"`` (or its dict or list
    form); nothing for ``"uniform"``; the spec itself for a prior not registered here."""
    try:
        names = _names(read_spec(spec))
    except ValueError:
        return [f"{spec} prior"]
    words = [PRIOR_WORDS.get(name, registered(name).cls.__name__) for name in names if name != "uniform"]
    return [" + ".join(words) + " prior"] if words else []


def _names(data) -> list[str]:
    return [n for part in data for n in _names(part)] if isinstance(data, list) else [data["name"]]


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
