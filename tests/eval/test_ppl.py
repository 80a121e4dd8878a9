"""Perplexity evaluation: windows, losses known in advance, the paired delta, chunked scoring."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from eval_fakes import CyclicModel, nats

from priorattn.eval import evaluate_ppl
from priorattn.eval.ppl import candidate_windows, pick_windows, position_bins
from priorattn.eval.scoring import token_losses
from priorattn.models import GPT, GPTConfig
from priorattn.priors import with_defaults

V, T = 16, 32
CYCLE = [np.arange(5000) % V, np.arange(3, 2003) % V]  # token t is always followed by t + 1


def test_losses_past_the_training_length_are_the_tail():
    """A model with loss a before position T and b from there: tail_loss is b, the mean loss mixes
    them by count, the paired delta is b - a (long context vs a window of T)."""
    model = CyclicModel(V, T, p_inside=0.5, p_beyond=0.125)
    r = evaluate_ppl(model, CYCLE, lengths=[T, 2 * T, 8 * T], train_len=T, windows=3, progress=False)
    a, b = nats(0.5), nats(0.125)
    assert r["tail_loss"][0] is None and r["paired_delta"][0] is None
    for i, L in enumerate(r["lengths"]):
        assert r["loss"][i] == pytest.approx((T * a + (L - T) * b) / L)
        assert r["ppl"][i] == pytest.approx(math.exp(r["loss"][i]))
    assert r["tail_loss"][1:] == pytest.approx([b, b])
    assert r["paired_delta"][1:] == pytest.approx([b - a, b - a])
    assert r["paired_delta_se"][1:] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert r["loss_se"] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)  # every window has the same losses
    one = evaluate_ppl(model, CYCLE, lengths=[2 * T], train_len=T, windows=1, progress=False)
    assert one["loss_se"] == [None] and one["paired_delta_se"] == [None]
    last = r["position_loss"][-1]
    assert last["edges"][0] == 1 and last["edges"][-1] == 8 * T + 1
    assert last["loss"][0] == pytest.approx(a) and last["loss"][-1] == pytest.approx(b)


def test_windows_do_not_overlap_stay_in_documents_and_depend_only_on_the_seed():
    docs = [np.arange(100), np.arange(1000, 1049)]
    assert candidate_windows(docs, 24) == [(0, 0), (0, 25), (0, 50), (0, 75), (1, 0)]
    chosen = pick_windows(docs, 24, 3, seed=7)
    assert len(chosen) == 3 and all(len(w) == 25 for w in chosen)
    assert all(np.array_equal(a, b) for a, b in zip(chosen, pick_windows(docs, 24, 3, seed=7)))
    starts = {int(w[0]) for w in chosen}
    assert starts <= {0, 25, 50, 75, 1000}
    assert len(pick_windows(docs, 24, 99, seed=0)) == 5  # all there are


def test_position_bins_cover_every_position_once():
    for L in (1, 2, 5, 64, 100):
        edges = position_bins(L)
        assert edges[0] == 1 and edges[-1] == L + 1 and edges == sorted(set(edges))


def test_text_too_short_for_a_length_is_a_clear_error():
    with pytest.raises(ValueError, match="no document of the evaluation text has 257 tokens"):
        evaluate_ppl(
            CyclicModel(V, T, 0.5, 0.5), [np.arange(100)], lengths=[256], train_len=T, progress=False
        )
    with pytest.raises(ValueError, match="positive integers"):
        evaluate_ppl(CyclicModel(V, T, 0.5, 0.5), CYCLE, lengths=[0], train_len=T, progress=False)


def test_loss_se_is_the_standard_error_over_windows():
    """One window of text the model predicts (loss a) and one it does not (a repeated token, loss
    b): the standard error of the mean of two values is half their distance."""
    model = CyclicModel(V, T, p_inside=0.5, p_beyond=0.5)
    a, b = nats(0.5), nats(0.5 / (V - 1))
    documents = [np.arange(40) % V, np.full(40, 3)]  # one window of T + 1 tokens in each
    r = evaluate_ppl(model, documents, lengths=[T], train_len=T, windows=2, progress=False)
    assert r["loss"] == pytest.approx([(a + b) / 2]) and r["loss_se"] == pytest.approx([(b - a) / 2])


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(train_len=-5), "train_len must be an int >= 1, got -5"),
        (dict(train_len=0), "train_len must be an int >= 1, got 0"),
        (dict(train_len=2.5), "train_len must be an int >= 1, got 2.5"),
        (dict(windows=0), "windows must be an int >= 1, got 0"),
        (dict(windows=2.5), "windows must be an int >= 1, got 2.5"),
        (dict(seed=-1), "seed must be an int >= 0, got -1"),
        (dict(seed=1.5), "seed must be an int >= 0, got 1.5"),
        (dict(chunk=0), "chunk must be an int >= 1, got 0"),
        (dict(documents=[]), "documents must hold at least one token array, got none"),
        (dict(lengths=[]), "lengths must be positive integers, got \\[\\]"),
    ],
)
def test_bad_input_is_a_one_line_error_naming_the_argument(options, message):
    arguments = dict(documents=CYCLE, lengths=[T, 2 * T], train_len=T, windows=2, seed=0) | options
    with pytest.raises(ValueError, match=message):
        evaluate_ppl(CyclicModel(V, T, 0.5, 0.5), arguments.pop("documents"), progress=False, **arguments)


@pytest.mark.parametrize("prior, encoding", [("uniform", "rope"), ("ggd", "none"), ("goat", "none")])
def test_chunked_scoring_equals_one_pass(prior, encoding):
    """Chunked prefill through the KV cache scores every token as one pass over the window does."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=V, seq_len=16, d_model=32, n_layers=2, n_heads=2)
    config = GPTConfig(**sizes, prior=with_defaults(prior, goat=dict(num_freqs=3)), encoding=encoding)
    model = GPT(config).double().eval()
    tokens = torch.randint(0, V, (2, 97))
    with torch.no_grad():
        logits, _, _ = model(tokens[:, :-1])
    whole = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    for chunk in (None, 7, 32, 96):
        assert torch.allclose(token_losses(model, tokens, chunk), whole, atol=1e-10)


