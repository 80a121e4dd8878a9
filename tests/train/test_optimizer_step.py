"""The one optimizer step: what it does in which order, and that every training path takes it."""

from __future__ import annotations

import json
import traceback

import pytest
import torch
from conftest import small_model
from torch import nn

from priorattn.train import TrainConfig, train
from priorattn.train.optim import optimizer_step


def linear_at_zero() -> tuple[nn.Linear, torch.optim.SGD]:
    """A 2 -> 1 linear map with weights 0 and gradient (3, 4) (norm 5), under SGD at lr 1."""
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


def test_optimizer_step_clips_steps_drops_the_gradients_then_advances_the_schedule():
    model, optimizer = linear_at_zero()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    assert optimizer_step(model, optimizer, scheduler, grad_clip=1.0) == 5.0  # the norm before clipping
    # the clipped gradient (0.6, 0.8), at the rate of the step taken (1), not the schedule's next (0.5)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[-0.6, -0.8]]))
    assert model.weight.grad is None
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_optimizer_step_without_a_clip_or_a_schedule_steps_the_whole_gradient_at_a_fixed_rate():
    model, optimizer = linear_at_zero()
    assert optimizer_step(model, optimizer, None, grad_clip=None) == 5.0
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[-3.0, -4.0]]))
    assert model.weight.grad is None and optimizer.param_groups[0]["lr"] == 1.0


@pytest.fixture
def adamw_steps(monkeypatch) -> list[bool]:
    """One entry per AdamW step taken while the test runs: whether it was taken inside
    :func:`optimizer_step` (found on the call stack, however the caller imported it)."""
    taken = []
    real = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        taken.append(any(frame.f_code is optimizer_step.__code__ for frame, _ in traceback.walk_stack(None)))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return taken


def train_language_model(tmp_path, corpus) -> int:
    config = TrainConfig(
        data=str(corpus), steps=2, batch_size=4, grad_accum=2, warmup_steps=1, eval_sequences=2
    )
    return train(small_model(), config, tmp_path / "run", progress=False).step


def train_retrieval_model(tmp_path, corpus) -> int:
    from priorattn.studies.retrieval.study import RetrievalStudyConfig, train_synthetic

    config = RetrievalStudyConfig(mechanisms=["nope"], steps=2, batch_size=2, curriculum_steps=0)
    _, log = train_synthetic(config, "nope", seed=0, progress=False)
    return log["steps"]


def train_vision_model(tmp_path, corpus) -> int:
    from priorattn.studies.vision.experiment import VisionConfig, train_model
    from priorattn.studies.vision.model import ViT

    config = VisionConfig(steps=2, batch_size=4)
    images, labels = torch.randn(8, 1, 28, 28), torch.arange(8) % 10
    train_model(ViT(config.model_config("goat")), images, labels, config.train_config(), False, "goat")
    return config.steps


def extend_hf_model(tmp_path, corpus) -> int:
    pytest.importorskip("transformers")
    from priorattn.hf.extend import extend

    model = dict(model_type="llama", vocab_size=256, hidden_size=32, intermediate_size=64)
    model |= dict(
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16
    )
    (tmp_path / "config.json").write_text(json.dumps(model))
    config = TrainConfig(
        data=str(corpus), seq_len=32, steps=2, batch_size=2, warmup_steps=1, eval_sequences=1
    )
    return extend(tmp_path / "config.json", tmp_path / "out", config, progress=False)["steps"]


def train_copy_mixture_model(tmp_path, corpus) -> int:
    from priorattn.studies.copy_mixture import CopyMixtureConfig, train_copy_mixture

    _, losses = train_copy_mixture(CopyMixtureConfig(steps=2, batch_size=2, length=16), progress=False)
    return len(losses)


@pytest.mark.parametrize(
    "train_one",
    [
        train_language_model,
        train_retrieval_model,
        train_vision_model,
        extend_hf_model,
        train_copy_mixture_model,
    ],
    ids=["train", "retrieval", "vision", "hf-extend", "copy-mixture"],
)
def test_every_training_path_takes_each_optimizer_step_in_optimizer_step(
    train_one, adamw_steps, tmp_path, corpus
):
    steps = train_one(tmp_path, corpus)
    assert steps == 2 and adamw_steps == [True] * steps
