"""The training loop through its Python API: run directory, losses, accumulation, resume, errors."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import small_model, train_until_killed

from priorattn.train import TrainConfig, train
from priorattn.train import checkpoint as ckpt


def settings(corpus, **overrides) -> TrainConfig:
    base = dict(
        data=str(corpus),
        steps=6,
        batch_size=4,
        warmup_steps=2,
        lr=3e-3,
        log_every=2,
        eval_every=3,
        save_every=3,
        eval_sequences=8,
    )
    return TrainConfig(**{**base, **overrides})


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_directory_holds_config_metrics_and_checkpoint(corpus, tmp_path):
    result = train(small_model(prior="goat"), settings(corpus), tmp_path / "run", progress=False)
    run = tmp_path / "run"
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["prior"] == "goat(num_freqs=3)" and saved["train"]["steps"] == 6
    records = metrics(run)
    assert [r["step"] for r in records] == [2, 3, 4, 6]
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]
    assert all({"train_loss", "step"} <= set(r) for r in records)
    assert result.step == 6 and result.val_loss == records[-1]["val_loss"]
    assert [path.name for path in ckpt.checkpoint_indexes(run)] == [
        "checkpoint-00000006.json",
        "checkpoint-00000003.json",
    ]
    assert ckpt.load_checkpoint(run)[0] == 6
    assert (run / "data.json").exists()


def test_training_beats_the_unigram_baseline(corpus, tmp_path):
    config = settings(corpus, steps=200, batch_size=8, lr=1e-2, warmup_steps=10, eval_every=0, save_every=0)
    result = train(small_model(prior="alibi"), config, tmp_path / "run", progress=False)
    assert result.val_loss < result.unigram_loss - 0.3


def test_accumulation_checkpointing_and_bf16_follow_the_full_batch(corpus, tmp_path):
    losses = {}
    variants = [("full", {}), ("accum", dict(grad_accum=2)), ("bf16", dict(bf16=True))]
    variants.append(("recomputed", dict(checkpoint_activations=True)))  # each block's activations
    for name, overrides in variants:
        train(small_model(prior="ggd"), settings(corpus, **overrides), tmp_path / name, progress=False)
        losses[name] = [r["train_loss"] for r in metrics(tmp_path / name)]
    assert losses["accum"] == pytest.approx(losses["full"], abs=1e-5)
    assert losses["recomputed"] == pytest.approx(losses["full"], abs=1e-6)
    assert losses["bf16"] == pytest.approx(losses["full"], abs=3e-2)


@pytest.mark.parametrize("retrieval_mix", [0.0, 0.5])
def test_resume_continues_exactly(corpus, tmp_path, monkeypatch, retrieval_mix):
    """A run that dies in step 5 (after its step-3 checkpoint and step-4 log) and is resumed logs
    exactly what the uninterrupted run logged, dropout and retrieval samples included."""

    config = settings(corpus, prior_lr=1e-2, retrieval_mix=retrieval_mix)
    model = small_model(prior="goat", dropout=0.1, seq_len=192 if retrieval_mix else 32)
    train(model, config, tmp_path / "whole", progress=False)

    train_until_killed(model, config, tmp_path / "split", monkeypatch)
    assert [r["step"] for r in metrics(tmp_path / "split")] == [2, 3, 4]
    train(model, config, tmp_path / "split", resume=True, progress=False)

    def losses(run):
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in metrics(run)]

    assert losses(tmp_path / "split") == losses(tmp_path / "whole")


def test_compiled_training_matches_eager_and_resumes_exactly(corpus, tmp_path, monkeypatch):
    """``compile=True`` trains through ``torch.compile`` (its run's config says so): without dropout
    (compiled kernels draw their own random numbers) its losses are an eager run's up to float
    rounding; with it, a compiled run killed in step 4 and resumed logs what the uninterrupted
    compiled run logged."""
    config = settings(corpus, steps=4, eval_every=2, save_every=2)
    train(small_model(prior="goat", n_layers=1), config, tmp_path / "eager", progress=False)
    config.compile = True
    train(small_model(prior="goat", n_layers=1), config, tmp_path / "compiled", progress=False)
    assert json.loads((tmp_path / "compiled" / "config.json").read_text())["train"]["compile"] is True
    eager, compiled = metrics(tmp_path / "eager"), metrics(tmp_path / "compiled")
    for name in ("train_loss", "val_loss"):
        expected = [r[name] for r in eager if name in r]
        assert [r[name] for r in compiled if name in r] == pytest.approx(expected, abs=1e-4)

    model = small_model(prior="goat", n_layers=1, dropout=0.1)
    train(model, config, tmp_path / "whole", progress=False)
    train_until_killed(model, config, tmp_path / "split", monkeypatch, killed_in_step=4)
    train(model, config, tmp_path / "split", resume=True, progress=False)

    def losses(run):
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in metrics(run)]

    assert losses(tmp_path / "split") == losses(tmp_path / "whole")


@pytest.mark.parametrize("positions", ["document", "window"])
def test_packed_documents_are_scored_at_the_chosen_positions(tmp_path, positions):
    """``positions="document"``: each packed document's loss is its loss alone, from position 0;
    ``"window"`` is the call the loop made before the option existed (positions from the window's start)."""
    import torch.nn.functional as F

    from priorattn.data import ByteTokenizer, Document, PackedSequences, TokenStore, eval_batches
    from priorattn.models import GPT
    from priorattn.train.distributed import Process
    from priorattn.train.loop import evaluate

    texts = ["the quick brown fox", "jumps", "over the lazy dog while seven", "wizards hex"]
    docs = [Document(f"doc{i}", lambda text=text: text) for i, text in enumerate(texts)]
    packed = PackedSequences(TokenStore.build(docs, ByteTokenizer(), tmp_path / "store"), 16)
    torch.manual_seed(0)
    model = GPT(small_model(prior="goat", encoding="sinusoidal", seq_len=16))
    with torch.no_grad():
        for p in model.blocks.parameters():
            p.uniform_(-0.5, 0.5)  # priors with a sink u(j) that is not zero, random weights
    loss = evaluate(model, packed, 2, TrainConfig(positions=positions, eval_sequences=None), Process())

    total, count = 0.0, 0
    with torch.no_grad():
        for tokens, targets, doc_ids in eval_batches(packed, 2):
            if positions == "window":
                logits, _, _ = model(tokens, doc_ids=doc_ids)
                total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
                count += int((targets != -100).sum())
                continue
            for row in range(len(tokens)):
                for doc in doc_ids[row].unique():
                    where = doc_ids[row] == doc
                    logits, _, _ = model(tokens[row, where][None])
                    total += F.cross_entropy(logits[0], targets[row, where], reduction="sum").item()
                    count += int((targets[row, where] != -100).sum())
    assert loss == pytest.approx(total / count, rel=1e-5)


def test_a_run_saved_before_positions_existed_resumes_with_window_positions(corpus, tmp_path, monkeypatch):
    """Such a run trained with window positions: it loads with them, resuming it with document
    positions is refused, and resuming it with window positions continues it exactly."""
    from priorattn.train import load_run

    old = settings(corpus, positions="window")
    train(small_model(prior="goat"), old, tmp_path / "whole", progress=False)
    train_until_killed(small_model(prior="goat"), old, tmp_path / "run", monkeypatch)
    run = tmp_path / "run"
    for path in [run / "config.json", *run.glob("checkpoint*.json")]:  # as an earlier version wrote them
        saved = json.loads(path.read_text())
        del (saved if path.name == "config.json" else saved["state"]["configs"])["train"]["positions"]
        path.write_text(json.dumps(saved))

    assert load_run(tmp_path / "run").train_config.positions == "window"
    with pytest.raises(ValueError, match="train.positions: run has 'window', given 'document'"):
        train(small_model(prior="goat"), settings(corpus), tmp_path / "run", resume=True, progress=False)
    train(small_model(prior="goat"), old, tmp_path / "run", resume=True, progress=False)
    logged = [
        [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in metrics(tmp_path / run)]
        for run in ("whole", "run")
    ]
    assert logged[0] == logged[1]


def test_existing_run_needs_resume(corpus, tmp_path):
    train(small_model(), settings(corpus, steps=1), tmp_path / "run", progress=False)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(small_model(), settings(corpus, steps=1), tmp_path / "run", progress=False)


def test_resume_with_other_arguments_is_refused(corpus, tmp_path):
    train(small_model(), settings(corpus, steps=1), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match=r"train.lr: run has 0.003, given 0.01"):
        train(
            small_model(), settings(corpus, steps=1, lr=1e-2), tmp_path / "run", resume=True, progress=False
        )


def test_resume_starts_a_missing_run_and_reports_a_finished_one(corpus, tmp_path):
    """A job that may be interrupted can always pass resume=True."""
    first = train(small_model(), settings(corpus, steps=3), tmp_path / "run", resume=True, progress=False)
    again = train(small_model(), settings(corpus, steps=3), tmp_path / "run", resume=True, progress=False)
    assert first.step == again.step == 3
    assert (again.train_loss, again.val_loss) == (first.train_loss, first.val_loss)
    assert [r["step"] for r in metrics(tmp_path / "run")] == [2, 3]


def test_corrupted_checkpoint_is_refused_on_resume(corpus, tmp_path):
    run = tmp_path / "run"
    train(small_model(), settings(corpus, steps=3), run, progress=False)
    path = next(run.glob("checkpoint-*.safetensors"))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ckpt.CheckpointError, match="corrupted"):
        train(small_model(), settings(corpus, steps=3), run, resume=True, progress=False)


def test_init_from_starts_at_the_earlier_weights(corpus, tmp_path):
    """Context extension: a run at a longer length starts from another run's final weights."""
    train(small_model(prior="ggd"), settings(corpus, steps=3), tmp_path / "short", progress=False)
    longer = settings(corpus, steps=1, seq_len=64, lr=1e-12, init_from=str(tmp_path / "short"))
    train(small_model(prior="ggd"), longer, tmp_path / "long", progress=False)
    _, before, _ = ckpt.load_checkpoint(tmp_path / "short")
    _, after, _ = ckpt.load_checkpoint(tmp_path / "long")
    for name, t in before.items():
        if name.startswith("model."):
            torch.testing.assert_close(after[name], t, atol=1e-6, rtol=0)


def test_load_run_gives_the_trained_model_and_its_tokenizer(corpus, tmp_path):
    from priorattn.train import load_run

    train(
        small_model(prior="goat", tie_embeddings=False),
        settings(corpus, steps=3),
        tmp_path / "run",
        progress=False,
    )
    run = load_run(tmp_path / "run")
    _, tensors, _ = ckpt.load_checkpoint(tmp_path / "run")
    assert run.step == 3 and not run.model.training
    for name, t in run.model.state_dict().items():
        assert torch.equal(t, tensors["model." + name])
    assert run.tokenizer.decode(run.tokenizer.encode("the fox")) == "the fox"
    with pytest.raises(FileNotFoundError, match="holds no run"):
        load_run(tmp_path / "elsewhere")


def test_init_from_needs_the_same_tokenizer(corpus, tmp_path):
    train(small_model(), settings(corpus, steps=1), tmp_path / "bytes", progress=False)
    bpe = settings(corpus, steps=1, tokenizer="bpe", vocab_size=300, init_from=str(tmp_path / "bytes"))
    with pytest.raises(ValueError, match="continues only with its own tokenizer"):
        train(small_model(vocab_size=300), bpe, tmp_path / "bpe", progress=False)


def test_metrics_go_to_tensorboard_when_it_is_installed(corpus, tmp_path, monkeypatch):
    import sys
    import types

    written = []

    class SummaryWriter:
        def __init__(self, log_dir, purge_step):
            written.append(("open", str(log_dir), purge_step))

        def add_scalar(self, tag, value, step):
            written.append((tag, step))

        def close(self):
            written.append(("close",))

    monkeypatch.setitem(
        sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=SummaryWriter)
    )
    train(small_model(), settings(corpus, steps=3), tmp_path / "run", progress=False)
    assert written[0] == ("open", str(tmp_path / "run" / "tensorboard"), 0)
    assert ("train_loss", 2) in written and ("val_loss", 3) in written and written[-1] == ("close",)


