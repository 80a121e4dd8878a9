"""Checkpoints: safetensors + JSON, one file or shards, atomic, exact round trips, clear errors, no pickle."""

from __future__ import annotations

import json

import pytest
import torch

from priorattn.models import GPT, preset
from priorattn.train import TrainConfig
from priorattn.train import checkpoint as ckpt
from priorattn.train.optim import build_optimizer
from priorattn.train.parallel import shard


def model(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(preset("tiny", d_model=32, n_layers=2, n_heads=2, prior="goat", **overrides))


def step_once(net: GPT, optimizer) -> float:
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    _, loss, _ = net(tokens, targets=tokens.roll(-1, 1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def save(run_dir, step, net, optimizer):
    model_tensors, aliases = ckpt.module_tensors(net, "model.")
    optim_tensors, optim_state = ckpt.optimizer_tensors(optimizer)
    return ckpt.save_checkpoint(
        run_dir, step, model_tensors | optim_tensors, dict(aliases=aliases, optimizer=optim_state)
    )


@pytest.mark.parametrize("optimizer_name", ["adamw", "radam"])
def test_round_trip_continues_exactly(tmp_path, optimizer_name):
    """Saving after one step and loading into fresh objects gives the same second step."""
    config = TrainConfig(optimizer=optimizer_name)
    net = model(shared_prior=True)
    optimizer = build_optimizer(net, config)
    step_once(net, optimizer)
    save(tmp_path, 1, net, optimizer)
    expected = step_once(net, optimizer)

    step, tensors, state = ckpt.load_checkpoint(tmp_path)
    fresh = model(shared_prior=True)
    fresh_optimizer = build_optimizer(fresh, config)
    ckpt.load_module(fresh, tensors, state["aliases"], "model.")
    ckpt.load_optimizer(fresh_optimizer, tensors, state["optimizer"])
    assert step == 1
    assert step_once(fresh, fresh_optimizer) == expected
    for a, b in zip(net.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


def test_tied_and_shared_tensors_are_stored_once(tmp_path):
    net = model(shared_prior=True)
    tensors, aliases = ckpt.module_tensors(net, "model.")
    assert aliases["head.weight"] == "embed.weight"
    assert any(name.startswith("blocks.1.attn.prior") for name in aliases)
    assert "model.head.weight" not in tensors


def files(run_dir) -> list[str]:
    """The names of the checkpoint files and shard directories."""
    return sorted(p.name for p in run_dir.glob("checkpoint*"))


def test_the_newest_checkpoints_are_kept(tmp_path):
    net = model()
    optimizer = build_optimizer(net, TrainConfig())
    (tmp_path / "checkpoint-00000000.safetensors").write_bytes(b"left by a crash before its JSON")
    for step in (1, 2, 3):
        save(tmp_path, step, net, optimizer)
    assert files(tmp_path) == [
        f"checkpoint-0000000{s}.{ext}" for s in (2, 3) for ext in ("json", "safetensors")
    ]
    ckpt.save_checkpoint(tmp_path, 4, {"x": torch.zeros(1)}, {}, keep=1)
    assert files(tmp_path) == ["checkpoint-00000004.json", "checkpoint-00000004.safetensors"]
    assert not list(tmp_path.glob(".*tmp"))


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupted_newest_checkpoint_falls_back_to_the_older_with_a_warning(tmp_path):
    net = model()
    optimizer = build_optimizer(net, TrainConfig())
    save(tmp_path, 1, net, optimizer)
    _, older, _ = ckpt.load_checkpoint(tmp_path)
    step_once(net, optimizer)
    newest = save(tmp_path, 2, net, optimizer)
    corrupt(newest)
    with pytest.warns(ckpt.CheckpointWarning, match=r"00000002.safetensors is corrupted.*step 1"):
        step, tensors, _ = ckpt.load_checkpoint(tmp_path)
    assert step == 1 and all(torch.equal(tensors[name], t) for name, t in older.items())
    (tmp_path / "checkpoint-00000001.json").write_text('{"step": 1, "fi')
    with pytest.raises(ckpt.CheckpointError, match=r"no intact checkpoint: .*corrupted.*corrupted"):
        ckpt.load_checkpoint(tmp_path)


def test_corrupted_file_is_refused(tmp_path):
    net = model()
    path = save(tmp_path, 3, net, build_optimizer(net, TrainConfig()))
    corrupt(path)
    with pytest.raises(ckpt.CheckpointError, match="corrupted"):
        ckpt.load_checkpoint(tmp_path)


def test_truncated_json_and_missing_checkpoint_are_refused(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint"):
        ckpt.load_checkpoint(tmp_path)
    ckpt.checkpoint_json(tmp_path, 3).write_text('{"step": 3, "fi')
    with pytest.raises(ckpt.CheckpointError, match="corrupted"):
        ckpt.load_checkpoint(tmp_path)


def test_a_run_saved_with_a_single_checkpoint_json_still_loads(tmp_path):
    """Runs written before several checkpoints were kept have one index, checkpoint.json."""
    net = model()
    optimizer = build_optimizer(net, TrainConfig())
    save(tmp_path, 5, net, optimizer)
    ckpt.checkpoint_json(tmp_path, 5).rename(tmp_path / "checkpoint.json")
    assert ckpt.load_checkpoint(tmp_path)[0] == 5
    save(tmp_path, 6, net, optimizer)
    assert files(tmp_path) == ["checkpoint-00000006.json", "checkpoint-00000006.safetensors"]


def test_a_different_model_is_named(tmp_path):
    net = model()
    save(tmp_path, 1, net, build_optimizer(net, TrainConfig()))
    _, tensors, state = ckpt.load_checkpoint(tmp_path)
    other = GPT(preset("tiny", d_model=48, n_layers=2, n_heads=2, prior="goat"))
    with pytest.raises(ckpt.CheckpointError, match=r"shapes: embed.weight \(256, 32\) vs model \(256, 48\)"):
        ckpt.load_module(other, tensors, state["aliases"], "model.")
    alibi = GPT(preset("tiny", d_model=32, n_layers=2, n_heads=2, prior="alibi"))
    with pytest.raises(ckpt.CheckpointError, match="unexpected: blocks.0.attn.prior"):
        ckpt.load_module(alibi, tensors, state["aliases"], "model.")


def test_loading_never_unpickles(tmp_path, monkeypatch, alone):
    """Neither one file nor shards (read through their safetensors headers, not DCP's pickled
    metadata file)."""
    import pickle

    net, sharded = model(), shard(model(), alone)
    (tmp_path / "one").mkdir()
    save(tmp_path / "one", 1, net, build_optimizer(net, TrainConfig()))
    sharded_save(tmp_path / "shards", 1, sharded, build_optimizer(sharded, TrainConfig()), alone)

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    ckpt.load_checkpoint(tmp_path / "one")
    ckpt.load_checkpoint(tmp_path / "shards")
    ckpt.load_sharded_checkpoint(
        tmp_path / "shards", lambda stored: {"model.embed.weight": torch.empty(256, 32)}
    )


def sharded_save(run_dir, step, net, optimizer, process, keep=2):
    model_tensors, aliases = ckpt.module_tensors(net, "model.")
    optim_tensors, optim_state = ckpt.optimizer_tensors(optimizer)
    state = dict(aliases=aliases, optimizer=optim_state)
    return ckpt.save_sharded_checkpoint(run_dir, step, model_tensors | optim_tensors, state, keep, process)


def test_a_sharded_checkpoint_reads_back_whole(tmp_path, alone):
    """Shards (DTensors) and whole tensors saved by the group read back as the plain model's
    tensors, tied ones once; the index names each shard with its sha256."""
    plain, sharded = model(), shard(model(), alone)
    sharded_save(tmp_path, 1, sharded, build_optimizer(sharded, TrainConfig()), alone)
    step, tensors, state = ckpt.load_checkpoint(tmp_path)
    expected, aliases = ckpt.module_tensors(plain, "model.")
    assert step == 1 and state["aliases"] == aliases == {"head.weight": "embed.weight"}
    assert all(torch.equal(tensors[name], t) for name, t in expected.items())
    index = json.loads(ckpt.checkpoint_json(tmp_path, 1).read_text())
    assert index["directory"] == "checkpoint-00000001" and len(index["shards"]) == 1


def test_a_sharded_save_killed_before_its_index_leaves_the_previous_checkpoint(tmp_path, alone, monkeypatch):
    net = shard(model(), alone)
    optimizer = build_optimizer(net, TrainConfig())
    sharded_save(tmp_path, 1, net, optimizer, alone)
    step_once(net, optimizer)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(ckpt, "write_json_atomic", killed)
        with pytest.raises(KeyboardInterrupt):
            sharded_save(tmp_path, 2, net, optimizer, alone)
    assert (tmp_path / "checkpoint-00000002").is_dir()  # its shards, written
    assert ckpt.load_checkpoint(tmp_path)[0] == 1
    for step in (3, 4):
        sharded_save(tmp_path, step, net, optimizer, alone)
    assert files(tmp_path) == [f"checkpoint-0000000{s}{ext}" for s in (3, 4) for ext in ("", ".json")]


def test_a_sharded_load_skips_a_single_file_checkpoint_and_names_what_is_missing(tmp_path, alone):
    net = model()
    save(tmp_path, 1, net, build_optimizer(net, TrainConfig()))
    with pytest.raises(
        ckpt.CheckpointError, match="00000001.json is a single-file checkpoint, not a sharded one"
    ):
        ckpt.load_sharded_checkpoint(tmp_path, lambda stored: {})
    sharded = shard(model(), alone)
    sharded_save(tmp_path, 2, sharded, build_optimizer(sharded, TrainConfig()), alone)
    targets = {"model.embed.weight": torch.empty(256, 32), "model.extra": torch.empty(3)}
    with pytest.raises(ckpt.CheckpointError, match="does not match the model: missing: model.extra"):
        ckpt.load_sharded_checkpoint(tmp_path, lambda stored: targets)
    step, tensors, _ = ckpt.load_sharded_checkpoint(
        tmp_path, lambda stored: {"model.embed.weight": targets["model.embed.weight"]}
    )
    assert step == 2 and torch.equal(tensors["model.embed.weight"], model().embed.weight.detach())
