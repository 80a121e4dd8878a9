"""Shared test helpers: the priors every shared test runs on (each from its own test module), with
random (non-trivial) parameters and their formulas by hand; the CLI's exit code; corpora."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

import priorattn.priors
from priorattn import cli
from priorattn.functional.sdpa import decode
from priorattn.priors import Prior, Sum

#: Devices the route comparisons run on: the CPU, and CUDA where there is one.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
    ),
]

# The priors the shared tests run on are found, not listed. Each prior file of the library,
# ``src/priorattn/priors/NAME.py`` (``priorattn.priors.PRIOR_MODULES``), has its test module
# ``tests/priors/test_NAME.py``, which gives the shared tests
#
# - ``RANDOM_PRIORS``: ``{case: make}``, each ``make(heads, rand)`` a prior of ``heads`` heads whose
#   parameters come from ``rand`` (:class:`RandomDraws`), so that every term of its formula matters;
#   one case per variant worth running every route on (``"goat_noslope"``, ``"t5_bidirectional"``);
# - ``log_prior_by_hand(prior, h, i, j)``: ``K_h(i, j)`` of such a prior at positions ``i`` and ``j``
#   from its paper's formula, written out independently of the library.
#
# A prior file without them fails every shared test at collection (:func:`prior_test_module`).
# ``PRIOR_NAMES`` (every case, and ``"sum"``) and ``GATED`` are computed when first read: a prior's
# test module may import shared test modules (``functional/test_routes.py``), which therefore read
# them inside functions, not at import.


class RandomDraws:
    """Uniform draws in ``[-scale, scale]``, float64, from a generator seeded with ``seed``: what a
    prior's test module fills its random instance with."""

    def __init__(self, seed: int):
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.rand(*shape, generator=self.generator, dtype=torch.float64) * 2 - 1) * scale

    def fill(self, prior: Prior, scale: float = 1.0) -> Prior:
        """``prior`` with every parameter drawn, in the order of ``prior.parameters()``."""
        with torch.no_grad():
            for p in prior.parameters():
                p.copy_(self(*p.shape, scale=scale))
        return prior


def prior_test_module(name: str) -> ModuleType:
    """``tests/priors/test_NAME.py``, the test module of the prior file ``priors/NAME.py``, checked to
    give ``RANDOM_PRIORS`` and ``log_prior_by_hand``; a LookupError naming what is missing else."""
    where = f"tests/priors/test_{name}.py"
    try:
        module = importlib.import_module(f"test_{name}")
    except ModuleNotFoundError as error:
        if error.name != f"test_{name}":
            raise
        module = None
    missing = [hook for hook in ("RANDOM_PRIORS", "log_prior_by_hand") if not hasattr(module, hook)]
    if module is not None and missing and getattr(module.__spec__, "_initializing", False):
        raise LookupError(
            f"{where} is still being imported while the shared tests read its priors: a shared test "
            "module it imports reads PRIOR_NAMES or GATED at import (read them inside a function)"
        )
    if missing:
        has = "does not exist" if module is None else f"has no {' and no '.join(missing)}"
        raise LookupError(
            f"the prior file src/priorattn/priors/{name}.py is untested: {where} {has}. Give it "
            "RANDOM_PRIORS = {case: make(heads, rand)} and log_prior_by_hand(prior, h, i, j) "
            "(tests/factories.py says what they are), and every shared test runs it"
        )
    return module


@functools.cache
def prior_cases() -> dict[str, Callable[[int, RandomDraws], Prior]]:
    """Every case of every prior's ``RANDOM_PRIORS``, and ``"sum"`` (ALiBi + GOAT: a sum of priors
    folds, builds and runs as one)."""
    cases = {}
    for name in priorattn.priors.PRIOR_MODULES:
        for case, make in prior_test_module(name).RANDOM_PRIORS.items():
            if case in cases or case == "sum":
                raise LookupError(f"tests/priors/test_{name}.py names case {case!r}, which is taken")
            cases[case] = make
    cases["sum"] = lambda heads, rand: Sum(
        make_prior("alibi", heads, rand.seed), make_prior("goat", heads, rand.seed + 1)
    )
    return cases


