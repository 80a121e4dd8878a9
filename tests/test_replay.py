"""The suite itself: a run can be replayed (see ``conftest.py``)."""

import torch
from hypothesis import given
from hypothesis import strategies as st


def draws_of_one_run() -> list[int]:
    drawn = []

    @given(st.integers(0, 2**32))
    def record(x):
        drawn.append(x)

    record()
    return drawn


def test_property_tests_draw_the_same_examples_on_every_run(pytestconfig):
    if pytestconfig.getoption("--hypothesis-profile") not in (None, "ci", "ci-seeded"):
        return  # this run asked for a profile of its own
    assert draws_of_one_run() == draws_of_one_run()


def test_each_test_starts_from_the_runs_torch_seed(pytestconfig):
    seed = int(pytestconfig.getoption("--hypothesis-seed") or 0)
    expected = torch.rand(4, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(torch.rand(4), expected)