def test_model_vocabulary_must_hold_the_tokenizer(corpus, tmp_path):
    with pytest.raises(ValueError, match="vocab_size is 100"):
        train(small_model(vocab_size=100), settings(corpus), tmp_path / "run", progress=False)


def test_retrieval_mix_changes_the_batches_and_needs_room(corpus, tmp_path):
    model = small_model(seq_len=192)
    plain = train(model, settings(corpus, steps=2, eval_every=0), tmp_path / "plain", progress=False)
    mixed = train(
        model, settings(corpus, steps=2, eval_every=0, retrieval_mix=1.0), tmp_path / "mix", progress=False
    )
    assert mixed.train_loss != plain.train_loss
    with pytest.raises(ValueError, match="too short for retrieval samples"):
        train(small_model(), settings(corpus, retrieval_mix=0.5), tmp_path / "short", progress=False)
    assert not (tmp_path / "short" / "config.json").exists()  # refused before the run was written


def test_a_run_written_before_a_config_field_existed_still_resumes(corpus, tmp_path):
    """Fields added to the configs later (here retrieval_mix, compile and the model's token_shift)
    take their defaults when a run from an earlier version is loaded or resumed, instead of counting
    as changed arguments."""
    from priorattn.train import load_run

    config, model = settings(corpus, steps=3, eval_every=0, save_every=0), small_model()
    train(model, config, tmp_path / "run", progress=False)
    path = tmp_path / "run" / "config.json"
    saved = json.loads(path.read_text())
    index_path = ckpt.checkpoint_json(tmp_path / "run", 3)
    index = json.loads(index_path.read_text())
    for field in ("retrieval_mix", "compile"):
        del saved["train"][field], index["state"]["configs"]["train"][field]
    del saved["model"]["token_shift"], index["state"]["configs"]["model"]["token_shift"]
    path.write_text(json.dumps(saved))
    index_path.write_text(json.dumps(index))
    assert TrainConfig.from_dict(saved["train"]).compile is False
    run = load_run(tmp_path / "run")
    assert run.model_config.token_shift is False and run.model.token_shift is None
    assert train(model, config, tmp_path / "run", resume=True, progress=False).step == 3


