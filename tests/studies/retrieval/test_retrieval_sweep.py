"""The retrieval sweep: its cells, which verdicts hold or flip across them, the run and its command."""

from __future__ import annotations

import json

import pytest

from priorattn.studies.retrieval.study import RetrievalStudyConfig
from priorattn.studies.retrieval.sweep import across, run_retrieval_sweep, status_of, sweep_cells


def test_the_sweep_crosses_two_sizes_with_two_training_lengths_and_keeps_the_rest():
    config = RetrievalStudyConfig.for_budget(0.5, mechanisms=["nope", "bam+ssmax"], seeds=[0, 1, 2])
    cells = sweep_cells(config)
    shapes = {name: (c.n_layers, c.d_model, c.n_heads, c.train_len) for name, c in cells.items()}
    assert shapes == {
        "2x64-T64": (2, 64, 2, 64),
        "2x64-T256": (2, 64, 2, 256),
        "4x128-T64": (4, 128, 4, 64),
        "4x128-T256": (4, 128, 4, 256),
    }
    for cell in cells.values():
        assert (cell.mechanisms, cell.seeds, cell.steps, cell.budget) == (
            ["nope", "bam+ssmax"],
            [0, 1, 2],
            config.steps,
            0.5,
        )
    assert cells["2x64-T256"].lengths()[-1] == 64 * 256


@pytest.mark.parametrize(
    ("values", "status"),
    [
        ([True, True, True, True], "holds"),
        ([False, False, False, False], "holds"),
        ([True, False, True, True], "flips"),
        ([True, None, None, True], "partly judged"),
        ([None, None, None, None], "not judged"),
        (["BAM", "BAM", "tie", "BAM"], "flips"),
    ],
)
def test_a_verdict_holds_only_where_every_cell_judged_it_alike(values, status):
    assert status_of(values) == status


def test_across_sets_each_verdict_beside_its_counterparts():
    def cell(agrees, winner, judged=None):
        return dict(
            seed_claims=[dict(claim="RoPE collapses beyond T", task="passkey", agrees=agrees)],
            ssmax=[dict(position="bam", task="passkey", winner=winner, judged=judged)],
            winners=[dict(task="passkey", winner=None, tied=["BAM", "NoPE"])],
        )

    found = across({"a": cell(True, "BAM + SSMax"), "b": cell(False, None), "c": cell(None, None, "cannot")})
    (claim,) = found["claims"]
    assert claim["cells"] == {"a": True, "b": False, "c": None} and claim["status"] == "flips"
    (ssmax,) = found["ssmax"]
    assert ssmax["what"] == "BAM" and ssmax["cells"] == {"a": "BAM + SSMax", "b": "tie", "c": None}
    (best,) = found["winners"]
    assert best["cells"]["a"] == "tie: BAM, NoPE" and best["status"] == "holds"


def test_the_sweep_runs_every_cell_and_reports_across_them(tmp_path):
    config = RetrievalStudyConfig(
        mechanisms=["nope"], seeds=[0], steps=2, batch_size=2, factors=[1], prompts=1, depths=1
    )
    data = run_retrieval_sweep(config, tmp_path, workers=1, progress=False, log=lambda message: None)
    assert set(data["cells"]) == {"2x64-T64", "2x64-T256", "4x128-T64", "4x128-T256"}
    for name in data["cells"]:
        assert (tmp_path / "cells" / name / "results.json").exists()
        assert (tmp_path / "cells" / name / "report.html").exists()  # each cell a study of its own
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["cells"]["4x128-T256"]["config"]["d_model"] == 128 and set(saved["seconds"]) == set(
        data["cells"]
    )
    assert {r["task"] for r in saved["across"]["claims"]} == {"passkey"}
    page = (tmp_path / "report.html").read_text()
    assert "across the sweep" in page and "Cell 4x128-T256" in page


def test_the_retrieval_command_runs_the_sweep(tmp_path, monkeypatch, capsys):
    from priorattn import cli
    from priorattn.studies.retrieval import sweep

    given = []
    monkeypatch.setattr(sweep, "run_retrieval_sweep", lambda config, out, **options: given.append(config))
    assert cli.main(["retrieval", "--out", str(tmp_path), "--sweep", "--budget", "0.1", "--quiet"]) == 0
    assert given[0].budget == 0.1
    with pytest.raises(SystemExit):
        cli.main(["retrieval", "--out", str(tmp_path / "x"), "--sweep", "--train-len", "128", "--quiet"])
    assert "--train-len with --sweep" in capsys.readouterr().err
