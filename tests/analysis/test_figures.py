"""Every figure reads without the papers: a caption, axes and legends in words, the masked future
blank. Figures are caught at ``save`` and inspected as matplotlib objects."""

from __future__ import annotations

import json

import numpy as np
import pytest

from priorattn.analysis import learned_plots, plots, runs, views
from priorattn.eval import plots as eval_plots
from priorattn.studies.copy_mixture import CopyMixtureConfig, copy_mixture_job


@pytest.fixture
def caught(monkeypatch):
    """The figures the plot functions save, in order (nothing is written)."""
    figures = []
    for module in (plots, learned_plots, runs, eval_plots):
        monkeypatch.setattr(module, "save", lambda fig, path: figures.append(fig) or path)
    return figures


def words(fig) -> list[str]:
    """Titles, axis labels and legend entries of the panels above the caption."""
    panel = fig.subfigs[0]
    texts = [panel._suptitle.get_text() if panel._suptitle else ""]
    legends = [*panel.legends, *(ax.get_legend() for ax in panel.axes if ax.get_legend())]
    texts += [t.get_text() for legend in legends for t in legend.get_texts()]
    for ax in panel.axes:
        texts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    return [t for t in texts if t]


def check_readable(fig) -> None:
    panel, below = fig.subfigs
    caption = " ".join(t.get_text() for t in below.texts)
    assert len(caption) > 200, "a caption says what is plotted and how to read it"
    titles = [panel._suptitle.get_text() if panel._suptitle else "", *(ax.get_title() for ax in panel.axes)]
    assert any(titles), "a title says what the figure shows"
    for ax in panel.axes:
        if ax.get_title():  # a panel (colorbars have none)
            assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()
    for text in words(fig):
        assert "θ" not in text and "theta" not in text, text  # parameters by name, in words
        assert text.strip().lower() != "none", "a legend says what 'none' means"


def check_future_blank(fig) -> None:
    """Every square (query x key) image is NaN above the diagonal and finite on and below it."""
    squares = 0
    for ax in fig.subfigs[0].axes:
        for image in [*ax.images, *(im for child in ax.child_axes for im in child.images)]:
            values = np.ma.filled(np.ma.asarray(image.get_array(), dtype=float), np.nan)
            if values.ndim == 2 and values.shape[0] == values.shape[1]:
                squares += 1
                above = np.triu(np.ones(values.shape, dtype=bool), 1)
                assert np.isnan(values[above]).all() and np.isfinite(values[~above]).all()
    assert squares


def test_prior_figures_read_without_the_papers(caught, tmp_path):
    plots.plot_priors(tmp_path, length=24, num_heads=2, head=1)
    assert len(caught) == 3
    for fig in caught:
        check_readable(fig)
    for fig in caught[1:]:  # the decomposition and the heatmaps
        check_future_blank(fig)
    curves = caught[0].subfigs[0].axes
    for ax in curves:  # curves stop at the query: keys after it are masked, not drawn
        assert all(line.get_xdata().max() <= 0 for line in ax.get_lines())


def test_learned_goat_figure_reads_without_the_papers(caught, tmp_path):
    config = CopyMixtureConfig(length=8, steps=2, batch_size=4, eval_sequences=4)
    copy_mixture_job(config, tmp_path, progress=False)
    (fig,) = caught
    check_readable(fig)
    check_future_blank(fig)
    assert "copy-mixture" in words(fig)[0]


def run_dir(root, name, **model):
    directory = root / name
    directory.mkdir()
    config = dict(prior="uniform", encoding="none", ssmax=False) | model
    (directory / "config.json").write_text(json.dumps(dict(model=config)))
    records = [dict(step=10, train_loss=2.9), dict(step=20, train_loss=2.8, val_loss=2.85)]
    (directory / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)))
    return directory


def test_run_labels_are_words(tmp_path):
    assert runs.run_label(run_dir(tmp_path, "a")) == "no positional encoding (NoPE)"
    assert runs.run_label(run_dir(tmp_path, "b", prior="alibi+goat")) == "ALiBi + GOAT prior"
    assert runs.run_label(run_dir(tmp_path, "c", encoding="rope", ssmax=True)) == "RoPE + SSMax"
    assert runs.run_label(run_dir(tmp_path, "d", prior="ggd", encoding="local_rope")) == (
        "GGD (BAM) prior + local RoPE"
    )


def test_loss_curves_read_without_the_papers(caught, tmp_path):
    runs.plot_runs([run_dir(tmp_path, "nope"), run_dir(tmp_path, "goat", prior="goat")], tmp_path / "c.png")
    check_readable(caught[0])
    assert "no positional encoding (NoPE)" in words(caught[0])


def ppl_result(train_len=8):
    lengths = [8, 16, 32]
    return dict(
        lengths=lengths,
        ppl=[5.0, 5.5, 6.0],
        paired_delta=[None, 0.1, 0.2],
        paired_delta_se=[None, 0.01, 0.02],
        position_loss=[dict(edges=[1, 2, 4, 8, 16, 33], loss=[2.0, 1.9, 1.8, 1.8, 1.9])] * 3,
        train_len=train_len,
    )


def retrieval_result():
    return dict(
        lengths=[8, 16], depths=[0.0, 0.5, 1.0], accuracy=[[1, 0, 1], [0, 0, 1]], by_length=[0.67, 0.33]
    )


def test_evaluation_figures_read_without_the_papers(caught, tmp_path):
    models = {"NoPE": 0, "GOAT": 1, "ALiBi": 2, "RoPE": 3, "GGD": 4}
    eval_plots.plot_ppl({label: ppl_result() for label in models}, tmp_path / "p.png")
    eval_plots.plot_retrieval_heatmaps({label: retrieval_result() for label in models}, tmp_path / "h.png")
    results = {label: retrieval_result() | dict(train_len=8) for label in models}
    eval_plots.plot_accuracy_vs_length(results, tmp_path / "a.png", title=eval_plots.TASK_TITLES["passkey"])
    for fig in caught:
        check_readable(fig)
    assert "training length" in words(caught[0])  # the dotted line is named


def test_views_of_a_trained_run_read_without_the_papers(caught, make_run, tmp_path):
    goat = make_run(prior="goat")
    views.analyze_priors(goat, tmp_path / "priors", layers=[1])
    views.analyze_sink_mass([goat], tmp_path / "mass", omegas=[0, 1], samples=1)
    views.analyze_attention(goat, tmp_path / "attention", prompt="now is the", layer=0, head=1)
    assert len(caught) == 7  # curves, heatmaps, a decomposition per head (2), sink; sink mass; attention
    for fig in caught:
        check_readable(fig)
    for fig in (*caught[2:4], caught[-1]):  # the heatmaps' left panels show every key, as they say
        check_future_blank(fig)
    assert "training length (32 tokens)" in words(caught[4])  # the sink figure marks it
    assert any("head 0: GOAT recency slope" in text for text in words(caught[0]))
