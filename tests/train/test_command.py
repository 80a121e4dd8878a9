"""``priorattn train`` as a user runs it: reports, bad input, a SIGKILL and --resume, torchrun."""

from __future__ import annotations

import json
import signal
import time

import pytest
from conftest import command_env, finished, losses, run_command
from factories import exit_code

from priorattn import cli
from priorattn.train.checkpoint import load_checkpoint

SMALL = ["--preset", "tiny", "--seq-len", "32", "--batch-size", "4", "--eval-sequences", "4", "--quiet"]


def test_train_reports_losses_against_the_baseline(corpus, tmp_path, capsys):
    argv = ["train", *SMALL, "--prior", "goat", "--ssmax", "--shared-prior", "--token-shift", "--steps", "2"]
    argv += ["--positions", "window", "--grad-clip", "0"]
    assert cli.main([*argv, "--data", str(corpus), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step 2: train loss" in out and "unigram baseline" in out
    saved = json.loads((tmp_path / "config.json").read_text())
    model = saved["model"]
    assert (model["prior"], model["ssmax"], model["shared_prior"], model["token_shift"]) == (
        "goat(num_freqs=3)",  # the tiny preset's GOAT
        True,
        True,
        True,
    )
    assert saved["train"]["positions"] == "window"
    assert saved["train"]["grad_clip"] is None  # 0 on the command line: no clipping


def test_compile_flag_is_the_configs_compile():
    def configs(*flags):
        return cli.train.train_configs(cli.build_parser().parse_args(["train", "--out", "run", *flags]))[1]

    assert configs("--compile").compile is True and configs().compile is False


def test_sample_and_plot_runs_use_a_finished_run(corpus, tmp_path, capsys):
    run = tmp_path / "run"  # with token shift: sample reads it from the run's config
    argv = ["train", *SMALL, "--token-shift", "--steps", "2", "--data", str(corpus), "--out", str(run)]
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert cli.main(["sample", "--run", str(run), "--prompt", "the quick", "--tokens", "12"]) == 0
    assert capsys.readouterr().out.startswith("the quick")
    png = tmp_path / "curves.png"
    assert cli.main(["plot-runs", str(run), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert exit_code(["sample", "--run", str(tmp_path / "nothing")]) == 2
    assert "holds no run" in capsys.readouterr().err
    assert exit_code(["sample", "--run", str(run), "--temperature", "0"]) == 2
    assert "temperature must be > 0" in capsys.readouterr().err
    assert exit_code(["sample", "--run", str(run), "--sorted-window", "8"]) == 2
    assert "sorted-cache decoding needs scalar heads" in capsys.readouterr().err


def test_training_with_the_forward_only_flex_route_is_refused_before_any_file(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", *SMALL, "--backend", "flex", "--steps", "1", "--data", str(corpus), "--out", str(run)]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "--backend='flex' cannot train on the CPU" in err and "Traceback" not in err
    assert not run.exists()


def test_export_copies_a_run_with_its_checkpoint_as_one_file(corpus, tmp_path, capsys):
    run, copy = tmp_path / "run", tmp_path / "copy"
    assert cli.main(["train", *SMALL, "--steps", "2", "--data", str(corpus), "--out", str(run)]) == 0
    capsys.readouterr()
    assert cli.main(["export", "--run", str(run), "--out", str(copy)]) == 0
    assert capsys.readouterr().out == f"{copy / 'checkpoint-00000002.safetensors'}\n"
    assert load_checkpoint(copy)[0] == 2
    for argv, message in [
        (["--run", str(tmp_path / "none"), "--out", str(tmp_path / "x")], "holds no run"),
        (["--run", str(run), "--out", str(run)], "--out='" + str(run) + "' is the run itself"),
        (["--run", str(run), "--out", str(copy)], "already holds a run: export to another directory"),
    ]:
        assert exit_code(["export", *argv]) == 2
        assert message in capsys.readouterr().err


def test_init_from_continues_the_earlier_model_on_its_data(corpus, tmp_path, capsys):
    short = tmp_path / "short"
    assert (
        cli.main(
            ["train", *SMALL, "--prior", "ggd", "--steps", "2", "--data", str(corpus), "--out", str(short)]
        )
        == 0
    )
    longer = ["train", "--init-from", str(short), "--seq-len", "64", "--steps", "1", "--quiet"]
    assert cli.main([*longer, "--out", str(tmp_path / "long")]) == 0
    saved = json.loads((tmp_path / "long" / "config.json").read_text())
    assert saved["model"] == json.loads((short / "config.json").read_text())["model"]
    assert saved["train"]["data"] == str(corpus) and saved["train"]["seq_len"] == 64
    capsys.readouterr()
    assert exit_code([*longer, "--prior", "goat", "--out", str(tmp_path / "other")]) == 2
    assert "--prior cannot be combined with --init-from" in capsys.readouterr().err


def test_init_from_with_rope_interpolation_extends_a_rope_run(corpus, tmp_path, capsys):
    from priorattn.train import load_run

    short, long = tmp_path / "short", tmp_path / "long"
    argv = ["train", *SMALL, "--encoding", "rope", "--steps", "1", "--data", str(corpus)]
    assert cli.main([*argv, "--rope-interpolation", "1.5", "--out", str(tmp_path / "fresh")]) == 0
    assert json.loads((tmp_path / "fresh" / "config.json").read_text())["model"]["rope_interpolation"] == 1.5
    assert cli.main([*argv, "--out", str(short)]) == 0
    extend = ["train", "--init-from", str(short), "--seq-len", "64", "--steps", "1", "--quiet"]
    assert cli.main([*extend, "--rope-interpolation", "2", "--out", str(long)]) == 0
    before = json.loads((short / "config.json").read_text())["model"]
    after = json.loads((long / "config.json").read_text())["model"]
    assert before["rope_interpolation"] == 1.0
    assert after == before | {"rope_interpolation": 2.0}
    assert all(block.attn.rope.interpolation == 2.0 for block in load_run(long).model.blocks)
    capsys.readouterr()
    assert exit_code([*extend, "--rope-interpolation", "0", "--out", str(tmp_path / "zero")]) == 2
    assert "argument --rope-interpolation: must be a positive number, got 0" in capsys.readouterr().err


def test_rope_interpolation_without_rope_is_a_clear_error(corpus, tmp_path, capsys):
    argv = ["train", *SMALL, "--steps", "1", "--data", str(corpus), "--rope-interpolation", "2"]
    assert exit_code([*argv, "--out", str(tmp_path / "run")]) == 2
    assert "it needs --encoding='rope' or 'local_rope', got --encoding='none'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prior", "gauss"], "unknown prior 'gauss'"),
        (["--encoding", "local_rope"], "sliding window: give --window\n"),
        (["--data", "{missing}"], "missing"),
        (["--data", "{empty}"], "empty corpus"),
        (["--seq-len", "100000"], "seq_len"),
        (["--batch-size", "6", "--grad-accum", "4"], "--batch-size=6 must be a multiple of --grad-accum=4"),
        (["--lr", "-1"], "error: --lr must be > 0, got -1.0"),
        (["--parallel", "zero"], "argument --parallel: invalid choice: 'zero' (choose from 'ddp', 'fsdp')"),
        (
            ["--parallel", "fsdp"],
            "error: --parallel='fsdp' shards the model over processes and this run has one",
        ),
        (
            ["--mixed-precision"],
            "error: --mixed-precision gathers FSDP's parameters in bfloat16: it needs --parallel='fsdp'",
        ),
        (["--grad-clip", "-1"], "argument --grad-clip: must be a number >= 0, got -1"),
        (["--grad-clip", "inf"], "argument --grad-clip: must be a finite number, got inf"),
        (["--retrieval-mix", "0.5"], "give --seq-len of at least 108, or --retrieval-mix=0"),
        (
            ["--warmup", "2", "--text-encoding", "klingon"],
            "--text-encoding='klingon' is not a known text encoding",
        ),
    ],
)
def test_bad_input_is_a_clear_error(args, message, corpus, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("")
    args = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in args]
    argv = ["train", *SMALL, "--steps", "1", "--data", str(corpus), *args, "--out", str(tmp_path / "run")]
    assert exit_code(argv) == 2
    assert message in capsys.readouterr().err


def test_resume_without_flags_continues_with_the_saved_configuration(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    first = ["train", *SMALL, "--prior", "ggd", "--lr", "0.01", "--steps", "2", "--data", str(corpus)]
    assert cli.main([*first, "--log-every", "1", "--out", str(run)]) == 0
    assert cli.main(["train", "--out", str(run), "--resume", "--steps", "3", "--quiet"]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert (saved["model"]["prior"], saved["train"]["lr"], saved["train"]["steps"]) == ("ggd", 0.01, 3)
    assert [r["step"] for r in losses(run)] == [1, 2, 3]
    capsys.readouterr()
    assert cli.main(["train", "--out", str(run), "--resume", "--quiet"]) == 0  # finished: reported
    assert capsys.readouterr().out.startswith("step 3: train loss")
    assert exit_code(["train", "--out", str(run), "--resume", "--prior", "goat", "--lr", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "--resume needs the arguments" in err and "model.prior: run has 'ggd', given 'goat'" in err
    assert "train.lr" not in err  # given, and the same
    assert exit_code(["train", "--out", str(run), "--resume", "--steps", "2"]) == 2
    assert "train.steps: run has 3, given 2" in capsys.readouterr().err


def test_a_single_latin1_file_trains_with_its_text_encoding(tmp_path, capsys):
    book = tmp_path / "roman.txt"
    book.write_bytes("\n\n".join(f"Le café {i} est très fort." * 8 for i in range(60)).encode("latin-1"))
    argv = ["train", *SMALL, "--steps", "1", "--data", str(book), "--out", str(tmp_path / "run")]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert f"{book} is not utf-8 text: byte 6 is b'\\xe9'" in err
    assert "give the file's encoding as --text-encoding (e.g. 'latin-1')" in err
    assert cli.main([*argv, "--text-encoding", "latin-1"]) == 0
    assert json.loads((tmp_path / "run" / "data.json").read_text())["val_documents"][0].startswith(
        "roman.txt#"
    )


def test_run_directory_errors_name_the_path(corpus, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a run")
    base = ["train", *SMALL, "--steps", "1", "--data", str(corpus)]
    assert exit_code([*base, "--out", str(afile)]) == 2
    assert f"error: the output directory {afile} is a file\n" in capsys.readouterr().err
    run = tmp_path / "run"
    assert cli.main([*base, "--out", str(run)]) == 0
    assert exit_code([*base, "--out", str(run)]) == 2
    assert "already holds a run: pass --resume to continue it" in capsys.readouterr().err
    (run / "config.json").write_text('{"model": {"prior": ')
    for argv in (["sample", "--run", str(run)], [*base, "--out", str(run), "--resume"]):
        assert exit_code(argv) == 2
        err = capsys.readouterr().err
        assert f"error: {run / 'config.json'} is not valid JSON (" in err and "Traceback" not in err


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(corpus, tmp_path):
    args = [
        *SMALL,
        "--steps",
        "120",
        "--save-every",
        "10",
        "--log-every",
        "5",
        "--eval-every",
        "40",
        "--prior",
        "ggd",
        "--data",
        str(corpus),
    ]
    whole = run_command([*args, "--out", str(tmp_path / "whole")], command_env())
    killed = run_command([*args, "--out", str(tmp_path / "killed")], command_env())
    deadline = time.monotonic() + 120
    while killed.poll() is None and time.monotonic() < deadline:
        saved = [
            int(path.stem.removeprefix("checkpoint-"))
            for path in (tmp_path / "killed").glob("checkpoint-*.json")
        ]
        if max(saved, default=0) >= 20:
            killed.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    assert killed.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert whole.wait() == 0, whole.stderr.read()
    resumed = run_command([*args, "--out", str(tmp_path / "killed"), "--resume"], command_env())
    assert resumed.wait() == 0, resumed.stderr.read()
    assert losses(tmp_path / "killed") == losses(tmp_path / "whole")


def test_torchrun_two_processes_match_one(corpus, tmp_path):
    """DDP over gloo with the global batch split in two gives the one-process losses (with a token
    shift, whose zero-initialised W every step uses)."""
    args = [
        "--token-shift",
        *SMALL,
        "--steps",
        "4",
        "--log-every",
        "1",
        "--eval-every",
        "2",
        "--prior",
        "goat",
        "--data",
        str(corpus),
    ]
    finished(run_command([*args, "--out", str(tmp_path / "one")]))
    finished(run_command([*args, "--out", str(tmp_path / "two")], processes=2))
    _, tensors, _ = load_checkpoint(tmp_path / "two")
    assert {"rng.0", "rng.1"} <= set(tensors)  # both processes took part
    single, double = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert [r["step"] for r in double] == [r["step"] for r in single]
    for a, b in zip(single, double):
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)
        assert b.get("val_loss", 0) == pytest.approx(a.get("val_loss", 0), abs=1e-5)


def test_a_refused_input_leaves_no_run_directory_behind_but_keeps_one_that_was_there(
    corpus, tmp_path, capsys
):
    new = tmp_path / "new"
    assert (
        exit_code(["train", *SMALL, "--steps", "1", "--data", str(tmp_path / "missing"), "--out", str(new)])
        == 2
    )
    assert "no such file or directory" in capsys.readouterr().err and not new.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert (
        exit_code(["train", *SMALL, "--steps", "1", "--data", str(tmp_path / "missing"), "--out", str(kept)])
        == 2
    )
    assert (kept / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"model": 3}', "holds a JSON int under 'model': a run's config.json is {\"model\": {GPTConfig"),
        ("[1, 2]", "holds a JSON list, not a run's configs"),
        ('{"model": {}}', "holds nothing under 'train'"),
        ('{"model": {}, "train": {}}', "holds no valid run configs: GPTConfig.__init__() missing"),
    ],
)
def test_a_config_json_of_the_wrong_structure_is_a_one_line_error(tmp_path, capsys, text, message):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(text)
    for argv in (["sample", "--run", str(run)], ["eval", "ppl", "--run", str(run)]):
        assert exit_code(argv) == 2
        err = capsys.readouterr().err
        assert f"error: {run / 'config.json'} {message}" in err and "Traceback" not in err