def test_scoring_chunks_the_logits_of_a_large_vocabulary(monkeypatch):
    from priorattn.eval import scoring

    model = CyclicModel(V, T, 0.5, 0.5)
    monkeypatch.setattr(scoring, "LOGITS_BUDGET", 4 * V * 10)  # ten positions of logits at a time
    token_losses(model, torch.from_numpy(CYCLE[0][:36])[None])
    assert model.calls == [10, 10, 10, 5]


MEASURE = """
import resource, sys, torch
from priorattn.eval.scoring import token_losses
from priorattn.models import GPT, GPTConfig
torch.manual_seed(0)
prior, encoding, L = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_layers=1, n_heads=2, prior=prior,
                   encoding=encoding, window=64 if encoding == "local_rope" else None)
model = GPT(config).eval()
tokens = torch.randint(0, 256, (1, L + 1))
token_losses(model, tokens[:, :300])  # warm up: libraries and kernels loaded
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
losses = token_losses(model, tokens)
assert losses.shape == (1, L) and bool(torch.isfinite(losses).all())
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.parametrize("prior, encoding", [("ggd", "none"), ("uniform", "local_rope")])
def test_a_long_input_is_scored_in_bounded_memory(prior, encoding):
    """16k tokens in one process: the peak grows by far less than one dense L x L logit matrix."""
    import subprocess
    import sys

    L = 16384
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, prior, encoding, str(L)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    dense = 2 * L * L * 4  # two heads of float32 logits: 2.1 GB
    assert int(done.stdout) < dense / 8