def test_a_run_that_failed_before_its_first_checkpoint_starts_again_in_place(corpus, tmp_path, monkeypatch):
    """A run that dies in its first step leaves config.json and data.json but nothing to continue:
    it can be started again with other arguments, with or without resume."""
    from priorattn.train import loop

    def fails(*args, **kwargs):
        raise RuntimeError("the first step failed")

    real_step = loop.train_step
    monkeypatch.setattr(loop, "train_step", fails)
    with pytest.raises(RuntimeError):
        train(small_model(prior="ggd"), settings(corpus), tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "config.json").exists()
    monkeypatch.setattr(loop, "train_step", real_step)
    for resume, lr in [(False, 1e-2), (True, 2e-2)]:  # other arguments each time
        result = train(
            small_model(), settings(corpus, lr=lr), tmp_path / "run", resume=resume, progress=False
        )
        assert result.step == 6
        assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["lr"] == lr
        assert [r["step"] for r in metrics(tmp_path / "run")] == [2, 3, 4, 6]
        if not resume:  # now the directory holds a run: a new start is refused
            with pytest.raises(FileExistsError, match="already holds a run"):
                train(small_model(), settings(corpus), tmp_path / "run", progress=False)
        for path in ckpt.checkpoint_indexes(tmp_path / "run"):  # so that the next turn starts afresh
            path.unlink()


