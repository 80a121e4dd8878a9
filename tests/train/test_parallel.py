"""FSDP (``parallel="fsdp"``): two sharded processes train as one plain process, sharded checkpoints
resume exactly and on another number of processes, export to one file, and survive a bad shard."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time

import pytest
import torch
from conftest import finished, losses, run_command, small_model
from torch.distributed.tensor import DTensor

from priorattn.eval.jobs import checkpoint_identity
from priorattn.models import GPT
from priorattn.train import TrainConfig, export_run, load_run
from priorattn.train import checkpoint as ckpt
from priorattn.train.optim import build_optimizer, clip_gradients
from priorattn.train.parallel import replicated_parameters, shard

TINY = ["--preset", "tiny", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32"]
# 6 validation sequences in batches of 2 (a micro-batch) make 3 batches: the second process scores
# one twice, so that both run as many forward passes.
RUN = [*TINY, "--batch-size", "4", "--eval-sequences", "6", "--warmup", "1", "--log-every", "1", "--quiet"]


def close(a: list[dict], b: list[dict], tolerance: float = 1e-5) -> None:
    """The same steps logged, each loss within ``tolerance``."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        for name in ("train_loss", "val_loss", "grad_norm"):
            assert y.get(name, 0) == pytest.approx(x.get(name, 0), abs=tolerance), (x["step"], name)


@pytest.fixture(scope="module")
def goat_runs(corpus, tmp_path_factory) -> dict:
    """A GOAT trained 4 steps on one plain process and with FSDP on two, checkpoints at 2 and 4."""
    root = tmp_path_factory.mktemp("goat")
    args = [*RUN, "--prior", "goat", "--steps", "4", "--eval-every", "2", "--save-every", "2"]
    args += ["--data", str(corpus)]
    finished(run_command([*args, "--out", str(root / "one")]))
    finished(run_command([*args, "--parallel", "fsdp", "--out", str(root / "two")], processes=2))
    return dict(one=root / "one", two=root / "two")


def test_two_fsdp_processes_train_a_goat_as_one_plain_process(goat_runs):
    close(losses(goat_runs["one"]), losses(goat_runs["two"]))
    shards = sorted(p.name for p in (goat_runs["two"] / "checkpoint-00000004").iterdir())
    assert shards == [f"shard-0000{rank}-model-00001-of-00001.safetensors" for rank in (1, 2)]


def test_two_fsdp_processes_train_ggd_with_ssmax_as_one_plain_process(corpus, tmp_path):
    """With activation checkpointing on the FSDP side, which recomputes the same activations."""
    args = [*RUN, "--prior", "ggd", "--ssmax", "--steps", "3", "--eval-every", "3", "--data", str(corpus)]
    finished(run_command([*args, "--out", str(tmp_path / "one")]))
    sharded = [*args, "--parallel", "fsdp", "--checkpoint-activations", "--out", str(tmp_path / "two")]
    finished(run_command(sharded, processes=2))
    close(losses(tmp_path / "one"), losses(tmp_path / "two"))


def test_a_two_process_checkpoint_resumes_on_one_process(goat_runs, tmp_path):
    """Resharded onto one process, the step-2 checkpoint continues as the two processes did."""
    run = tmp_path / "run"
    shutil.copytree(goat_runs["two"], run)
    ckpt.checkpoint_json(run, 4).unlink()
    err = finished(run_command(["--out", str(run), "--resume"]))
    close(losses(goat_runs["two"]), losses(run))
    assert len(list((run / "checkpoint-00000004").iterdir())) == 1  # one process, one shard
    assert "warning" not in err  # without dropout nothing depends on the number of processes


def test_a_resume_on_fewer_processes_with_dropout_says_that_its_losses_leave_the_saved_runs(corpus, tmp_path):
    """Dropout draws from each process's own random stream: a two-process checkpoint resumed on one
    process says so in one line."""
    run = tmp_path / "run"
    args = [*RUN, "--prior", "goat", "--dropout", "0.1", "--steps", "2", "--save-every", "1", "--parallel"]
    finished(run_command([*args, "fsdp", "--data", str(corpus), "--out", str(run)], processes=2))
    ckpt.checkpoint_json(run, 2).unlink()
    err = finished(run_command(["--out", str(run), "--resume"]))
    line = f"priorattn: warning: {run}: a checkpoint of 2 processes resumed on 1: dropout draws from each"
    assert [text for text in err.splitlines() if text.startswith(line)], err


def test_export_writes_one_file_with_the_fsdp_runs_weights(goat_runs, tmp_path):
    """The exported run loads as a plain one with the sharded run's logits, which are the plain
    process's to float tolerance."""
    path = export_run(goat_runs["two"], tmp_path / "export")
    assert path.name == "checkpoint-00000004.safetensors"
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "checkpoint-00000004.json",
        "checkpoint-00000004.safetensors",
        "config.json",
        "data.json",
        "metrics.jsonl",
    ]
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    exported, sharded, plain = (load_run(d) for d in (path.parent, goat_runs["two"], goat_runs["one"]))
    assert exported.step == 4
    logits = exported.model(tokens)[0]
    assert torch.equal(logits, sharded.model(tokens)[0])
    torch.testing.assert_close(logits, plain.model(tokens)[0], atol=1e-5, rtol=0)
    with pytest.raises(FileExistsError, match="already holds a run"):
        export_run(goat_runs["two"], path.parent)
    # what evaluations key their results by: the step and the sha256 of the shards
    assert checkpoint_identity(goat_runs["two"])["step"] == 4


