"""``priorattn eval`` and ``priorattn compare`` from the command line: outputs and clear errors."""

from __future__ import annotations

import json

import pytest
from factories import exit_code, word_salad

from priorattn import cli
from priorattn.eval import niah_job, passkey_job, ppl_job
from priorattn.models import GPTConfig
from priorattn.train import TrainConfig, train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run of a small GOAT model, two steps on word salad (3 kB documents)."""
    root = word_salad(
        tmp_path_factory.mktemp("eval-cli"), "double toil and trouble fire burn cauldron bubble", length=500
    )
    model = GPTConfig(
        vocab_size=256, seq_len=128, d_model=32, n_layers=2, n_heads=2, prior="goat(num_freqs=3)"
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("PRIORATTN_CACHE", str(root / "cache"))
    train(
        model,
        TrainConfig(data=str(root), steps=2, batch_size=2, eval_sequences=2),
        root / "run",
        progress=False,
    )
    mp.undo()
    return root / "run"


def test_eval_writes_results_and_plots(run_dir, tmp_path, capsys):
    out = tmp_path / "ppl"
    assert cli.main(["eval", "ppl", "--run", str(run_dir), "--lengths", "128,256", "--windows", "2",
                     "--out", str(out), "--quiet"]) == 0  # fmt: skip
    result = json.loads((out / "results.json").read_text())
    assert result["lengths"] == [128, 256] and len(result["ppl"]) == 2 and result["tail_loss"][0] is None
    index = json.loads((run_dir / "checkpoint-00000002.json").read_text())
    assert result["checkpoint"] == dict(step=2, sha256=index["sha256"])  # what was scored
    assert (out / "ppl.png").read_bytes()[:4] == b"\x89PNG"
    assert cli.main(["eval", "passkey", "--run", str(run_dir), "--lengths", "128", "--depths", "3",
                     "--trials", "1", "--quiet"]) == 0  # fmt: skip
    result = json.loads((run_dir / "eval" / "passkey" / "results.json").read_text())
    assert result["depths"] == [0.0, 0.5, 1.0] and len(result["accuracy"]) == 1
    drawn = {p.name for p in (run_dir / "eval" / "passkey").iterdir()}
    assert "heatmap.png" in drawn and "accuracy.png" not in drawn  # one length: no line to draw
    assert cli.main(["eval", "niah", "--run", str(run_dir), "--lengths", "160,300", "--variants",
                     "single_repeat,multikey", "--depths", "1", "--trials", "1", "--quiet"]) == 0  # fmt: skip
    result = json.loads((run_dir / "eval" / "niah" / "results.json").read_text())
    assert result["variants"]["single_repeat"]["lengths"] == [160, 300]
    assert result["variants"]["multikey"]["lengths"] == [300]  # its prompt needs more than 160 tokens


def test_eval_reads_other_text_with_its_encoding(run_dir, tmp_path):
    text = tmp_path / "latin1.txt"
    text.write_bytes(("Un café très fort, s'il vous plaît. " * 20).encode("latin-1"))
    argv = ["eval", "ppl", "--run", str(run_dir), "--lengths", "128", "--windows", "1", "--quiet"]
    assert (
        cli.main([*argv, "--data", str(text), "--text-encoding", "latin-1", "--out", str(tmp_path / "o")])
        == 0
    )
    assert json.loads((tmp_path / "o" / "results.json").read_text())["data"] == str(text)


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "ppl", "--run", "{missing}"], "holds no run"),
        (["eval", "ppl", "--run", "{no_checkpoint}"], "no checkpoint"),
        (["eval", "ppl", "--run", "{run}", "--lengths", "0"], "argument --lengths: must be an integer >= 1"),
        (["eval", "ppl", "--run", "{run}", "--lengths", "128,x"], "argument --lengths: expected an integer"),
        (["eval", "ppl", "--run", "{run}", "--data", "{empty}"], "empty corpus"),
        (["eval", "ppl", "--run", "{run}", "--data", "{missing}"], "no such file or directory"),
        (["eval", "ppl", "--run", "{run}", "--lengths", "99999"], "no document of the evaluation text"),
        (["eval", "ppl", "--run", "{run}", "--out", "{file}"], "is a file"),
        (["eval", "ppl", "--run", "{run}", "--tau-length-scaling"], "this model has attention='standard'"),
        (["eval", "ppl", "--run", "{run}", "--data", "{latin1}"], "is not utf-8 text: byte 6 is b'\\xe9'"),
        (
            ["eval", "niah", "--run", "{run}", "--data", "{latin1}", "--text-encoding", "klingon"],
            "--text-encoding='klingon' is not a known text encoding",
        ),
        (["eval", "passkey", "--run", "{run}", "--lengths", "20"], "needs at least"),
        (
            ["eval", "niah", "--run", "{run}", "--variants", "single_bogus"],
            "unknown NIAH variant 'single_bogus'",
        ),
        (["compare", "--out", "{tmp}", "--priors", "nope,xpos"], "unknown mechanism 'xpos'"),
        (["compare", "--out", "{tmp}", "--budget", "0"], "argument --budget: must be a positive number"),
        (["compare", "--out", "{file}", "--budget", "0.1"], "is a file"),
        (
            ["compare", "--out", "{tmp}", "--priors", "nope", "--data", "{missing}"],
            "no such file or directory",
        ),
        (
            ["compare", "--out", "{tmp}", "--text-encoding", "klingon"],
            "--text-encoding='klingon' is not a known text encoding",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(run_dir, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_checkpoint").mkdir()
    (tmp_path / "no_checkpoint" / "config.json").write_text((run_dir / "config.json").read_text())
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "latin1.txt").write_bytes("Le café est fort.".encode("latin-1"))
    paths = dict(
        missing=tmp_path / "missing", no_checkpoint=tmp_path / "no_checkpoint", run=run_dir,
        empty=tmp_path / "empty", file=tmp_path / "file", tmp=tmp_path / "out",
        latin1=tmp_path / "latin1.txt",
    )  # fmt: skip
    argv = [arg.format(**paths) for arg in args]
    assert exit_code(argv + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()[-1]) > 0


def test_compare_trains_on_the_data_given(tmp_path, monkeypatch):
    from priorattn.studies.compare import study as compare_module

    given = []
    monkeypatch.setattr(
        compare_module, "compare", lambda config, out, progress: given.append(config) or {"winners": []}
    )
    argv = [
        "compare",
        "--out",
        str(tmp_path),
        "--priors",
        "nope",
        "--data",
        "text.txt",
        "--text-encoding",
        "latin-1",
    ]
    assert cli.main(argv) == 0
    assert (given[0].data, given[0].text_encoding, given[0].models) == ("text.txt", "latin-1", ["nope"])
    assert given[0].train_config().data == "text.txt" and given[0].train_config().text_encoding == "latin-1"


@pytest.mark.parametrize(
    "job, options, message",
    [
        (ppl_job, dict(lengths=[]), "lengths must be positive integers, got \\[\\]"),
        (ppl_job, dict(lengths=[128], windows=0), "windows must be an int >= 1, got 0"),
        (passkey_job, dict(lengths=[]), "lengths must be positive integers, got \\[\\]"),
        (passkey_job, dict(lengths=[128], depths=0), "the number of depths must be a positive int, got 0"),
        (passkey_job, dict(lengths=[128], digits=0), "digits must be a positive int, got 0"),
        (passkey_job, dict(lengths=[128], seed=-1), "seed must be an int >= 0, got -1"),
        (niah_job, dict(lengths=[]), "lengths must be positive integers, got \\[\\]"),
        (niah_job, dict(lengths=[300], trials=0), "trials must be an int >= 1, got 0"),
    ],
)
def test_jobs_refuse_bad_arguments_with_one_line(run_dir, tmp_path, job, options, message):
    with pytest.raises(ValueError, match=message):
        job(run_dir, tmp_path / "out", progress=False, **options)


def test_a_truncated_checkpoint_is_named_in_one_line_with_the_one_used_instead(tmp_path, capsys, monkeypatch):
    """The newest checkpoint cut short: ``eval`` scores the older one and ``train --resume``
    continues from it, each saying so in one line; the results record the checkpoint scored."""
    (tmp_path / "corpus").mkdir()
    corpus = word_salad(tmp_path / "corpus", "by the pricking of my thumbs something wicked", length=500)
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    config = TrainConfig(data=str(corpus), steps=2, batch_size=2, eval_sequences=2, save_every=1)
    train(
        GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_layers=2, n_heads=2), config, run, progress=False
    )
    newest = run / "checkpoint-00000002.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])
    line = (
        f"priorattn: warning: {newest} is corrupted: its sha256 differs from checkpoint-00000002.json's: "
        "loading the older checkpoint checkpoint-00000001.json (step 1)"
    )
    argv = ["eval", "ppl", "--run", str(run), "--lengths", "64", "--windows", "1", "--quiet"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [line]
    index = json.loads((run / "checkpoint-00000001.json").read_text())
    scored = json.loads((run / "eval" / "ppl" / "results.json").read_text())["checkpoint"]
    assert scored == dict(step=1, sha256=index["sha256"])
    assert cli.main(["train", "--out", str(run), "--resume", "--quiet"]) == 0
    assert line in capsys.readouterr().err.splitlines()


def test_eval_ppl_prints_each_length_and_says_where_it_scored_fewer_windows_than_asked(
    run_dir, tmp_path, capsys
):
    text = tmp_path / "short.txt"
    text.write_text("Double, double toil and trouble; fire burn and cauldron bubble. " * 30)  # ~1.9k bytes
    out = tmp_path / "ppl"
    assert cli.main(["eval", "ppl", "--run", str(run_dir), "--data", str(text), "--lengths", "128,1024",
                     "--windows", "4", "--out", str(out), "--quiet"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    assert result["windows"][0] == 4 and result["windows"][1] < 4  # one window of 1025 bytes fits
    note = "note: the text holds fewer windows than --windows 4 at some lengths; scored"
    assert f"{note} {result['windows'][1]} at 1024" in printed
    assert f"{128:>6}  {4:>7}  {result['ppl'][0]:<7.2f}" in printed
    assert f"{result['paired_delta'][1]:+.3f}" in printed


def test_eval_ppl_with_every_window_it_asked_for_has_no_note(run_dir, tmp_path, capsys):
    assert cli.main(["eval", "ppl", "--run", str(run_dir), "--lengths", "128", "--windows", "2",
                     "--out", str(tmp_path / "ppl"), "--quiet"]) == 0  # fmt: skip
    assert "note:" not in capsys.readouterr().out