def test_resume_falls_back_to_the_older_checkpoint_and_stays_exact(corpus, tmp_path, monkeypatch):
    """The newest of the two kept checkpoints is corrupted: resuming warns, continues from the older
    one, and logs exactly what the uninterrupted run logged."""

    config = settings(corpus, save_every=2, log_every=1)
    model = small_model(prior="goat", dropout=0.1)
    train(model, config, tmp_path / "whole", progress=False)
    train_until_killed(model, config, tmp_path / "split", monkeypatch)
    newest = tmp_path / "split" / "checkpoint-00000004.safetensors"
    newest.write_bytes(newest.read_bytes()[:-100])
    with pytest.warns(ckpt.CheckpointWarning, match="loading the older checkpoint checkpoint-00000002.json"):
        train(model, config, tmp_path / "split", resume=True, progress=False)

    def losses(run):
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in metrics(run)]

    assert losses(tmp_path / "split") == losses(tmp_path / "whole")


def test_raising_steps_continues_a_finished_run_on_the_longer_schedule(corpus, tmp_path):
    """The cosine is laid over the new total: from the first continued step the lr is the longer
    schedule's (it rises again from the old floor); lowering the steps is refused."""
    from priorattn.train.optim import lr_factor

    run = tmp_path / "run"
    train(small_model(), settings(corpus, steps=4, log_every=1), run, progress=False)
    longer = settings(corpus, steps=8, log_every=1)
    result = train(small_model(), longer, run, resume=True, progress=False)
    records = metrics(run)
    assert result.step == 8 and [r["step"] for r in records] == list(range(1, 9))
    for record in records:  # the lr used in step s (1-based) is factor(s - 1) of the run's schedule
        schedule = longer if record["step"] > 4 else settings(corpus, steps=4)
        assert record["lr"] == pytest.approx(longer.lr * lr_factor(record["step"] - 1, schedule), rel=1e-12)
    assert records[4]["lr"] > records[3]["lr"]  # not the old schedule's floor
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 8
    with pytest.raises(ValueError, match=r"only steps may be raised.*train.steps: run has 8, given 6"):
        train(small_model(), settings(corpus, steps=6), run, resume=True, progress=False)


@pytest.mark.parametrize("prior, refused", [("alibi", False), ("ggd", False), ("goat", True)])
def test_prior_init_differs_on_resume_only_where_a_prior_starts_otherwise(corpus, tmp_path, prior, refused):
    """A run saved with ``prior_init="uniform"`` (the default before GOAT's seeded start) resumes
    under the default ``None`` where its prior starts alike (ALiBi reads no start, GGD's own default
    is uniform); GOAT's default start is seeded, so its run is refused, naming the field."""
    run, config = tmp_path / "run", settings(corpus, steps=2)
    train(small_model(prior=prior, prior_init="uniform"), config, run, progress=False)
    again = settings(corpus, steps=3)
    if refused:
        with pytest.raises(ValueError, match=r"model.prior_init: run has 'uniform', given None"):
            train(small_model(prior=prior), again, run, resume=True, progress=False)
    else:
        assert train(small_model(prior=prior), again, run, resume=True, progress=False).step == 3
