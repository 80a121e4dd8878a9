"""Mask semantics checked without the library's mask code.

The reference and every route build visibility with the same ``Masking`` helper, so comparing
routes with the reference cannot catch a mistake in it. Here the visible keys come from plain
Python loops over the mask rules of docs/library.md and the output from a float64 softmax written below;
every route is compared with that, forward and backward (q, k, v, the prior's parameters and the
SSMax scales), at lengths where the routes split their work into many chunks.
"""

from __future__ import annotations

import math

import pytest
import torch
from factories import DEVICES, make_prior
from hypothesis import given, settings
from hypothesis import strategies as st

import priorattn
from priorattn.functional import masks, memeff, prior_inputs
from priorattn.functional.sdpa import planning
from priorattn.priors import ALiBi

#: Every route that has a backward; flex is compared forward only (FlexAttention has no CPU backward).
ROUTES = ("reference", "sdpa", "memeff")


def expected_visibility(q_pos, k_pos, causal, window, q_doc, k_doc, padding) -> torch.Tensor:
    """``(B, Lq, Lk)`` bool from docs/library.md's mask rules, one (query, key) pair at a time.

    Causal keeps ``k_pos <= q_pos``; ``window=w`` keeps ``0 <= q_pos - k_pos < w`` (``|q_pos - k_pos|
    < w`` when not causal); documents keep equal ids; padding keys are never seen.
    """
    B = max(t.shape[0] for t in (q_pos, k_pos, q_doc, padding) if t is not None)
    q_pos, k_pos = q_pos.expand(B, -1).tolist(), k_pos.expand(B, -1).tolist()
    q_doc = None if q_doc is None else q_doc.tolist()
    k_doc = None if k_doc is None else k_doc.tolist()
    padding = None if padding is None else padding.tolist()
    seen = []
    for b in range(B):
        rows = []
        for i, qi in enumerate(q_pos[b]):
            row = []
            for j, kj in enumerate(k_pos[b]):
                keep = True
                if causal and kj > qi:
                    keep = False
                if window is not None and causal and not 0 <= qi - kj < window:
                    keep = False
                if window is not None and not causal and not abs(qi - kj) < window:
                    keep = False
                if q_doc is not None and q_doc[b][i] != k_doc[b][j]:
                    keep = False
                if padding is not None and padding[b][j]:
                    keep = False
                row.append(keep)
            rows.append(row)
        seen.append(rows)
    return torch.tensor(seen, dtype=torch.bool).reshape(B, len(q_pos[0]), len(k_pos[0]))


def expected_causal_intervals(L: int, window: int, doc_ids: list[int], padding: list[bool]) -> torch.Tensor:
    """``(1, L, L)``: the same rules for one sequence at default positions, faster for long rows:
    query i sees the keys from ``max(i - window + 1, start of its document)`` to ``i``, less padding."""
    seen = torch.zeros(L, L, dtype=torch.bool)
    doc_start = 0
    for i in range(L):
        if i and doc_ids[i] != doc_ids[i - 1]:
            doc_start = i
        seen[i, max(i - window + 1, doc_start) : i + 1] = True
    return (seen & ~torch.tensor(padding))[None]


def dense_attention(q, k, v, log_prior, visible, scale, ssmax_s, scale_prior):
    """``sum_j softmax_j(l_ij) v_j`` over visible keys in float64; a row that sees nothing gives 0.

    ``l_ij = f_i (scale <q_i, k_j> + K_ij)`` with the SSMax factor ``f_i = s_h log n_i`` (``n_i`` the
    visible count, at least 1), or ``f_i (scale <q_i, k_j>) + K_ij`` when the prior is not scaled.
    """
    H, Hkv = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    content = scale * torch.einsum("bhid,bhjd->bhij", q, k)
    prior = torch.zeros_like(content) if log_prior is None else log_prior.expand_as(content)
    seen = visible[:, None].expand_as(content)  # (B, H, Lq, Lk)
    if ssmax_s is not None:
        n = visible.sum(-1).clamp(min=1).double()  # (B, Lq)
        factor = ssmax_s[None, :, None, None] * n.log()[:, None, :, None]
        logits = factor * (content + prior) if scale_prior else factor * content + prior
    else:
        logits = content + prior
    shift = logits.masked_fill(~seen, -math.inf).amax(-1, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, 0.0).detach()  # softmax is shift-invariant
    weights = (logits - shift).masked_fill(~seen, -math.inf).exp()
    total = weights.sum(-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, 1.0)
    return probs @ v