def make_prior(name: str, heads: int, seed: int = 0, dtype=torch.float64) -> Prior:
    """The prior of case ``name`` (:data:`PRIOR_NAMES`) with ``heads`` heads, its parameters drawn
    from ``seed``, in ``dtype``."""
    cases = prior_cases()
    if name not in cases:
        raise ValueError(f"no prior case {name!r}: the cases are {', '.join(cases)}")
    return cases[name](heads, RandomDraws(seed)).to(dtype)


def log_prior_by_hand(prior: Prior, h: int, i: int, j: int) -> float:
    """``K_h(i, j)`` of any prior of the cases, by its test module's formula (a sum's: its parts')."""
    if isinstance(prior, Sum):
        return sum(log_prior_by_hand(part, h, i, j) for part in prior.parts)
    file = type(prior).__module__.removeprefix("priorattn.priors.")
    return prior_test_module(file).log_prior_by_hand(prior, h, i, j)


def __getattr__(name: str):
    """``PRIOR_NAMES``: every case's name. ``GATED``: the cases whose log-prior depends on the query
    (GOAT's query-norm gate), to which the seeds' identities for a prior of positions alone (seed 000
    Prop. 3.1, Thm 5.1, 5.4) do not apply. Both computed when first read."""
    if name == "PRIOR_NAMES":
        return tuple(prior_cases())
    if name == "GATED":
        return tuple(case for case in prior_cases() if make_prior(case, 1).gated)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def exit_code(argv: list[str]) -> int:
    """The status ``python -m priorattn *argv`` exits with (argparse errors exit with 2)."""
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    return stop.value.code


def word_salad(root: Path, words: str, docs: int = 6, length: int = 600) -> Path:
    """``docs`` text files of ``length`` words drawn from ``words`` (seeded): a corpus of a few kB."""
    rng = random.Random(0)
    vocabulary = words.split()
    for i in range(docs):
        (root / f"doc{i}.txt").write_text(" ".join(rng.choice(vocabulary) for _ in range(length)))
    return root


def flushes() -> bool:
    """Whether the current thread flushes float32 subnormals to zero."""
    return bool(torch.tensor(2.0**-149) * 2 == 0)


def recording_flash_takes(monkeypatch) -> list[bool]:
    """Patch ``sdpa.decode.flash_takes`` (whether a decode step runs the CPU flash kernel) to record each
    answer it gives."""
    took_flash = []
    takes = decode.flash_takes
    monkeypatch.setattr(decode, "flash_takes", lambda *a: took_flash.append(takes(*a)) or took_flash[-1])
    return took_flash


#: Fixed problems (the options of ``functional/test_routes.check_route``) on which each prior of
#: ``tests/priors`` is run on every route that takes it, beside the random ones of the route tests:
#: documents and grouped heads far from position 0, a bidirectional window with padding and per-row
#: positions, and a prefill with SSMax.
ROUTE_CASES = {
    "docs-gqa-far": dict(B=2, H=4, Hkv=2, Lq=37, Lk=37, causal=True, offset=1000, docs=True),
    "bidirectional-window-padding": dict(
        B=2, H=2, Hkv=2, Lq=30, Lk=30, causal=False, window=5, padding=True, batched_pos=True
    ),
    "prefill-ssmax": dict(B=1, H=2, Hkv=1, Lq=20, Lk=33, causal=True, offset=3, ssmax=True),
    "decode-docs": dict(B=2, H=4, Hkv=1, Lq=3, Lk=40, causal=True, offset=500, docs=True),
}


def route_case(name: str, prior: str, seed: int = 0) -> dict:
    """The options of ``ROUTE_CASES[name]`` for ``prior``, the rest at their plain values."""
    o = dict(Dk=8, Dv=8, offset=0, seed=seed, window=None, docs=False, padding=False, ssmax=False)
    return {**o, "batched_pos": False, **ROUTE_CASES[name], "prior": prior}


def figure_title(path: Path) -> str:
    """The title a study's figure carries in its PNG file (``priorattn.figures.save``), on one line;
    "" for a figure without one."""
    from PIL import Image

    with Image.open(path) as image:
        return " ".join(image.text.get("Title", "").split())


def benchmark_script(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` loaded as module ``NAME`` (registered in ``sys.modules``: its
    dataclasses look their module up there)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def grid(Lq: int, Lk: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Query positions ``offset .. offset + Lq - 1`` and key positions ``0 .. Lk - 1``."""
    return torch.arange(offset, offset + Lq), torch.arange(Lk)
