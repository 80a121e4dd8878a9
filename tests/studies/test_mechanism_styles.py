"""Every study names and draws a mechanism the same way (``studies.styles``), distinct mechanisms
look distinct, and the figures with a line per mechanism are legible at a report page's width."""

from __future__ import annotations

import struct

import pytest
from matplotlib.lines import Line2D
from matplotlib.text import Text

from priorattn.eval import plots as eval_plots
from priorattn.figures import DPI, PAGE_WIDTH, RunScale
from priorattn.models.named import NAMED_MODELS, mechanisms
from priorattn.studies.compare import report as compare_report
from priorattn.studies.dna import plots as dna_plots
from priorattn.studies.dna.config import DNAConfig
from priorattn.studies.retrieval import figures as retrieval_figures
from priorattn.studies.retrieval.study import RetrievalStudyConfig
from priorattn.studies.styles import LABELS, POSITION_STYLES, mechanism_label, mechanism_style
from priorattn.studies.vision import experiment as vision

RUN = RunScale(2, 600, 1.0)
COMPARED = ["nope", "sinusoidal", "rope", "local_rope", "alibi", "bam+ssmax", "goat"]


def test_distinct_mechanisms_are_drawn_in_distinct_colour_and_line_style_pairs():
    extensions = ["rope_pi", "rope_ntk", "rope_yarn"]  # the retrieval study's (study.EXTENSIONS)
    drawn = [*mechanisms(), *extensions, *(e + "+ssmax" for e in extensions), "learned", "learned+ssmax"]
    pairs = [(mechanism_style(m)["color"], str(mechanism_style(m)["linestyle"])) for m in drawn]
    assert len(set(pairs)) == len(drawn)
    assert set(NAMED_MODELS) <= set(POSITION_STYLES)  # every named model is chosen, not cycled
    compared = ["nope", "sinusoidal", "rope", "local_rope", "alibi", "bam", "goat"]  # compare's models
    for key in ("color", "marker"):
        assert len({mechanism_style(m)[key] for m in compared}) == len(compared)
    assert mechanism_style("bam+ssmax") == mechanism_style("bam") | dict(linestyle="--")
    assert mechanism_style("rope_pi")["color"] == mechanism_style("rope")["color"]
    with pytest.raises(ValueError, match="unknown mechanism 'xpos'"):
        mechanism_style("xpos")


def test_every_named_model_has_a_label_and_a_registered_prior_its_class_name():
    assert set(NAMED_MODELS) <= set(LABELS)
    assert mechanism_label("bam+ssmax") == "BAM + SSMax" and mechanism_label("fox+ssmax") == "FoX + SSMax"
    assert mechanism_label("ggd+ssmax") == "GGD + SSMax"  # a registered prior: its class names it
    assert mechanism_label("rope_yarn") == "RoPE YaRN"
    with pytest.raises(ValueError, match="unknown mechanism 'xpos'"):
        mechanism_label("xpos")


@pytest.fixture
def drawn(monkeypatch):
    """The figures the studies save, by file name, instead of only their files."""
    figures = {}

    def keep(fig, path):
        figures[path.name] = fig
        fig.savefig(path, dpi=DPI)
        return path

    for module in (eval_plots, retrieval_figures, dna_plots, vision):
        monkeypatch.setattr(module, "save", keep)
    return figures


def lines(fig, label: str) -> list[Line2D]:
    return [line for line in fig.findobj(Line2D) if line.get_label().startswith(label)]


def style_of(line: Line2D) -> dict:
    return dict(color=line.get_color(), marker=line.get_marker(), linestyle=line.get_linestyle())


def compare_figures(tmp_path) -> None:
    lengths = [64, 128, 256]
    ppl = dict(
        lengths=lengths,
        ppl=[6.0, 6.1, 6.2],
        train_len=64,
        paired_delta=[None, 0.01, 0.02],
        paired_delta_se=[None, 0.01, 0.01],
        position_loss=[dict(edges=[1, 2, 4, 257], loss=[2.0, 2.1, 2.2])],
    )
    results = {name: dict(label=mechanism_label(name), ppl=ppl, passkey=None) for name in COMPARED}
    compare_report.draw_figures(results, tmp_path, RUN)


def retrieval_figure(tmp_path) -> None:
    config = RetrievalStudyConfig(mechanisms=["goat", "bam+ssmax", "alibi"], factors=[1, 2])
    cell = dict(lengths=config.lengths(), accuracy=[1.0, 0.5], low=[0.9, 0.3], high=[1.0, 0.7])
    summary = {
        m: dict(label=mechanism_label(m), tasks={t: cell for t in config.tasks}) for m in config.mechanisms
    }
    retrieval_figures.plot_accuracy(config, summary, tmp_path / "retrieval_accuracy.png")


def dna_figure(tmp_path) -> None:
    sample = dict(prompt="ACGT" * 4, truth="ACGTACGTAC" * 3, generated="ACGTTCGTAC" * 3)
    models = {
        name: dict(label=mechanism_label(name), gc_pearson=0.5, match_rate=0.9, continuations=[sample])
        for name in ("goat", "rope", "alibi")
    }
    config = DNAConfig(new_bases=30, gc_window=10, prompt_bases=16, steps=2)
    dna_plots.plot_continuations(dict(models=models), config, tmp_path / "continuations.png")


def vision_figure(tmp_path) -> None:
    results = {name: dict(accuracy={"28": 0.8, "56": 0.4}) for name in ("goat", "rope", "learned")}
    vision.plot_accuracy(results, [28, 56], tmp_path / "accuracy.png", run=RUN)


def test_a_mechanism_has_one_style_in_every_studys_figures(drawn, tmp_path):
    compare_figures(tmp_path)
    retrieval_figure(tmp_path)
    dna_figure(tmp_path)
    vision_figure(tmp_path)
    goat = mechanism_style("goat")
    for name, label in (
        ("ppl.png", "GOAT"),
        ("retrieval_accuracy.png", "GOAT"),
        ("continuations.png", "GOAT"),
        ("accuracy.png", "goat"),
    ):
        found = lines(drawn[name], label)
        assert found, name
        for line in found:  # in the dna figure the GC% line leaves out the markers
            assert style_of(line) | dict(marker=goat["marker"]) == goat, name
    bam = [style_of(line) for line in lines(drawn["ppl.png"], "BAM + SSMax")]
    assert bam and all(s == mechanism_style("bam+ssmax") for s in bam)
    assert {
        style_of(line)["linestyle"] for line in lines(drawn["retrieval_accuracy.png"], "BAM + SSMax")
    } == {"--"}


def test_the_compare_perplexity_figure_is_legible_at_the_pages_width(drawn, tmp_path):
    compare_figures(tmp_path)
    with open(tmp_path / "ppl.png", "rb") as png:
        width = struct.unpack(">I", png.read(24)[16:20])[0]
    assert width <= round(PAGE_WIDTH * DPI)  # shown at its own size: the text is not shrunk
    texts = [t for t in drawn["ppl.png"].findobj(Text) if t.get_text().strip()]
    assert min(t.get_fontsize() for t in texts) >= 10
    colours = {
        style_of(line)["color"]
        for name in COMPARED
        for line in lines(drawn["ppl.png"], mechanism_label(name))
    }
    assert len(colours) == len(COMPARED)  # seven models, seven colours
    assert all(line.get_linewidth() >= 2 for line in lines(drawn["ppl.png"], "GOAT"))
