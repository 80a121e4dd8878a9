"""Runs saved with the flattened prior fields (``goat_freqs``, ``ggd_trainable``, ...) of priorattn at
commit a7edaba build the same model today: fixtures in ``fixtures/legacy_runs`` (see its README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from priorattn.models import GPT, GPTConfig
from priorattn.train.runs import saved_configs

FIXTURES = Path(__file__).parent / "fixtures" / "legacy_runs"
RUNS = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
#: What each saved run's prior reads as today.
SPECS = {
    "alibi_ggd_goat": "alibi+ggd(trainable=[alpha, mu])+goat(num_freqs=1, sink=none)",
    "ggd": "ggd",
    "goat": "goat(num_freqs=2, sink=per_head, slope=none, sink_freqs=3, sink_hidden=5)",
}


def saved(name: str) -> tuple[dict, dict, dict]:
    run = FIXTURES / name
    configs = json.loads((run / "config.json").read_text())
    return (
        configs,
        load_file(str(run / "tensors.safetensors")),
        json.loads((run / "parameters.json").read_text()),
    )


def test_every_fixture_is_checked():
    assert RUNS == sorted(SPECS)


@pytest.mark.parametrize("name", RUNS)
def test_a_legacy_config_reads_its_flattened_fields_as_prior_options(name):
    configs, _, _ = saved(name)
    config = GPTConfig.from_dict(configs["model"])
    assert config.prior == SPECS[name]
    assert config.prior_init == configs["model"]["prior_init"]
    assert GPTConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


@pytest.mark.parametrize("name", RUNS)
def test_a_legacy_run_builds_the_same_parameters_init_and_outputs(name):
    configs, tensors, parameters = saved(name)
    torch.manual_seed(0)  # as the fixture's model was built
    model = GPT(GPTConfig.from_dict(configs["model"]))
    init = {key.removeprefix("init."): value for key, value in tensors.items() if key.startswith("init.")}
    state = model.state_dict()
    assert init
    # Within float32 rounding, not bits: GOAT's slope m_h is softplus(softplus^-1(m)), its spectral
    # start a least-squares fit, and another x86-64 CPU (AVX-512 against AVX2) rounds both otherwise.
    for key, value in init.items():
        torch.testing.assert_close(today(state, key), value, rtol=1e-5, atol=1e-12)
    weights = {
        key.removeprefix("model."): value for key, value in tensors.items() if key.startswith("model.")
    }
    assert sorted(state) == sorted(key + "_raw" if key.endswith(".slope") else key for key in weights)
    model.load_state_dict(weights, strict=True)
    for key, value in weights.items():  # the saved m_h, within rounding of softplus(softplus^-1(m))
        torch.testing.assert_close(today(model.state_dict(), key), value, rtol=1e-5, atol=0)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad and ".prior." in n)
    assert trainable == sorted(
        n + "_raw" if n.endswith(".slope") else n for n in parameters["trainable_prior"]
    )
    assert sorted(n for n, p in model.named_parameters() if not p.requires_grad) == parameters["frozen"]
    with torch.no_grad():
        logits = model(tensors["tokens"])[0]
    # Likewise float32 rounding: another CPU sums in another order (seen: off by up to 2e-7).
    torch.testing.assert_close(logits, tensors["logits"], rtol=1e-5, atol=1e-5)


def today(state: dict, key: str) -> torch.Tensor:
    """The saved tensor ``key`` as today's ``state`` holds it: GOAT's slope ``m_h`` (parameter
    ``slope`` then) is ``softplus(slope_raw)`` (issue 28)."""
    if key.endswith(".slope"):
        return torch.nn.functional.softplus(state[key + "_raw"])
    return state[key]


def test_a_legacy_run_resumes_with_todays_config_of_the_same_model():
    configs, _, _ = saved("goat")
    today = GPTConfig(
        **{
            key: value
            for key, value in configs["model"].items()
            if not key.startswith(("goat_", "ggd_", "scalar_"))
        }
        | dict(prior=SPECS["goat"])
    )
    assert saved_configs(configs)["model"] == today.to_dict()
    # the scalar fields (at their defaults: a standard model) and the regularizers leave no trace
    assert today.attention_options is None
    assert not any(key.startswith("reg_") for key in saved_configs(configs)["train"])
