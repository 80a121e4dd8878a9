"""A prior is one file: the priors package imports every prior file of its own, and a prior defined
and registered here, nowhere in ``src``, trains through ``priorattn.train``, runs in ``compare`` and
saves and reloads through the HF plug-in."""

from __future__ import annotations

import pkgutil

import pytest
import torch
from factories import word_salad
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, LlamaConfig

import priorattn.hf as phf
import priorattn.priors
from priorattn.models import GPTConfig
from priorattn.models.named import positions
from priorattn.priors import FromModel, Prior, names, register, registered
from priorattn.priors.math import relative_positions
from priorattn.studies.compare.study import CompareConfig, compare
from priorattn.train import TrainConfig, load_run, train


class LearnedSlope(Prior):
    """``K_h(i, j) = -m_h |i - j|`` with a learnable slope ``m_h`` per head: ALiBi that learns.

    ``start``: ``"zero"`` (standard attention) or ``"alibi"`` (every head at slope 1/2).
    """

    def __init__(self, num_heads: int, start: str = "zero", scale: float = 1.0):
        super().__init__()
        if start not in ("zero", "alibi"):
            raise ValueError(f"start must be 'zero' or 'alibi', got {start!r}")
        self.num_heads = num_heads
        self.slope = nn.Parameter(torch.full((num_heads,), 0.0 if start == "zero" else 0.5 * scale))

    @property
    def is_relative(self) -> bool:
        return True

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        distance = relative_positions(q_pos, k_pos, self.slope.dtype).abs()  # (..., 1, Lq, Lk)
        return -self.slope[:, None, None] * distance


register(
    "learned_slope",
    LearnedSlope,
    start=FromModel("'zero' or 'alibi' (slope 1/2)", "init", {"uniform": "zero", "alibi": "alibi"}),
    scale="multiplies the 'alibi' start",
)


def test_the_package_imports_each_prior_file_and_exports_its_names():
    """Every module of ``priors/`` outside ``INFRASTRUCTURE`` is imported with the package: each
    registers a prior, whose class the package exports by its name (a prior file's ``__all__``)."""
    package = priorattn.priors
    modules = {info.name for info in pkgutil.iter_modules(package.__path__)}
    assert set(package.INFRASTRUCTURE) <= modules
    assert set(package.PRIOR_MODULES) == modules - set(package.INFRASTRUCTURE)
    library = [registered(name).cls for name in names()]
    library = [cls for cls in library if cls.__module__.startswith("priorattn.priors.")]
    assert {cls.__module__.removeprefix("priorattn.priors.") for cls in library} == set(package.PRIOR_MODULES)
    for cls in library:
        assert getattr(package, cls.__name__) is cls and cls.__name__ in package.__all__
    assert {"GOAT", "ALiBi", "GGD", "Uniform", "PerHeadSink", "Sum", "Prior"} <= set(package.__all__)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Six documents of about 3 kB of word salad."""
    return word_salad(tmp_path_factory.mktemp("corpus"), "a learned slope per head is all this prior has")


def test_a_prior_registered_in_a_test_module_is_known_by_name():
    assert "learned_slope" in names()
    assert positions()["learned_slope"] == dict(prior="learned_slope")
    config = GPTConfig(
        vocab_size=8, seq_len=8, d_model=8, n_layers=1, n_heads=2, prior="learned_slope(scale=2)"
    )
    assert config.prior == "learned_slope(scale=2.0)"


def test_it_trains_through_the_python_api_and_its_run_reloads(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    model = GPTConfig(
        vocab_size=256,
        seq_len=32,
        d_model=32,
        n_layers=2,
        n_heads=2,
        prior="learned_slope",
        prior_init="alibi",
    )
    options = TrainConfig(
        data=str(corpus), steps=4, batch_size=2, eval_sequences=2, warmup_steps=1, prior_lr=0.1
    )
    result = train(model, options, tmp_path / "run", progress=False)
    assert result.step == 4
    run = load_run(tmp_path / "run")
    slopes = [block.attn.prior.slope for block in run.model.blocks]
    assert all(isinstance(block.attn.prior, LearnedSlope) for block in run.model.blocks)
    assert all(not torch.equal(s, torch.full_like(s, 0.5)) for s in slopes)  # started at 1/2 (alibi), trained


def test_it_runs_in_compare(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    config = CompareConfig(
        models=["learned_slope"],
        data=str(corpus),
        seq_len=128,
        steps=2,
        batch_size=2,
        ppl_factors=[1, 2],
        ppl_windows=1,
        retrieval_factors=[1],
        passkey_depths=1,
        niah_depths=1,
        trials=1,
        retrieval=None,
    )
    data = compare(config, tmp_path / "out", progress=False, log=lambda line: None)
    (row,) = data["models"].values()
    assert row["label"] == "LearnedSlope"
    assert load_run(tmp_path / "out" / "models" / "learned_slope").model_config.prior == "learned_slope"


def test_it_saves_and_reloads_through_the_hf_plug_in(tmp_path):
    llama = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    tokens = torch.randint(0, 64, (2, 10))
    given = dict(
        module=(LearnedSlope(4, start="alibi", scale=0.5), {}),
        spec=("learned_slope", dict(prior_init="alibi")),
    )
    for name, (prior, options) in given.items():
        model = phf.add_prior(AutoModelForCausalLM.from_config(llama), prior, **options)
        with torch.no_grad():
            for layer in phf.attention_layers(model):
                layer.prior.slope.add_(torch.rand(4))  # away from its start, so loading it matters
        model.save_pretrained(tmp_path / name)
        loaded = phf.from_pretrained(tmp_path / name)
        scale = 0.5 if name == "module" else 1.0
        assert loaded.config.priorattn["prior"] == dict(name="learned_slope", start="alibi", scale=scale)
        with torch.no_grad():
            assert torch.equal(loaded.eval()(tokens).logits, model.eval()(tokens).logits)