def test_a_corrupt_shard_is_named_and_the_older_checkpoint_loads(goat_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(goat_runs["two"], run)
    shard_file = run / "checkpoint-00000004" / "shard-00002-model-00001-of-00001.safetensors"
    data = bytearray(shard_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard_file.write_bytes(bytes(data))
    warning = r"shard-00002-model-00001-of-00001.safetensors is corrupted.*older checkpoint .*step 2"
    with pytest.warns(ckpt.CheckpointWarning, match=warning):
        assert load_run(run).step == 2
    err = finished(run_command(["--out", str(run), "--resume"]))  # and resumes from it, on one process
    assert re.search(r"priorattn: warning: .*corrupted.*: loading the older checkpoint .*00000002", err)
    close(losses(goat_runs["two"]), losses(run))
    for shard_file in run.glob("checkpoint-*/*.safetensors"):
        shard_file.write_bytes(b"not a shard")
    with pytest.raises(ckpt.CheckpointError, match="no intact checkpoint: .*corrupted.*corrupted"):
        load_run(run)


@pytest.mark.slow
def test_sigkill_then_resume_under_fsdp_reproduces_the_uninterrupted_run(corpus, tmp_path):
    """Two processes with dropout killed (all at once) after their step-10 checkpoint and resumed:
    each restores its shards and its own dropout stream, so the losses are the same bits."""
    args = [*RUN, "--prior", "goat", "--dropout", "0.1", "--steps", "40", "--save-every", "5"]
    args += ["--eval-every", "20", "--parallel", "fsdp", "--data", str(corpus)]
    whole = run_command([*args, "--out", str(tmp_path / "whole")], processes=2)
    killed = run_command([*args, "--out", str(tmp_path / "killed")], processes=2)
    deadline = time.monotonic() + 300
    while killed.poll() is None and time.monotonic() < deadline:
        if ckpt.checkpoint_json(tmp_path / "killed", 10).exists():
            os.killpg(killed.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    assert killed.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    finished(whole)
    finished(run_command([*args, "--out", str(tmp_path / "killed"), "--resume"], processes=2))
    assert losses(tmp_path / "killed") == losses(tmp_path / "whole")


def test_priors_stay_whole_in_their_own_optimizer_group_and_the_rest_is_sharded(alone):
    model = shard(GPT(small_model(prior="ggd+goat", ssmax=True, shared_prior=True)), alone)
    whole = replicated_parameters(model)
    assert whole and not any(isinstance(p, DTensor) for p in whole)
    assert all(isinstance(p, DTensor) for p in model.parameters() if all(p is not q for q in whole))
    groups = {g["name"]: g for g in build_optimizer(model, TrainConfig(prior_lr=1e-2)).param_groups}
    prior = groups["prior"]
    assert [id(p) for p in prior["params"]] == [id(p) for p in whole if p.requires_grad]  # GGD's mu is frozen
    assert prior["lr"] == 1e-2 and prior["weight_decay"] == 0.0


def test_clip_gradients_of_a_sharded_model_clips_by_the_whole_gradients_norm(alone):
    plain, sharded = (GPT(small_model(prior="goat", ssmax=True)) for _ in range(2))
    sharded.load_state_dict(plain.state_dict())
    shard(sharded, alone)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    for model in (plain, sharded):
        model(tokens, targets=tokens.roll(-1, 1))[1].backward()
    norms = [clip_gradients(model, 0.5) for model in (plain, sharded)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-6) and norms[0] > 0.5
    for p, q in zip(plain.parameters(), sharded.parameters()):
        grad = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
        torch.testing.assert_close(grad, p.grad, atol=1e-7, rtol=1e-5)


def test_mixed_precision_gathers_blocks_in_bfloat16_and_keeps_priors_float32(alone):
    torch.manual_seed(0)
    full, mixed = (GPT(small_model(prior="goat", ssmax=True)) for _ in range(2))
    mixed.load_state_dict(full.state_dict())
    shard(mixed, alone, mixed_precision=True)
    seen = []  # the dtype of a block's weight as the block computes
    mixed.blocks[0].mlp.gate.register_forward_pre_hook(lambda m, args: seen.append(m.weight.dtype))
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    losses = [model(tokens, targets=tokens.roll(-1, 1))[1] for model in (full, mixed)]
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in replicated_parameters(mixed))
    assert losses[1].dtype == torch.float32 and losses[1].item() == pytest.approx(losses[0].item(), abs=3e-2)
    assert losses[1].item() != losses[0].item()
