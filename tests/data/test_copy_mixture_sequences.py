"""The copy-mixture sequences of seed 000 Fig. 1: sources in their proportions, copies that are
copies, noise that is uniform, batches that are a function of (seed, step), clear errors."""

from __future__ import annotations

import math
import re

import pytest
import torch

from priorattn.data.copy_mixture import FIRST, NOISE, PREVIOUS, CopyMixture, CopyMixtureBatches


def sample(task: CopyMixture, batch_size=400, length=50, seed=0):
    return task.sample(batch_size, length, torch.Generator().manual_seed(seed))


def within(count: int, total: int, p: float, sigmas: float = 5.0) -> bool:
    """Whether ``count`` of ``total`` Bernoulli(p) draws is within ``sigmas`` standard deviations."""
    return abs(count - total * p) <= sigmas * math.sqrt(total * p * (1 - p)) + 1e-9


def test_sources_follow_the_mixture_weights():
    task = CopyMixture(vocab_size=8, weights=(0.2, 0.5, 0.3))
    _, sources = sample(task)
    later = sources[:, 1:]
    for source, weight in zip((FIRST, PREVIOUS, NOISE), task.weights):
        assert within(int((later == source).sum()), later.numel(), weight)
    assert (sources[:, 0] == NOISE).all()  # x_0 is drawn uniformly


def test_copies_are_copies():
    tokens, sources = sample(CopyMixture(vocab_size=8, weights=(0.3, 0.4, 0.3)))
    first = tokens[:, :1].expand_as(tokens)
    assert torch.equal(tokens[sources == FIRST], first[sources == FIRST])
    previous = sources[:, 1:] == PREVIOUS
    assert torch.equal(tokens[:, 1:][previous], tokens[:, :-1][previous])
    assert previous.any() and (sources == FIRST).any()


def test_noise_and_the_first_token_are_uniform():
    V = 5
    tokens, sources = sample(CopyMixture(vocab_size=V, weights=(0.0, 0.0, 1.0)))
    assert (sources[:, 1:] == NOISE).all()
    for v in range(V):
        assert within(int((tokens == v).sum()), tokens.numel(), 1 / V)
        assert within(int((tokens[:, 0] == v).sum()), tokens.shape[0], 1 / V)


@pytest.mark.parametrize("weights", [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.5, 0.5, 0.0)])
def test_without_noise_every_token_is_the_first(weights):
    tokens, _ = sample(CopyMixture(vocab_size=16, weights=weights), batch_size=20, length=30)
    assert torch.equal(tokens, tokens[:, :1].expand_as(tokens))


def test_sampling_is_a_function_of_the_generator_seed():
    task = CopyMixture()
    assert all(torch.equal(a, b) for a, b in zip(sample(task, seed=3), sample(task, seed=3)))
    assert not torch.equal(sample(task, seed=3)[0], sample(task, seed=4)[0])


def test_batches_are_a_function_of_seed_and_step():
    task = CopyMixture()
    batches, again = CopyMixtureBatches(task, 4, 10, seed=1), CopyMixtureBatches(task, 4, 10, seed=1)
    tokens, targets, doc_ids = batches.batch(5)
    assert all(torch.equal(a, b) for a, b in zip((tokens, targets, doc_ids), again.batch(5)))
    assert not torch.equal(tokens, batches.batch(6)[0])
    assert not torch.equal(tokens, CopyMixtureBatches(task, 4, 10, seed=2).batch(5)[0])
    assert tokens.shape == targets.shape == doc_ids.shape == (4, 10)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])  # targets are the next tokens
    assert (doc_ids == 0).all()


def test_optimal_nll_by_hand():
    task = CopyMixture(vocab_size=4, weights=(0.5, 0.25, 0.25))
    sequence = torch.tensor([[0, 0, 1, 1]])
    nll = task.optimal_nll(sequence[:, :-1], sequence[:, 1:])
    # x_1 = 0 = x_0 = x_t: 0.5 + 0.25 + 0.25/4; x_2 = 1 is noise only; x_3 = 1 = x_t: 0.25 + 0.25/4
    assert torch.allclose(nll, -torch.tensor([[0.8125, 0.0625, 0.3125]]).log())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(vocab_size=1), "vocab_size must be an int >= 2, got 1"),
        (dict(vocab_size=4.0), "vocab_size must be an int >= 2, got 4.0"),
        (dict(weights=(0.5, 0.5)), "weights must be 3 numbers for ('first', 'previous', 'noise')"),
        (dict(weights="abc"), "weights must be 3 numbers"),
        (dict(weights=(0.5, 0.6, -0.1)), "weights must be finite and >= 0"),
        (dict(weights=(0.5, float("nan"), 0.5)), "weights must be finite and >= 0"),
        (dict(weights=(0.2, 0.2, 0.2)), "weights must sum to 1, got (0.2, 0.2, 0.2) (sum 0.6)"),
    ],
)
def test_bad_task_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CopyMixture(**kwargs)


def test_bad_sizes_are_named():
    task = CopyMixture()
    with pytest.raises(ValueError, match="length must be an int >= 1, got 0"):
        sample(task, length=0)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got -1"):
        CopyMixtureBatches(task, -1, 8, seed=0)
    with pytest.raises(ValueError, match="length must be an int >= 1, got 0"):
        CopyMixtureBatches(task, 2, 0, seed=0)
    with pytest.raises(ValueError, match="seed must be an int, got 'a'"):
        CopyMixtureBatches(task, 2, 8, seed="a")
    with pytest.raises(ValueError, match="step must be an int >= 0, got -1"):
        CopyMixtureBatches(task, 2, 8, seed=0).batch(-1)
