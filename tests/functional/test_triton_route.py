"""The fused Triton route against the float64 reference, forward and backward: on CUDA where there is
one, and on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, small shapes: it is slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import DEVICES, benchmark_script, make_prior
from test_flex import choice
from test_key_bias import drift

import priorattn
from priorattn.functional import api, triton_op, triton_route
from priorattn.priors import FIRE, GGD, ALiBi, Prior, build_prior, with_defaults

pytest.importorskip("triton")


#: The CPU runs in Triton's interpreter (tests/conftest.py), and only where no GPU is at hand: a
#: process defines its kernels either for the GPU or for the interpreter.
ROUTE_DEVICES = ["cuda"] if torch.cuda.is_available() else DEVICES[:1]


B, H, HKV, D = 2, 4, 2, 16

#: (prior name of factories.make_prior, attention keywords): every kind of term, mask and position.
CASES = {
    "nope": ("uniform", dict()),
    "alibi": ("alibi", dict()),
    "goat (lanes, sink, learned slope), documents": ("goat", dict(docs=True)),
    "goat with its query gate, ssmax": ("goat_gate", dict(ssmax=True)),
    "goat without slope, bidirectional, padding": ("goat_noslope", dict(causal=False, padding=True)),
    "ggd (lag table), window": ("ggd_negative", dict(window=9)),
    "ggd, bidirectional window, ssmax": ("ggd", dict(causal=False, window=7, ssmax=True)),
    # CUDA reads no positions back, so only the CPU knows these are runs (elsewhere flex takes them)
    "t5, decode offsets": ("t5", dict(q_pos=torch.arange(60, 80), k_pos=torch.arange(30, 80), cpu=True)),
    "kerple": ("kerple_log", dict()),
    "sandwich (folded)": ("sandwich", dict()),
    "alibi + ggd + goat": ("sum", dict(docs=True)),
    "a drifting key bias alone": ("uniform", dict(key_bias=True)),
    "ggd and a drifting key bias, documents": ("ggd_negative", dict(key_bias=True, docs=True)),
}


def inputs(kwargs: dict, dtype: torch.dtype, device: str, gen: torch.Generator):
    """q, k, v and the attention keywords of a case (documents, padding, key bias, SSMax drawn)."""
    Lq = kwargs["q_pos"].shape[0] if "q_pos" in kwargs else 37
    Lk = kwargs["k_pos"].shape[0] if "k_pos" in kwargs else 37
    q = torch.randn(B, H, Lq, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, HKV, Lk, D, generator=gen, dtype=torch.float64) for _ in range(2))
    kwargs = dict(kwargs)
    if kwargs.pop("docs", False):
        kwargs["doc_ids"] = torch.randint(0, 3, (B, Lk), generator=gen).sort(-1).values
    if kwargs.pop("padding", False):
        kwargs["key_padding_mask"] = torch.rand(B, Lk, generator=gen) < 0.2
    if kwargs.pop("key_bias", False):  # FoX's -F_j, drifted to hundreds of nats
        kwargs["key_bias"] = drift(B, H, Lk, 3.0, gen).requires_grad_()
    if kwargs.pop("ssmax", False):
        kwargs["ssmax"] = (torch.rand(H, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    moved = {
        key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in kwargs.items()
    }
    return [t.to(device, dtype).requires_grad_() for t in (q, k, v)], moved


def gradients(out, wrt, gen):
    """``d <out, g> / d wrt`` for a fixed random ``g``: one backward through every input."""
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
    return torch.autograd.grad(out, wrt, g, allow_unused=True)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("device", ROUTE_DEVICES)
def test_triton_route_matches_reference_forward_and_backward(case, device):
    name, kwargs = CASES[case]
    if kwargs.get("cpu") and device != "cpu":
        pytest.skip("explicit positions are runs only where reading them is free (the CPU)")
    kwargs = {key: value for key, value in kwargs.items() if key != "cpu"}
    dtype = torch.float64 if device == "cpu" else torch.float32
    (q, k, v), kwargs = inputs(kwargs, dtype, device, torch.Generator().manual_seed(0))
    prior = make_prior(name, H).to(device)
    learned = [p for p in prior.parameters() if p.requires_grad]
    extra = [t for t in kwargs.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    results = {}
    for backend in ("reference", "triton"):
        kw = dict(kwargs)
        if backend == "triton" and dtype != torch.float64:
            kw = {
                key: t.to(dtype)
                if isinstance(t, torch.Tensor) and t.is_floating_point() and key != "key_bias"
                else t
                for key, t in kw.items()
            }
        p = prior if backend == "triton" else prior.double()
        out = priorattn.attention(
            *(t if backend == "triton" else t.double() for t in (q, k, v)), prior=p, backend=backend, **kw
        )
        results[backend] = (
            out,
            gradients(out, [q, k, v, *learned, *extra], torch.Generator().manual_seed(1)),
        )
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    (ref, ref_grads), (out, grads) = results["reference"], results["triton"]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=tol)
    for got, want in zip(grads, ref_grads):
        assert (got is None) == (want is None)
        if want is not None:
            scale = max(1.0, float(want.abs().max()))
            torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=tol * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["sum", "ggd"], ids=["lanes, sink, slopes, key bias", "a lag table"])
@pytest.mark.parametrize("device", ROUTE_DEVICES)
def test_triton_route_scales_scores_in_its_kernels_in_single_and_half_precision(name, dtype, device):
    """Below float64 the kernels multiply the content scores by the scale (here 1 / sqrt(24), no
    power of two) and read the prior's float64 slopes and table in their own float32: forward and
    every gradient match the float64 reference on the same rounded inputs, within the dtype's
    rounding (the weights and dS enter the kernels' products in it)."""
    if dtype == torch.bfloat16 and device == "cpu":
        pytest.skip("Triton's interpreter computes bfloat16 tiles wrongly (numpy has no bfloat16)")
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(B, H, 37, 24, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, HKV, 37, 24, generator=gen, dtype=torch.float64) for _ in range(2))
    q, k, v = (t.to(dtype).to(device).requires_grad_() for t in (q, k, v))
    key_bias = drift(B, H, 37, 1.0, gen).to(device).requires_grad_()
    prior = make_prior(name, H).to(device)  # float64 parameters
    wrt = [q, k, v, key_bias, *(p for p in prior.parameters() if p.requires_grad)]
    results = {}
    for backend in ("reference", "triton"):
        args = [t if backend == "triton" else t.double() for t in (q, k, v)]
        out = priorattn.attention(*args, prior=prior, key_bias=key_bias, backend=backend)
        results[backend] = out, gradients(out, wrt, torch.Generator().manual_seed(8))
    tol = 2e-4 if dtype == torch.float32 else 3e-2
    (ref, ref_grads), (out, grads) = results["reference"], results["triton"]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=tol)
    for got, want in zip(grads, ref_grads):
        scale = max(1.0, float(want.abs().max()))
        torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=tol * scale)


