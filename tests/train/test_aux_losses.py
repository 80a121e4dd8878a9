"""The model's auxiliary losses in training: the loop adds what the model gives, the scalar
regularizers follow their schedule, and their ``reg_*`` options (``ScalarOptions``) are checked by
name."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import small_model

from priorattn.data.packing import IGNORE_INDEX
from priorattn.mechanisms import AuxLosses
from priorattn.models import GPT
from priorattn.scalar import Regularization, ScalarOptions
from priorattn.train import TrainConfig
from priorattn.train.distributed import Process
from priorattn.train.loop import train_step


class HeadSum(AuxLosses):
    """Two losses on the head's weights, ``0.1 sum(W)`` and ``0.15 sum(W)``: their sum's gradient
    is 0.25 on every weight."""

    def __init__(self, model):
        self.model = model

    def start(self, step):
        pass

    def losses(self):
        total = self.model.head.weight.sum()
        return {"a": 0.1 * total, "b": 0.15 * total}

    def logged(self):
        return {}


def test_a_step_adds_the_mean_over_micro_batches_of_the_sum_of_the_models_losses():
    config = TrainConfig(grad_clip=None)
    tokens = torch.randint(0, 256, (2, 2, 16))
    targets = tokens.roll(-1, dims=-1).index_fill(-1, torch.tensor([15]), IGNORE_INDEX)
    micro_batches = [(tokens[i], targets[i], torch.zeros(2, 16, dtype=torch.long)) for i in range(2)]
    stepped = {}
    for name in ("plain", "with aux"):
        torch.manual_seed(0)
        model = GPT(small_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        aux = HeadSum(model) if name == "with aux" else None
        loss, _ = train_step(model, micro_batches, optimizer, config, Process(), aux)
        stepped[name] = (loss, model.head.weight.detach())
    assert stepped["plain"][0] == stepped["with aux"][0]  # the logged loss is the cross-entropy alone
    moved = stepped["plain"][1] - stepped["with aux"][1]
    torch.testing.assert_close(moved, torch.full_like(moved, 0.25), rtol=0, atol=1e-5)


def test_the_scalar_regularizers_are_the_models_weighted_losses_from_their_start_step():
    options = dict(tau="token", reg_align=0.5, reg_spread=0.1, reg_spread_start=3, reg_tau=0.01)
    model = GPT(small_model(attention="hybrid", attention_options=options)).train()
    config = model.config.attention_options
    aux = model.aux_losses()
    tokens = torch.randint(0, 256, (2, 16))
    for step, names in ((2, {"align", "tau"}), (3, {"align", "spread", "tau"})):
        aux.start(step)
        model(tokens)
        losses = aux.losses()
        assert set(losses) == names
        logged = aux.logged()  # unweighted terms, averaged over this step's one pass
        for name in names:
            weight = getattr(config, f"reg_{name}")
            assert losses[name].item() == pytest.approx(weight * logged[f"reg_{name}"], rel=1e-6)
        assert losses["align"].requires_grad and 0 < logged["tau"]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(reg_align=-1.0), "the align regularizer weight must be a number >= 0, got -1.0"),
        (dict(reg_tau=True), "the tau regularizer weight must be a number >= 0, got True"),
        (dict(reg_spread_start=-1), "spread_start must be an int >= 0 .*, got -1"),
        (dict(reg_spread_range=(1.0, 0.0)), r"spread_range must be \(a, b\) with a < b"),
        (dict(reg_spread_range=(1.0,)), r"reg_spread_range must be two numbers \(a, b\) or None"),
    ],
)
def test_bad_regularizer_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        ScalarOptions(**options)


def test_regularizer_options_survive_a_json_round_trip():
    config = small_model(attention="hybrid", attention_options=dict(reg_spread=0.1, reg_spread_range=(-2, 2)))
    assert config.attention_options.reg_spread_range == (-2.0, 2.0)
    loaded = type(config).from_dict(json.loads(json.dumps(config.to_dict())))
    assert loaded == config
    assert loaded.attention_options.regularization() == Regularization(spread=0.1, spread_range=(-2.0, 2.0))


def test_training_configs_have_no_regularizer_fields():
    with pytest.raises(TypeError, match="reg_align"):
        TrainConfig(reg_align=0.1)
    with pytest.raises(ValueError, match=r"\['reg_align'\] are now options of the attention mechanism"):
        TrainConfig.from_dict(dict(reg_align=0.1))
