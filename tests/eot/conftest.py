"""Tiny trained runs for the identity checks: a few steps on a word-salad corpus in tmp."""

from __future__ import annotations

import pytest

from priorattn.models import GPTConfig
from priorattn.train import TrainConfig, train

WORDS = "now is the winter of our discontent made glorious summer by this sun of york".split()


@pytest.fixture(scope="session")
def make_run(tmp_path_factory):
    """``make_run(**model_overrides)`` -> the run directory of a 2-layer model trained 6 steps."""
    import random

    root = tmp_path_factory.mktemp("eot-runs")
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(400)))
    runs = {}

    def make(**overrides):
        key = tuple(sorted(overrides.items()))
        if key not in runs:
            mp = pytest.MonkeyPatch()
            mp.setenv("PRIORATTN_CACHE", str(root / "cache"))
            model = GPTConfig(
                **dict(vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=2, goat_freqs=2)
                | overrides
            )
            run_dir = root / f"run{len(runs)}"
            config = TrainConfig(data=str(corpus), steps=6, batch_size=4, eval_sequences=2, lr=3e-3)
            train(model, config, run_dir, progress=False)
            mp.undo()
            runs[key] = run_dir
        return runs[key]

    return make