def test_auto_takes_triton_where_it_would_take_flex_from_its_length_on(monkeypatch):
    """On CUDA (faked) with Triton, the fused kernels replace FlexAttention from TRITON_MIN_KEYS
    keys on, for priors they compute; a fold that SDPA runs in one call keeps SDPA, and positions
    that are no run keep their route."""
    monkeypatch.setattr(api, "flex_trains_on", lambda device: True)
    monkeypatch.setattr(api, "largest_slope", lambda slope, bound: bound)  # a GPU reads no slope
    monkeypatch.setattr(api, "triton_preferred", lambda device: True)
    monkeypatch.setattr(api, "TRITON_MIN_KEYS", 512)
    short, long = torch.randn(1, 2, 300, 8), torch.randn(1, 2, 600, 8)
    assert choice(short, GGD(2)) == "flex"
    assert choice(long, GGD(2)) == "triton"
    assert choice(torch.randn(1, 8, 1024, 8), ALiBi(8)) == "triton"  # slopes to 1/2: runs of 512
    assert choice(long, None, key_bias=torch.randn(1, 2, 600)) == "triton"
    assert choice(long, None) == "sdpa"
    assert choice(long, make_prior("goat_noslope", 2)) == "sdpa"  # one flash call
    gaps = torch.arange(0, 1200, 2)
    assert choice(long, GGD(2), q_pos=gaps, k_pos=gaps) == "memeff"
    assert choice(short, make_prior("fire", 2)) == "triton"  # at every length: no flex for FIRE
    assert choice(short, make_prior("fire", 2), causal=False) == "memeff"


