"""``priorattn dna``: its measures written out by hand, its config, and a tiny end-to-end run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from factories import exit_code, figure_title

from priorattn import cli
from priorattn.studies.dna import DNAConfig, dna, gc_trajectory, match_rate, pearson
from priorattn.studies.dna.experiment import peak_memory_mb


def test_match_rate_counts_equal_bases():
    assert match_rate("ACGT", "ACGA") == 0.75
    assert match_rate("AAAA", "CCCC") == 0.0
    with pytest.raises(ValueError, match="sequences of one non-zero length, got 3, 4"):
        match_rate("ACG", "ACGT")


def test_gc_trajectory_is_the_sliding_window_gc_percentage():
    # windows of 2: "GA" 50, "AC" 50, "CC" 100, "CT" 50, "Tg" 50 (lower case counts)
    assert gc_trajectory("GACCTg", 2).tolist() == [50.0, 50.0, 100.0, 50.0, 50.0]
    assert gc_trajectory("ATAT", 4).tolist() == [0.0]
    with pytest.raises(ValueError, match=r"window must be in \[1, 4\]"):
        gc_trajectory("ATAT", 5)


def test_pearson_is_numpys_and_undefined_for_a_constant_series():
    x, y = np.array([1.0, 2.0, 4.0]), np.array([2.0, 1.0, 5.0])
    mx, my = x.mean(), y.mean()
    r = ((x - mx) * (y - my)).sum() / math.sqrt(((x - mx) ** 2).sum() * ((y - my) ** 2).sum())
    assert pearson(x, y) == pytest.approx(r)
    assert pearson(x, np.full(3, 50.0)) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(models=["goat", "gauss"]), "unknown mechanism 'gauss'"),
        (dict(models=[]), "models must name at least one mechanism"),
        (dict(gc_window=300), "gc_window=300 must be at most new_bases=200"),
    ],
)
def test_bad_configs_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DNAConfig(**kwargs)


def test_budget_scales_steps():
    assert DNAConfig.for_budget(0.5).steps == 200
    assert DNAConfig.for_budget(0.001).steps == 10
    with pytest.raises(ValueError, match="budget must be a positive number"):
        DNAConfig.for_budget(float("nan"))


def test_each_model_trains_with_its_mechanisms_flags(tmp_path):
    config = DNAConfig(genome=str(tmp_path / "g.fa"))
    parser = cli.build_parser()
    for name, expected in [("goat", ("prior", "goat")), ("rope", ("encoding", "rope"))]:
        args = parser.parse_args(config.train_argv(name, tmp_path / name, progress=False))
        assert getattr(args, expected[0]) == expected[1]
        assert (args.data, args.seq_len, args.steps, args.resume) == (config.source, 512, 400, True)
    for name, ssmax in [("bam", False), ("bam+ssmax", True)]:  # a flag not given is the preset's
        args = parser.parse_args(config.train_argv(name, tmp_path / name, progress=False))
        model, _ = cli.train.train_configs(args)
        assert (model.prior, model.ssmax) == ("ggd", ssmax)


def test_peak_memory_is_the_childs_own_not_the_parents():
    """Linux carries a parent's resident size at fork into the child's ru_maxrss; VmHWM is the
    child's own: growing this process by 400 MB leaves the measure where it was."""
    before = peak_memory_mb([])
    ballast = bytearray(400 * 2**20)
    ballast[:: 2**12] = b"x" * len(range(0, len(ballast), 2**12))  # one byte per page: resident
    after = peak_memory_mb([])
    assert 50 < after < before + 100
    del ballast


def test_peak_memory_of_a_failing_command_is_an_error():
    with pytest.raises(RuntimeError, match="priorattn train --steps 0 ... failed with exit code 2"):
        peak_memory_mb(["train", "--steps", "0", "--out", "/nonexistent/run"])


@pytest.fixture
def genome(tmp_path, monkeypatch):
    """A FASTA genome of 40 kb with codon-like structure, and a token cache of this test's own."""
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    codons = ["".join(rng.choice(list("ACGT"), 3)) for _ in range(16)]
    sequence = "".join(rng.choice(codons, 40_000 // 3))
    lines = [sequence[i : i + 70] for i in range(0, len(sequence), 70)]
    path = tmp_path / "genome.fa"
    path.write_text(">chr test genome\n" + "\n".join(lines) + "\n")
    return path


def test_a_tiny_run_writes_results_and_figures_and_is_reused(genome, tmp_path):
    config = DNAConfig(
        models=["goat"], genome=str(genome), seq_len=32, steps=2, batch_size=2,
        continuations=2, prompt_bases=16, new_bases=30, gc_window=10,
    )  # fmt: skip
    out = tmp_path / "out"
    logged = []
    results = dna(config, out, progress=False, log=logged.append)
    goat = results["models"]["goat"]
    assert goat["label"] == "GOAT" and goat["bits_per_base"] == pytest.approx(goat["val_nll"] / math.log(2))
    assert goat["peak_rss_mb"] > results["import_rss_mb"] > 50 and goat["tokens_per_s"] > 0
    assert len(goat["continuations"]) == 2
    for sample in goat["continuations"]:
        assert len(sample["generated"]) == len(sample["truth"]) == 30 and len(sample["prompt"]) == 16
        assert sample["match_rate"] == match_rate(sample["generated"], sample["truth"])
    assert goat["match_rate"] == np.mean([s["match_rate"] for s in goat["continuations"]])
    assert 1.9 < results["unigram_bits_per_base"] <= 2.0  # 4 near-equally frequent bases
    assert json.loads((out / "results.json").read_text())["models"]["goat"]["val_nll"] == goat["val_nll"]
    assert all((out / name).stat().st_size > 0 for name in ("nll.png", "efficiency.png", "continuations.png"))
    assert results["scale"] == dict(steps=2, default_steps=400, budget=1.0, up_to=False, smoke=True)
    for name in ("nll.png", "efficiency.png", "continuations.png"):
        assert figure_title(out / name).startswith("SMOKE RUN (budget 1): 2 training steps per model")
    again = dna(config, out, progress=False, log=logged.append)
    assert logged[-1].startswith("[1/1] goat: reusing") and again["models"] == results["models"]


def test_the_budget_sets_the_steps_and_a_run_below_it_is_a_smoke_run():
    assert DNAConfig.for_budget(0.1).scale.record() == dict(
        steps=40, default_steps=400, budget=0.1, up_to=False, smoke=True
    )
    assert not DNAConfig.for_budget(1).scale.smoke


def test_a_missing_genome_says_how_to_fetch_one(tmp_path, capsys):
    argv = ["dna", "--out", str(tmp_path / "out"), "--genome", str(tmp_path / "none.fa"), "--quiet"]
    assert exit_code(argv) == 2
    assert "`make genomes` fetches bacterial genomes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
