"""Shared test helpers: priors with random (non-trivial) parameters, and the CLI's exit code."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from priorattn import cli
from priorattn.functional.sdpa import decode
from priorattn.priors import FIRE, GGD, GOAT, KERPLE, ALiBi, Prior, Sandwich, Sum, T5Bias, Uniform

#: GOAT's variants among the priors, by name: the options of each.
GOATS = {
    "goat": dict(),  # the shared sink and a learned slope
    "goat_noslope": dict(slope="none", sink="per_head"),
    "goat_fixed": dict(slope="fixed", sink="none"),
    "goat_gate": dict(gate=True),
}
PRIOR_NAMES = (
    "uniform",
    "alibi",
    "ggd",
    "ggd_negative",
    *GOATS,
    "sum",
    "t5",
    "t5_bidirectional",
    "kerple_log",
    "kerple_power",
    "sandwich",
    "sandwich_table",
    "fire",
)
#: Priors whose log-prior depends on the query (GOAT's query-norm gate, issue 28): the seeds'
#: identities for a prior of positions alone (seed 000 Prop. 3.1, Thm 5.1, 5.4) do not apply to them.
GATED = ("goat_gate",)
#: Devices the route comparisons run on: the CPU, and CUDA where there is one.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
    ),
]


def make_prior(name: str, heads: int, seed: int = 0, dtype=torch.float64) -> Prior:
    """A prior whose parameters are random, so every term of its formula matters."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale

    if name == "uniform":
        prior = Uniform()
    elif name == "alibi":
        prior = ALiBi(heads)
    elif name in ("ggd", "ggd_negative"):
        prior = GGD(heads, init="alibi", trainable=("alpha", "beta", "mu"))
        with torch.no_grad():
            prior.theta_alpha.copy_(rand(heads) - 1.0)
            beta = rand(heads, scale=0.5) + (-0.6 if name == "ggd_negative" else 1.0)
            prior.theta_beta.copy_(beta)
            prior.theta_mu.copy_(rand(heads, scale=0.5))
    elif name in GOATS:
        prior = GOAT(heads, 3, **GOATS[name], train_len=64, sink_freqs=2, sink_hidden=4)
        with torch.no_grad():
            for p in prior.parameters():
                p.copy_(rand(*p.shape, scale=0.5))
    elif name in ("t5", "t5_bidirectional"):
        # few, narrow buckets, so that lags of a short test reach the log-spaced and the last ones
        prior = T5Bias(heads, num_buckets=8, max_distance=12, bidirectional=name == "t5_bidirectional")
        with torch.no_grad():
            prior.bias.copy_(rand(*prior.bias.shape))
    elif name in ("kerple_log", "kerple_power"):
        prior = KERPLE(heads, variant=name.removeprefix("kerple_"))
        with torch.no_grad():
            for p in prior.parameters():
                p.copy_(rand(*p.shape))
    elif name == "sandwich":  # folded: 4 lanes
        prior = Sandwich(heads, dim=4, fold=True)
    elif name == "sandwich_table":
        prior = Sandwich(heads, dim=16)
    elif name == "fire":
        prior = FIRE(heads, hidden=4, threshold=6.0)
        with torch.no_grad():
            for p in prior.parameters():
                p.copy_(rand(p.numel()).view_as(p))  # c and L are scalars
            prior.theta_L.fill_(6.0)  # L = 6: queries on both sides of the threshold
    elif name == "sum":
        return Sum(make_prior("alibi", heads, seed, dtype), make_prior("goat", heads, seed + 1, dtype))
    else:
        raise ValueError(name)
    return prior.to(dtype)


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