class InterpolatedFIRE(Prior):
    """FIRE as the ``triton`` route computes it, densely: its MLP linear between the points of a
    grid of ``cells`` cells of ``[0, 1]`` (the function the route's gradients are exact for)."""

    def __init__(self, fire: FIRE, cells: int):
        super().__init__()
        self.fire, self.cells, self.num_heads = fire, cells, fire.num_heads

    def log_prior(self, q_pos, k_pos):
        q_pos, k_pos = q_pos.reshape(-1), k_pos.reshape(-1)
        lags = (q_pos[:, None] - k_pos[None, :]).reshape(-1)
        lag_scale, row_scale, grid = self.fire.scaled_lag(lags, q_pos, self.cells)
        x = (lag_scale.view(len(q_pos), len(k_pos)) * row_scale[:, None]).clamp(0, 1)
        u = x * self.cells
        cell = u.detach().floor().long().clamp(max=self.cells - 1)
        t = u - cell
        return grid[:, cell] + t * (grid[:, cell + 1] - grid[:, cell])  # (H, Lq, Lk)


def fire_with_kinks_inside(heads: int) -> FIRE:
    """A FIRE whose hidden units all bend inside ``[0, 1]``, where the grid interpolates."""
    prior = make_prior("fire", heads).double()
    with torch.no_grad():
        w1 = prior.mlp[0].weight[:, 0]
        prior.mlp[0].bias.copy_(-w1 * torch.linspace(0.13, 0.91, len(w1), dtype=torch.float64))
    return prior


@pytest.mark.parametrize("cells", [8, 1024], ids=["cells wider than tiles", "cells finer than lags"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(docs=True, ssmax=True),
        dict(q_pos=torch.arange(60, 80), k_pos=torch.arange(30, 80), cpu=True),
    ],
    ids=["causal", "documents, ssmax", "decode offsets"],
)
@pytest.mark.parametrize("device", ROUTE_DEVICES)
def test_fire_on_the_triton_route_is_its_grid_interpolant_exactly(cells, kwargs, device, monkeypatch):
    """The kernels interpolate FIRE's MLP on a grid of its normalised lag: forward and every gradient
    (q, k, v, the MLP through the grid, c and L through the lag and row scales, SSMax) equal the
    float64 reference of that interpolant. Wide cells take the grid gradient as one sum per grid
    point of a tile, fine cells as adds per cell."""
    if kwargs.get("cpu") and device != "cpu":
        pytest.skip("explicit positions are runs only where reading them is free (the CPU)")
    monkeypatch.setattr(triton_route, "GRID_CELLS", cells)
    kwargs = {key: value for key, value in kwargs.items() if key != "cpu"}
    dtype = torch.float64 if device == "cpu" else torch.float32
    (q, k, v), kwargs = inputs(kwargs, dtype, device, torch.Generator().manual_seed(5))
    prior = fire_with_kinks_inside(H).to(device)
    learned = list(prior.parameters())
    extra = [t for t in kwargs.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    results = {}
    for backend, p in (("reference", InterpolatedFIRE(prior, cells)), ("triton", prior)):
        args = [t if backend == "triton" else t.double() for t in (q, k, v)]
        out = priorattn.attention(*args, prior=p, backend=backend, **kwargs)
        results[backend] = out, gradients(out, [q, k, v, *learned, *extra], torch.Generator().manual_seed(6))
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    (ref, ref_grads), (out, grads) = results["reference"], results["triton"]
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=tol)
    for got, want in zip(grads, ref_grads):
        scale = max(1.0, float(want.abs().max()))
        torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=tol * scale)


@pytest.mark.parametrize("cells", [1, 8, 1024])
def test_fires_grid_interpolant_stays_within_its_error_bound(cells):
    """Linear interpolation of FIRE's MLP is off by at most ``grid_error_bound`` (each kink inside
    ``[0, 1]``: its bend over 4 cells), on queries both sides of the threshold; exact where no unit
    bends inside ``[0, 1]``."""
    fire = fire_with_kinks_inside(3)
    pos = torch.arange(300)
    error = (InterpolatedFIRE(fire, cells).log_prior(pos, pos) - fire.log_prior(pos, pos)).abs()
    error = error.masked_fill(pos[None, :] > pos[:, None], 0)  # causal pairs, where x is in [0, 1]
    bound = fire.grid_error_bound(cells)
    assert (error.amax((1, 2)) <= bound + 1e-12).all()
    assert error.max() > 0.01 * bound.max()  # the bound is not vacuous
    with torch.no_grad():  # every kink below 0
        fire.mlp[0].bias.copy_(fire.mlp[0].weight[:, 0].abs() + 0.1)
        fire.mlp[0].weight.abs_()
    error = (InterpolatedFIRE(fire, cells).log_prior(pos, pos) - fire.log_prior(pos, pos)).abs()
    assert float(fire.grid_error_bound(cells).max()) == 0.0
    assert error.masked_fill(pos[None, :] > pos[:, None], 0).max() < 1e-12


