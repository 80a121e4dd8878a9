"""transformers models saved by ``add_prior`` before the prior registry load and give the logits they
gave then: fixtures in ``fixtures/legacy`` (see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import priorattn.hf as phf
from priorattn.priors import GGD, Sum

FIXTURES = Path(__file__).parent / "fixtures" / "legacy"


def expected(name: str) -> dict:
    return load_file(str(FIXTURES / name / "expected.safetensors"))


def assert_same_logits(logits: torch.Tensor, recorded: torch.Tensor) -> None:
    """The logits recorded then, to float32 rounding: the fixtures were written on one CPU, and
    another x86-64 CPU (AVX-512 against AVX2 kernels) sums in another order, off by up to 2e-7."""
    torch.testing.assert_close(logits, recorded, rtol=1e-5, atol=1e-5)


def test_a_legacy_goat_with_a_negative_slope_is_refused_with_the_reason():
    """The fixture's GOAT learned slopes 0.09 and -0.024: the second rewards distance, which GOAT's
    slope (softplus, issue 28) cannot represent, so it cannot give the logits it gave then."""
    with pytest.raises(
        ValueError,
        match=r"recency slopes \[0.0914, -0.0239\]: a negative one rewards distance \(anti-recency",
    ):
        phf.from_pretrained(FIXTURES / "goat_shared")


@pytest.mark.parametrize("name, shared", [("alibi_ggd", False)])
def test_a_legacy_checkpoint_of_a_named_prior_loads_with_its_options(name, shared):
    model = phf.from_pretrained(FIXTURES / name).eval()
    with torch.no_grad():
        logits = model(expected(name)["tokens"]).logits
    assert_same_logits(logits, expected(name)["logits"])
    priors = [layer.prior for layer in phf.attention_layers(model)]
    assert (priors[0] is priors[1]) == shared
    assert model.config.priorattn["shared_prior"] == shared


def test_legacy_options_become_the_priors_options():
    alibi_ggd = phf.attention_layers(phf.from_pretrained(FIXTURES / "alibi_ggd"))[1].prior
    assert isinstance(alibi_ggd, Sum)
    assert alibi_ggd.spec()[1]["trainable"] == ["alpha", "beta", "mu"]
    assert all(p.requires_grad for p in alibi_ggd.parts[1].parameters())


def test_a_legacy_checkpoint_of_a_module_loads_with_the_module_given_again():
    path = FIXTURES / "ggd_module"
    with pytest.raises(ValueError, match="with a GGD module .* pass prior= a GGD built the same way"):
        phf.from_pretrained(path)
    model = phf.from_pretrained(path, prior=GGD(2, trainable=("alpha", "beta", "mu"))).eval()
    with torch.no_grad():
        logits = model(expected("ggd_module")["tokens"]).logits
    assert_same_logits(logits, expected("ggd_module")["logits"])
