"""Every prior's and SSMax's constructor refuses bad arguments with one line naming the argument,
and ``fold_width`` can be asked of any prior without raising."""

from __future__ import annotations

import pytest

from priorattn import SSMax
from priorattn.priors import GGD, GOAT, ALiBi, Sum, Uniform


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: GGD(-1), "num_heads"),
        (lambda: GGD(0), "num_heads"),
        (lambda: GGD(2.5), "num_heads"),
        (lambda: GGD(2, eps=-1e-5), "eps"),
        (lambda: GGD(2, eps=float("nan")), "eps"),
        (lambda: GGD(2, init="flat"), "init"),
        (lambda: GGD(2, trainable=("gamma",)), "trainable"),
        (lambda: ALiBi(-1), "num_heads"),
        (lambda: ALiBi(True), "num_heads"),
        (lambda: GOAT(0), "num_heads"),
        (lambda: GOAT(2, -1), "num_freqs"),
        (lambda: GOAT(2, train_len=0), "train_len"),
        (lambda: GOAT(2, sink_freqs=-1), "sink_freqs"),
        (lambda: GOAT(2, sink_hidden=0), "sink_hidden"),
        (lambda: GOAT(2, sink="yes"), "sink"),
        (lambda: GOAT(2, slope=1), "slope"),
        (lambda: GOAT(2, freq_base=1.0), "freq_base"),
        (lambda: GOAT(2, max_slope=0.0), "max_slope"),
        (lambda: SSMax(-1), "num_heads"),
        (lambda: SSMax(2, init=float("inf")), "init"),
    ],
)
def test_bad_constructor_arguments_are_one_line_errors_naming_the_argument(make, name):
    with pytest.raises(ValueError, match=name) as error:
        make()
    assert "\n" not in str(error.value)


def test_fold_width_never_raises_and_is_none_for_a_prior_that_never_folds():
    assert GGD(4).fold_width is None
    assert Sum(ALiBi(4), GGD(4)).fold_width is None
    assert Uniform().fold_width == 0
    assert ALiBi(4).fold_width == 1
    assert GOAT(4, 3).fold_width == 8 and GOAT(4, 3, slope=False).fold_width == 7
    assert Sum(ALiBi(4), GOAT(4, 3, slope=False)).fold_width == 8