def test_triton_route_refuses_what_it_cannot_compute():
    x = torch.randn(1, 2, 8, 16, dtype=torch.float64)
    gaps = torch.arange(0, 16, 2)
    with pytest.raises(ValueError, match="positions that are runs"):
        priorattn.attention(x, x, x, prior=GGD(2), q_pos=gaps, k_pos=gaps, backend="triton")
    with pytest.raises(ValueError, match="FIRE here is none of these: use backend='memeff'"):
        priorattn.attention(x, x, x, prior=make_prior("fire", 2), causal=False, backend="triton")
    with pytest.raises(ValueError, match="FIRE here is none of these"):  # keys before position 0
        priorattn.attention(x, x, x, prior=make_prior("fire", 2), k_pos=torch.arange(-8, 0), backend="triton")


def test_triton_route_says_what_it_needs_without_a_gpu(monkeypatch):
    monkeypatch.setattr(triton_route, "triton_available", lambda device: False)
    x = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError, match="backend='triton' needs the triton package and a CUDA device"):
        priorattn.attention(x, x, x, prior=GGD(2), backend="triton")


@pytest.mark.parametrize("Lq, Lk, causal", [(1, 1, True), (16, 16, True), (5, 40, True), (33, 20, False)])
@pytest.mark.parametrize("device", ROUTE_DEVICES)
def test_triton_route_matches_reference_at_tile_edges(Lq, Lk, causal, device):
    """One query or key, exact multiples of the tiles, a decode chunk (Lq < Lk) and more queries
    than keys: tiles the diagonal cuts, tiles past the last key, and whole tiles between them."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, H, Lq, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, HKV, Lk, D, generator=gen, dtype=torch.float64) for _ in range(2))
    key_bias = drift(1, H, Lk, 1.0, gen)
    prior = make_prior("sum" if causal else "ggd_negative", H).to(device)  # ALiBi folds only causal
    q_pos = torch.arange(Lk - Lq, Lk) if Lq <= Lk else torch.arange(Lq)
    q, k, v, q_pos = (t.to(device) for t in (q, k, v, q_pos))
    key_bias = key_bias.to(device).requires_grad_()  # more queries than keys: rows share their own key
    k_pos = torch.arange(Lk, device=device)
    out = {}
    for backend in ("reference", "triton"):
        inputs = [t.to(dtype if backend == "triton" else torch.float64).requires_grad_() for t in (q, k, v)]
        result = priorattn.attention(
            *inputs, prior=prior, causal=causal, q_pos=q_pos, k_pos=k_pos, key_bias=key_bias, backend=backend
        )
        out[backend] = (result, gradients(result, [*inputs, key_bias], torch.Generator().manual_seed(3)))
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(out["triton"][0].double(), out["reference"][0], rtol=0, atol=tol)
    for got, want in zip(out["triton"][1], out["reference"][1]):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=tol * max(1.0, float(want.abs().max())))


@pytest.mark.parametrize("device", ROUTE_DEVICES)
def test_the_fused_operator_passes_torchs_operator_checks(device):
    """Schema, fake (meta) shapes, autograd registration and AOT dispatch of the operator that wraps
    the kernels, with every optional input present (lanes, key bias and its rounding, slope, table,
    row factor, a scaled lag's scales and grid, documents, padding), with a table shared by the
    heads, and with none."""
    gen = torch.Generator().manual_seed(4)
    B_, H_, Hkv, L, P = 1, 2, 1, 20, 3

    def randn(*shape, grad=True):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device).requires_grad_(grad)

    q, k, v = randn(B_, H_, L, D), randn(B_, Hkv, L, D), randn(B_, Hkv, L, D)
    blocks = list(triton_route.BLOCKS["cuda" if device == "cuda" else "cpu"])
    full = (
        randn(B_, H_, L, P),  # q lanes
        randn(B_, Hkv, L, P),  # k lanes
        randn(B_, H_, L),  # key bias
        randn(H_) * 0.1,  # slope
        randn(H_, 2 * L - 1),  # lag table
        randn(B_, H_, L).abs() + 0.5,  # row factor
        torch.rand(2 * L - 1, generator=gen, dtype=torch.float64).to(device).requires_grad_(),  # lag scale
        torch.rand(L, generator=gen, dtype=torch.float64).to(device).requires_grad_(),  # row scale
        randn(H_, 9),  # grid
        randn(B_, H_, L, grad=False) * 1e-17,  # the key bias's rounding
        torch.zeros(B_, L, dtype=torch.int32, device=device),
        torch.zeros(B_, L, dtype=torch.int32, device=device),
        torch.zeros(B_, L, dtype=torch.int8, device=device),
    )
    shared_table = (*full[:4], randn(1, 2 * L - 1), *full[5:])  # one row for every head
    for optional in (full, shared_table, (None,) * len(full)):
        args = (q, k, v, *optional, True, 0, None, 0.5, blocks)
        torch.library.opcheck(triton_op.fused_attention, args)


@pytest.mark.parametrize("device", ROUTE_DEVICES)
@pytest.mark.parametrize(
    "prior, kwargs", [("goat", {}), ("ggd", dict(ssmax=True)), ("uniform", dict(fox=True))]
)
def test_a_layer_on_the_triton_route_compiles_as_one_graph(prior, kwargs, device):
    """``torch.compile(fullgraph=True)`` keeps the kernels' operator whole, forward and backward; the
    compiled layer and its gradients match eager (GOAT's lanes and slope, a lag table with SSMax, a
    forget gate's key bias)."""
    torch.manual_seed(0)
    prior = build_prior(with_defaults(prior, goat=dict(num_freqs=2)), 4)
    if kwargs.pop("fox", False):
        kwargs["forget_gate"] = True
    layer = priorattn.PriorMultiheadAttention(64, 4, num_kv_heads=2, prior=prior, backend="triton", **kwargs)
    layer = layer.to(device)
    x = torch.randn(2, 20, 64, device=device)
    expected = layer(x)[0]
    expected.square().sum().backward()
    eager = {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}
    layer.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    out = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)[0]
    out.square().sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    compiled = {name: p.grad for name, p in layer.named_parameters() if p.grad is not None}
    assert compiled.keys() == eager.keys()
    for name, grad in eager.items():
        torch.testing.assert_close(
            compiled[name], grad, rtol=1e-5, atol=1e-6 * max(1.0, float(grad.abs().max()))
        )


def test_the_kernels_compile_for_a_hopper_gpu_without_one():
    """Triton's interpreter runs code the GPU compiler refuses (a global that is no constexpr, say):
    the kernels are compiled for sm_90 in a process of their own, outside the interpreter."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(priorattn.__file__).parents[1]), env.get("PYTHONPATH", "")])
    script = Path(__file__).with_name("hopper_compile.py")
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("compiles for sm_90") == 10


def test_plain_attention_and_a_key_bias_launch_little_beside_the_kernels():
    """Counted as ``benchmarks/launches.py`` counts them, as on CUDA: forward + backward of plain
    attention and of FoX's key bias launch the route's four kernels (forward, the rows' delta, key
    blocks, query blocks) and one other operation, the default positions' run: the kernels scale
    the scores, and the backward makes no zeros for the log-sum-exp's gradient and scatters no key
    bias centre's."""
    benchmark_script("device_check")  # launches.py imports it from its own directory
    launches = benchmark_script("launches")
    for name in ("NoPE", launches.FOX):
        prior, ssmax = launches.priors(H)[name]
        args = launches.inputs(prior, name, 20, D, H, torch.Generator().manual_seed(0))
        count = launches.counted(prior, ssmax, "triton", args, backward=True)
        assert count.counts["kernels"] == 4 and count.counts["prep"] == 1, (name, count.ops)


def test_a_forget_gates_gradient_keeps_float32_precision_far_along_the_keys():
    """FoX's gate sums its key bias's gradient over every later key, where leftovers of rows of dS
    that do not sum to exactly 0 would pile up; the route differentiates the row-centred bias it
    computes, which cancels them (gate logits -4: 1.2e-6, and 1.0e-5 without, the float32 reference
    route 1.1e-4, at 300 keys)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    logits = torch.randn(1, 2, 300, generator=gen, dtype=torch.float64) * 0.5 - 4.0
    g = torch.randn(1, 2, 300, 16, generator=gen, dtype=torch.float64)
    grads = {}
    for dtype, backend in ((torch.float64, "reference"), (torch.float32, "triton")):
        x = logits.clone().requires_grad_()
        key_bias = -torch.nn.functional.logsigmoid(x).cumsum(-1)  # FoX's -F_j, to 1200 nats
        out = priorattn.attention(*(t.to(dtype) for t in (q, k, v)), key_bias=key_bias, backend=backend)
        (out.double() * g).sum().backward()
        grads[backend] = x.grad
    assert (grads["triton"] - grads["reference"]).abs().max() < 5e-6
