"""Shared over every prior of the cases (tests/factories.py): each prior's test module gives its
formula by hand, and here per-row positions give each row its own log-prior by it; the priors' lag and
sink tables follow their parameters; decode tiles equal the log-prior; a sum adds its parts."""

from __future__ import annotations

import pytest
import torch
from factories import PRIOR_NAMES, grid, log_prior_by_hand, make_prior, prior_test_module

import priorattn.priors
from priorattn.priors import ALiBi, Sum, names, registered
from priorattn.priors.base import module_tensors


def test_every_prior_file_has_a_test_module_giving_its_random_priors_and_formula():
    """A prior file without ``tests/priors/test_NAME.py`` (or without its ``RANDOM_PRIORS`` and
    ``log_prior_by_hand``) fails here by name, and every shared test at collection."""
    for name in priorattn.priors.PRIOR_MODULES:
        module = prior_test_module(name)
        assert module.RANDOM_PRIORS and callable(module.log_prior_by_hand), name
        for case in module.RANDOM_PRIORS:
            assert type(make_prior(case, 2)).__module__ == f"priorattn.priors.{name}", case
    classes = {type(make_prior(case, 4)) for case in PRIOR_NAMES}
    library = {registered(name).cls for name in names()}
    library = {cls for cls in library if cls.__module__.startswith("priorattn.")}  # not the tests' own
    assert len(library) >= 8 and library <= classes


def test_batched_positions_give_each_row_its_own_log_prior(prior_name):
    prior = make_prior(prior_name, 2)
    q_pos = torch.tensor([[3, 4], [10, 11]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    K = prior.log_prior(q_pos, k_pos)
    assert K.shape[0] == 2 and K.shape[-2:] == (2, 5)
    for b in range(2):
        expected = [
            [[log_prior_by_hand(prior, h, i, j) for j in k_pos[b].tolist()] for i in q_pos[b].tolist()]
            for h in range(2)
        ]
        assert torch.allclose(
            K[b].expand(2, 2, 5), torch.tensor(expected, dtype=K.dtype), rtol=1e-12, atol=1e-12
        )


@pytest.mark.parametrize("name", ["goat", "ggd", "ggd_negative"])
def test_log_prior_outside_autograd_reads_tables_that_follow_the_parameters(name):
    """Outside autograd (generation) GOAT's sink and lag terms and GGD's lag terms come from
    ``PositionTable``s; they grow past their end and are rebuilt when a parameter changes in place or
    is replaced, so the log-prior always equals its evaluation under autograd, which uses no table."""
    prior = make_prior(name, 2, seed=5)
    tables = [prior.by_lag] + ([prior.sink.by_position] if name == "goat" else [])
    cases = [(torch.arange(3, 5), torch.arange(5)), (torch.arange(11, 12), torch.arange(12))]
    cases += [(torch.tensor([[7], [40]]), torch.tensor([[0, 3, 7], [2, 2, 40]]))]  # per sequence
    cases += [(torch.arange(-3, 4), torch.arange(-3, 4))]  # negative positions and lags: evaluated
    cases += [(torch.tensor([10**6]), torch.tensor([0, 10**6]))]  # far: evaluated, no table to 10^6

    def check():
        for q_pos, k_pos in cases:
            expected = prior.log_prior(q_pos, k_pos)  # under autograd: evaluated
            with torch.no_grad():
                torch.testing.assert_close(prior.log_prior(q_pos, k_pos), expected, rtol=0, atol=1e-12)

    check()
    assert all(12 <= table.values.shape[-1] < 10**6 for table in tables)  # grown from 5 to 12, no further
    first = next(p for p in prior.parameters() if p.requires_grad)
    with torch.no_grad():
        first.add_(0.25)  # an optimizer step: in place
    check()
    last = list(prior.named_parameters())[-1][0].rsplit(".", 1)
    owner = prior.get_submodule(last[0]) if len(last) == 2 else prior
    setattr(owner, last[-1], torch.nn.Parameter(getattr(owner, last[-1]).detach() + 0.5))  # replaced
    check()


@pytest.mark.parametrize("name", ["alibi", "ggd", "goat", "sum"])
def test_module_tensors_are_the_parameters_and_buffers(name):
    """What a table's staleness check reads: every parameter and buffer, submodules' included."""
    prior = make_prior(name, 2)
    prior.register_parameter("unset", None)  # registered as None: no tensor
    prior.register_module("absent", None)
    expected = {id(t) for t in (*prior.parameters(), *prior.buffers())}
    assert {id(t) for t in module_tensors(prior)} == expected


@pytest.mark.parametrize("name", ["alibi", "ggd", "ggd_negative", "goat", "goat_noslope", "sum"])
def test_log_prior_of_runs_equals_log_prior_and_reads_table_views(name):
    """A decode step's tile from ``log_prior_of_runs``: outside autograd views of the priors'
    tables (a falling run of lags, the sink's rising run of keys), as the log-prior evaluated under
    autograd; also where the tables grow, after a parameter changes, for several queries, and for
    negative lags or far positions, which are evaluated."""
    prior = make_prior(name, 2, seed=7)
    runs = [(4, 1, 0, 5), (11, 3, 0, 14), (40, 1, 0, 41), (3, 2, 5, 4), (10**6, 1, 10**6 - 3, 4)]

    def check():
        for q_start, Lq, k_start, Lk in runs:
            q_pos, k_pos = torch.arange(q_start, q_start + Lq), torch.arange(k_start, k_start + Lk)
            expected = prior.log_prior(q_pos, k_pos)  # under autograd: evaluated
            with torch.no_grad():
                tile = prior.log_prior_of_runs(q_start, Lq, k_start, Lk, q_pos.device, torch.float64)
                tile32 = prior.log_prior_of_runs(q_start, Lq, k_start, Lk, q_pos.device, torch.float32)
            torch.testing.assert_close(tile, expected, rtol=0, atol=1e-12)
            assert tile32.dtype == torch.float32  # the float64 prior's values, cast
            torch.testing.assert_close(tile32, expected.float(), rtol=1e-6, atol=1e-6)

    check()
    if name in ("alibi", "ggd", "ggd_negative"):  # the whole tile is one view of the reversed table
        with torch.no_grad():
            tile = prior.log_prior_of_runs(40, 1, 0, 41, torch.device("cpu"), torch.float32)
        copy = prior.by_lag.copies[torch.float32, True]
        assert tile.untyped_storage().data_ptr() == copy.untyped_storage().data_ptr()
    learnable = [p for p in prior.parameters() if p.requires_grad]
    if learnable:
        with torch.no_grad():
            learnable[0].add_(0.25)  # an optimizer step: tables and their reversed copies are stale
        check()


def test_sum_adds_log_priors():
    a, b = make_prior("alibi", 3), make_prior("goat", 3, seed=2)
    q_pos, k_pos = grid(5, 8, offset=3)
    assert torch.allclose(
        Sum(a, b).log_prior(q_pos, k_pos), a.log_prior(q_pos, k_pos) + b.log_prior(q_pos, k_pos)
    )
    with pytest.raises(ValueError, match="head counts"):
        Sum(ALiBi(2), ALiBi(3))