@st.composite
def problems(draw):
    """Random shapes, positions (default, shifted runs, decode-style, arbitrary), windows, documents,
    padding, priors and SSMax."""
    B = draw(st.integers(1, 2))
    Hkv = draw(st.integers(1, 2))
    Lk = draw(st.integers(1, 24))
    Lq = draw(st.integers(1, Lk + 3))
    return dict(
        B=B,
        Hkv=Hkv,
        H=Hkv * draw(st.sampled_from([1, 2])),
        Lq=Lq,
        Lk=Lk,
        positions=draw(st.sampled_from(["default", "shifted", "decode", "batched", "random"])),
        offset=draw(st.sampled_from([0, 3, 1000])),
        causal=draw(st.booleans()),
        window=draw(st.sampled_from([None, None, 1, 2, 7])),
        docs=draw(st.sampled_from([None, "sorted", "random", "pair"])),
        padding=draw(st.booleans()),
        prior=draw(st.sampled_from(["uniform", "alibi", "ggd_negative", "goat", "goat_noslope", "sum"])),
        ssmax=draw(st.sampled_from([None, True, False])),
        seed=draw(st.integers(0, 2**16)),
    )


def build(o, device="cpu"):
    """Inputs in float64 and the keyword arguments of ``priorattn.attention``.

    ``default`` passes no positions (queries are the newest keys, which Lq > Lk cannot be, so it
    shifts the keys instead); ``shifted`` is a run starting at ``offset``; ``decode`` puts the queries
    after all the keys; ``batched`` shifts each sequence's keys differently and puts the second
    sequence's queries 2 past its newest key; ``random`` draws unsorted
    positions with repeats (queries and keys independently).
    """
    gen = torch.Generator().manual_seed(o["seed"])
    B, H, Hkv, Lq, Lk, off = o["B"], o["H"], o["Hkv"], o["Lq"], o["Lk"], o["offset"]
    q = torch.randn(B, H, Lq, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(B, Hkv, Lk, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(B, Hkv, Lk, 3, generator=gen, dtype=torch.float64)
    kwargs = dict(causal=o["causal"], window=o["window"])
    kind = o["positions"] if o["positions"] != "default" or Lq <= Lk else "decode"
    k_pos = (0 if kind == "default" else off) + torch.arange(Lk)[None]
    if kind == "default":
        q_pos = k_pos[:, Lk - Lq :]
    elif kind == "shifted":
        q_pos = k_pos[:, max(Lk - Lq, 0) :] if Lq <= Lk else off + torch.arange(Lq)[None]
    elif kind == "decode":  # queries past every key: a decoding step after a gap
        q_pos = off + Lk + 2 + torch.arange(Lq)[None]
    elif kind == "batched":
        k_pos = k_pos + torch.tensor([[0], [5]])[:B]
        q_pos = k_pos[:, -1:] - Lq + 1 + torch.arange(Lq)[None] + torch.tensor([[0], [2]])[:B]
    else:
        k_pos = off + torch.randint(0, Lk + 4, (B, Lk), generator=gen)
        q_pos = off + torch.randint(0, Lk + 4, (B, Lq), generator=gen)
    if kind != "default":
        kwargs.update(q_pos=q_pos, k_pos=k_pos)
    q_doc = k_doc = None
    if o["docs"] == "sorted":
        k_doc = torch.randint(0, 3, (B, Lk), generator=gen).sort(-1).values
    elif o["docs"] in ("random", "pair"):
        k_doc = torch.randint(0, 3, (B, Lk), generator=gen)
    if o["docs"] == "pair" or (k_doc is not None and Lq > Lk):
        q_doc = torch.randint(0, 3, (B, Lq), generator=gen)
        kwargs["doc_ids"] = (q_doc, k_doc)
    elif k_doc is not None:
        q_doc = k_doc[:, Lk - Lq :]
        kwargs["doc_ids"] = k_doc
    padding = None
    if o["padding"]:
        padding = kwargs["key_padding_mask"] = torch.rand(B, Lk, generator=gen) < 0.3
    if o["prior"] == "alibi_steep":  # slope 0.5: float32 re-centres it every 512 queries
        prior = ALiBi(H, slopes=torch.full((H,), 0.5)).double()
    else:
        prior = make_prior(o["prior"], H, o["seed"])
    ssmax = None
    if o["ssmax"] is not None:
        ssmax = priorattn.SSMax(H, scale_prior=o["ssmax"]).double()
        with torch.no_grad():
            ssmax.s.copy_(torch.rand(H, generator=gen, dtype=torch.float64) + 0.5)
        ssmax = ssmax.to(device)
    if Lk > 200:  # the loops take seconds here; long rows are the plain causal case by intervals
        assert kind == "default" and o["causal"] and o["docs"] == "sorted" and B == 1
        visible = expected_causal_intervals(Lk, o["window"], k_doc[0].tolist(), padding[0].tolist())
    else:
        visible = expected_visibility(q_pos, k_pos, o["causal"], o["window"], q_doc, k_doc, padding)
    kwargs = {n: to_device(x, device) for n, x in kwargs.items()}
    return *(t.to(device) for t in (q, k, v)), prior.to(device), ssmax, kwargs, visible, q_pos, k_pos


def to_device(x, device):
    if isinstance(x, tuple):
        return tuple(t.to(device) for t in x)
    return x.to(device) if isinstance(x, torch.Tensor) else x


def leaves_of(prior, ssmax):
    params = [p for p in prior.parameters() if p.requires_grad]
    return params + ([] if ssmax is None else [ssmax.s])


def route_result(backend, q, k, v, prior, ssmax, kwargs, dtype, grad_out):
    """Output and gradients (q, k, v, prior parameters, SSMax scales) of one route."""
    qkv = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = priorattn.attention(*qkv, prior=prior, ssmax=ssmax, backend=backend, **kwargs)
    inputs = qkv + leaves_of(prior, ssmax)
    grads = torch.autograd.grad((out.double() * grad_out).sum(), inputs, allow_unused=True)
    return out, [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def expected_result(q, k, v, prior, ssmax, visible, q_pos, k_pos, grad_out):
    """The test's own output and gradients, in float64, through ``dense_attention``."""
    qkv = [t.detach().double().requires_grad_() for t in (q, k, v)]
    device = q.device
    log_prior = prior.log_prior(q_pos.to(device), k_pos.to(device))
    s = None if ssmax is None else ssmax.s
    scale_prior = ssmax is not None and ssmax.scale_prior
    out = dense_attention(*qkv, log_prior.double(), visible.to(device), 4**-0.5, s, scale_prior)
    inputs = qkv + leaves_of(prior, ssmax)
    grads = torch.autograd.grad((out * grad_out).sum(), inputs, allow_unused=True)
    return out, [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def assert_close(actual, expected, tol, what):
    scale = expected.abs().max().item() + 1.0
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} x {scale:.3g}"


def check(backend, o, dtype=torch.float64, tol=1e-9, device="cpu"):
    q, k, v, prior, ssmax, kwargs, visible, q_pos, k_pos = build(o, device)
    if backend == "sdpa" and not prior.can_fold(o["causal"]):
        return
    q, k, v = (t.to(dtype).double() for t in (q, k, v))  # the expected output from the same inputs
    B, H, Lq = q.shape[:3]
    grad_out = torch.linspace(-1, 1, B * H * Lq * 3, dtype=torch.float64, device=device)
    grad_out = grad_out.view(B, H, Lq, 3)
    out, grads = route_result(backend, q, k, v, prior, ssmax, kwargs, dtype, grad_out)
    ref, ref_grads = expected_result(q, k, v, prior, ssmax, visible, q_pos, k_pos, grad_out)
    nothing_seen = ~visible.any(-1).to(device)  # (B, Lq)
    assert not out.double().masked_select(nothing_seen[:, None, :, None]).any(), "unseen rows not 0"
    assert_close(out, ref, tol, f"{backend} output")
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        assert_close(g, r, 20 * tol, f"{backend} gradient {i}")


def test_visibility_loops_follow_the_readme():
    """The test's own rules on a hand-checked case: causal + window 2 + two documents + one pad."""
    pos = torch.arange(4)[None]
    docs = torch.tensor([[0, 0, 1, 1]])
    pad = torch.tensor([[False, True, False, False]])
    seen = expected_visibility(pos, pos, True, 2, docs, docs, pad)[0].int().tolist()
    assert seen == [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    both_ways = expected_visibility(pos, pos, False, 2, None, None, None)[0].int().tolist()
    assert both_ways == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ROUTES)
@settings(max_examples=60, deadline=None)
@given(o=problems())
def test_route_matches_independent_masks(backend, device, o):
    check(backend, o, device=device)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunk sizes small enough that short problems cross every threshold: several SDPA mask
    chunks (each with its own backward), several memeff blocks, several SSMax counting chunks, and
    slope runs of a few queries (each re-centred)."""
    monkeypatch.setattr(planning, "MASK_CHUNK_CELLS", 150)
    monkeypatch.setattr(memeff, "MIN_ROWS", 5)
    monkeypatch.setattr(memeff, "MAX_ROWS", 5)
    monkeypatch.setattr(masks, "COUNT_CHUNK_CELLS", 100)
    monkeypatch.setitem(prior_inputs.SLOPE_MAGNITUDE, torch.float64, 2.0)
    monkeypatch.setitem(prior_inputs.SLOPE_MAGNITUDE, torch.float32, 2.0)
    monkeypatch.setattr(prior_inputs, "MIN_FOLD_SPAN", 1)


CHUNKED = {
    "causal, default positions": dict(positions="default", docs=None, window=None, padding=False),
    "causal, shifted positions": dict(positions="shifted", docs=None, window=None, padding=False),
    "causal, decode after a gap": dict(positions="decode", docs=None, window=None, padding=False),
    "causal, batched positions": dict(positions="batched", docs=None, window=None, padding=False),
    "causal, documents, padding": dict(positions="default", docs="sorted", window=None, padding=True),
    "causal, window, decode": dict(positions="decode", docs=None, window=7, padding=False),
    "causal, random positions": dict(positions="random", docs="random", window=None, padding=True),
    "bidirectional, window, docs": dict(positions="shifted", docs="pair", window=7, padding=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("prior", ["alibi", "ggd_negative", "goat", "sum"])
@pytest.mark.parametrize("case", CHUNKED)
@pytest.mark.parametrize("backend", ROUTES)
def test_chunked_routes_match_independent_masks(backend, case, prior, device, small_chunks):
    o = dict(B=2, Hkv=1, H=2, Lq=37, Lk=45, offset=3, causal=True, ssmax=True, seed=1, prior=prior)
    o.update(CHUNKED[case])
    o["causal"] = not case.startswith("bidirectional")
    check(backend, o, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "backend, prior, dtype, tol, ssmax",
    [
        ("sdpa", "alibi_steep", torch.float32, 2e-5, True),
        ("memeff", "ggd_negative", torch.float64, 1e-9, None),
    ],
)
def test_long_rows_match_independent_masks(backend, prior, dtype, tol, ssmax, device):
    """L = 2100 with the routes' own chunk sizes: SDPA hands its mask over in two chunks, each
    re-centring ALiBi's slope 0.5 every 512 queries in float32, and SSMax counts visible keys in two
    chunks; memeff reads the GGD lag table in 9 blocks of 256 rows."""
    o = dict(B=1, Hkv=1, H=1, Lq=2100, Lk=2100, offset=0, causal=True, window=1500, ssmax=ssmax)
    o.update(positions="default", docs="sorted", padding=True, seed=2, prior=prior)
    check(backend, o, dtype, tol, device)


@pytest.mark.slow  # FlexAttention compiles for every mask: about 20 s per case on 2 CPU cores
@pytest.mark.parametrize("prior", ["sum", "ggd_negative"])
@pytest.mark.parametrize("case", CHUNKED)
def test_flex_forward_matches_independent_masks(case, prior):
    """FlexAttention builds its own block mask from the positions: forward only (no CPU backward)."""
    o = dict(B=2, Hkv=1, H=2, Lq=37, Lk=45, offset=3, ssmax=True, seed=1, prior=prior)
    o.update(CHUNKED[case])
    o["causal"] = not case.startswith("bidirectional")
    q, k, v, prior, ssmax, kwargs, visible, q_pos, k_pos = build(o)
    on_a_run = o["positions"] not in ("random", "batched")
    if not (prior.can_fold(o["causal"]) or prior.is_relative and on_a_run):
        return  # flex refuses a prior it would have to evaluate densely
    q, k, v = (t.float().double() for t in (q, k, v))
    with torch.no_grad():
        qkv = (t.float() for t in (q, k, v))
        out = priorattn.attention(*qkv, prior=prior.float(), ssmax=ssmax.float(), backend="flex", **kwargs)
        log_prior = prior.double().log_prior(q_pos, k_pos)
        ref = dense_attention(q, k, v, log_prior, visible, 4**-0.5, ssmax.s.double(), ssmax.scale_prior)
    assert_close(out, ref, 2e-5, "flex output")
