"""PriorMultiheadAttention: shapes, head widths, definition by hand, KV-cache parity, bad input."""

from __future__ import annotations

import math
import warnings
from functools import partial

import pytest
import torch
from factories import PRIOR_NAMES, make_prior, recording_flash_takes

from priorattn import KVCache, PriorMultiheadAttention, SSMax
from priorattn.encodings import RoPE, Sinusoidal, YaRNRoPE
from priorattn.functional import api
from priorattn.functional.sdpa import flash
from priorattn.priors import GGD, GOAT, ALiBi, Uniform

# Narrow heads keep these tests small, so folded priors often take most lanes: that warning is
# tested once, on its own (test_goat_taking_more_than_half_the_head_warns).
pytestmark = pytest.mark.filterwarnings("ignore:.*query/key lanes of each head:UserWarning")

H, HEAD_DIM, D_MODEL = 4, 12, 32


def layer(prior_name=None, seed=0, **kwargs) -> PriorMultiheadAttention:
    """A float64 layer with random weights, prior and SSMax scales."""
    torch.manual_seed(seed)
    prior = None if prior_name is None else make_prior(prior_name, H, seed)
    module = PriorMultiheadAttention(D_MODEL, H, prior=prior, head_dim=HEAD_DIM, **kwargs).double()
    if module.ssmax is not None:
        with torch.no_grad():
            module.ssmax.s.uniform_(0.5, 1.5)
    return module


def inputs(B, L, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, D_MODEL, generator=gen, dtype=torch.float64)


def decode(module, x, chunks, cache=None, **per_token):
    """Feed ``x`` to ``module`` in pieces of the given lengths, slicing the per-token tensors."""
    outputs, start = [], 0
    for n in chunks:
        piece = {k: v[:, start : start + n] for k, v in per_token.items()}
        y, cache = module(x[:, start : start + n], cache=cache, **piece)
        outputs.append(y)
        start += n
    assert start == x.shape[1]
    return torch.cat(outputs, dim=1), cache


def test_output_and_cache_shapes():
    module = layer("goat", encoding="rope", num_kv_heads=2)
    y, cache = module(inputs(3, 7))
    assert y.shape == (3, 7, D_MODEL)
    assert cache.k.shape == (3, 2, 7, module.content_dim) and cache.v.shape == (3, 2, 7, HEAD_DIM)
    assert torch.equal(cache.positions, torch.arange(7)[None]) and len(cache) == 7
    y, cache = module(inputs(3, 2), cache=cache)
    assert y.shape == (3, 2, D_MODEL) and len(cache) == 9
    assert torch.equal(cache.positions, torch.arange(9)[None])


@pytest.mark.parametrize("prior_name", PRIOR_NAMES)
@pytest.mark.parametrize("encoding", [None, "rope"])
@pytest.mark.parametrize("ssmax", [False, True])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_cached_decoding_equals_full_pass(prior_name, encoding, ssmax, window, kv_heads):
    """A training-mode full pass vs. inference-mode decoding: a prefill, single tokens, a chunk."""
    module = layer(prior_name, encoding=encoding, ssmax=ssmax, window=window, num_kv_heads=kv_heads)
    x = inputs(2, 11)
    full, full_cache = module(x)
    with torch.no_grad():
        cached, cache = decode(module, x, [3, 1, 1, 4, 1, 1])
    torch.testing.assert_close(cached, full.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(cache.k, full_cache.k.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(cache.v, full_cache.v.detach(), rtol=0, atol=1e-12)
    assert torch.equal(cache.positions, full_cache.positions)


@pytest.mark.parametrize("prior_name", PRIOR_NAMES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("prefill", [5, 600])
def test_decode_steps_run_the_flash_kernel_on_padded_keys_and_equal_the_full_pass(
    prior_name, dtype, prefill, monkeypatch
):
    """Every decode step of a prior (single tokens and a chunk, grouped heads) runs the CPU flash
    kernel: the cache keeps its keys padded to the values' width, a view of its buffers."""
    took_flash = recording_flash_takes(monkeypatch)
    module = layer(prior_name, encoding="rope", num_kv_heads=2).to(dtype)
    x = inputs(1, prefill + 6).to(dtype)
    with torch.no_grad():
        full, _ = module(x)
        cached, cache = decode(module, x, [prefill, 1, 3, 1, 1])
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(cached, full, rtol=tol, atol=tol)
    assert took_flash == ([] if prior_name == "uniform" else [True] * 4)  # no prior: plain SDPA
    keys, Dq = cache.padded_keys(), module.content_dim
    assert keys.shape[-1] == HEAD_DIM and keys.data_ptr() == cache.k.data_ptr()
    assert torch.equal(keys[..., :Dq], cache.k) and not keys[..., Dq:].any()


def test_a_cache_never_extended_pads_a_copy_of_its_keys():
    k = torch.randn(1, 2, 3, 4)
    keys = KVCache(k, torch.zeros(1, 2, 3, 6), torch.arange(3)[None]).padded_keys()
    assert torch.equal(keys, torch.cat([k, torch.zeros(1, 2, 3, 2)], dim=-1))
    assert torch.equal(KVCache(k, torch.zeros(1, 2, 3, 3), torch.arange(3)[None]).padded_keys(), k)  # wider


@pytest.mark.parametrize("prior_name", ["alibi", "ggd", "goat"])
def test_cached_decoding_with_documents_padding_and_positions_equals_full_pass(prior_name):
    module = layer(prior_name, encoding="rope", ssmax=True)
    x = inputs(2, 9)
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2], [5, 5, 6, 6, 6, 6, 6, 6, 6]])
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[0, :2] = True  # left padding of a batched prompt
    positions = torch.stack([torch.arange(9) - 2, torch.arange(9) + 30]).clamp(min=0)
    per_token = dict(doc_ids=doc_ids, key_padding_mask=padding, positions=positions)
    full, _ = module(x, **per_token)
    cached, cache = decode(module, x, [5, 1, 3], **per_token)
    torch.testing.assert_close(cached, full, rtol=0, atol=1e-12)
    assert torch.equal(cache.doc_ids, doc_ids) and torch.equal(cache.key_padding_mask, padding)


def test_cached_padding_stays_invisible_to_later_queries():
    """A padding key cached by the prefill is ignored by later calls, as if never fed at all."""
    module = layer("alibi", encoding="rope", ssmax=True)
    x = inputs(1, 6)
    padding = torch.tensor([[False, False, True, False]])
    _, cache = module(x[:, :4], key_padding_mask=padding)
    y, cache = module(x[:, 4:], cache=cache)
    padding = torch.cat([padding, torch.zeros(1, 2, dtype=torch.bool)], dim=-1)
    assert torch.equal(cache.key_padding_mask, padding)
    kept = [0, 1, 3, 4, 5]
    expected, _ = module(x[:, kept], positions=torch.tensor(kept))
    torch.testing.assert_close(y, expected[:, 3:], rtol=0, atol=1e-12)


def test_decoding_writes_the_cache_in_place_and_grows_it_geometrically():
    """One token per step: the keys move to new buffers only when full (a few times over 200
    steps), not at every step as concatenation would, and still equal the full pass's."""
    module = layer("goat", encoding="rope")
    x = inputs(2, 203)
    buffers = []
    with torch.no_grad():
        full, full_cache = module(x)
        outputs, cache = [], None
        for piece in x.split([3] + [1] * 200, dim=1):
            y, cache = module(piece, cache=cache)
            outputs.append(y)
            buffers.append(cache.k.untyped_storage().data_ptr())
    moves = sum(a != b for a, b in zip(buffers, buffers[1:]))
    assert moves <= math.ceil(math.log(203 / 3, 1.5))  # the capacity grows 1.5 times per move
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache.k, full_cache.k, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache.v, full_cache.v, rtol=0, atol=1e-12)


def test_continuations_branched_from_one_cache_leave_each_other_alone():
    """Two continuations of one prefix, extended in turn: each sees the prefix and its own tokens
    only, and the prefix cache stays as it was (it had room that both would write into)."""
    module = layer("goat", encoding="rope", ssmax=True)
    prefix, first, second = inputs(1, 6), inputs(1, 3, seed=2), inputs(1, 3, seed=3)
    with torch.no_grad():
        _, cache = decode(module, prefix, [4, 1, 1])  # room after the prefix
        before = (cache.k.clone(), cache.v.clone(), cache.positions.clone())
        outputs = {"first": [], "second": []}
        caches = {"first": cache, "second": cache}
        for t in range(3):  # first's step t, then second's step t, on the same prefix
            for name, tokens in (("first", first), ("second", second)):
                y, caches[name] = module(tokens[:, t : t + 1], cache=caches[name])
                outputs[name].append(y)
        for name, tokens in (("first", first), ("second", second)):
            full, _ = module(torch.cat([prefix, tokens], dim=1))
            torch.testing.assert_close(torch.cat(outputs[name], dim=1), full[:, 6:], rtol=0, atol=1e-12)
    after = (cache.k, cache.v, cache.positions)
    assert all(torch.equal(a, b) for a, b in zip(before, after)) and len(cache) == 6


@pytest.mark.parametrize("late", ["key_padding_mask", "positions"])
def test_padding_or_per_sequence_positions_first_given_late_enter_the_cache(late):
    """A cache with room, no padding and positions shared by the batch takes a step with padding
    (earlier keys become non-padding) or with per-sequence positions: outputs as a full pass."""
    module = layer("alibi", encoding="rope")
    x = inputs(2, 8)
    doc_ids = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1], [2, 2, 2, 2, 2, 2, 2, 2]])
    per_token = dict(doc_ids=doc_ids)
    if late == "key_padding_mask":
        per_token[late] = torch.zeros(2, 8, dtype=torch.bool)
        per_token[late][1, 6] = True
    else:
        per_token[late] = torch.arange(8).repeat(2, 1)
        per_token[late][1, 6:] += 10
    with torch.no_grad():
        full, _ = module(x, **per_token)
        _, cache = decode(module, x[:, :6], [4, 1, 1], doc_ids=doc_ids[:, :6])  # room for one more
        y, cache = decode(
            module, x[:, 6:], [1, 1], cache=cache, **{k: t[:, 6:] for k, t in per_token.items()}
        )
    torch.testing.assert_close(y, full[:, 6:], rtol=0, atol=1e-12)
    assert torch.equal(getattr(cache, late), per_token[late]) and torch.equal(cache.doc_ids, doc_ids)


def test_a_wider_dtype_extends_the_cache_as_concatenation_would():
    """New entries of a wider dtype are not rounded into the cache's room: the cache is promoted."""
    narrow = torch.full((1, 1, 2, 4), 0.5, dtype=torch.bfloat16)
    cache = KVCache(narrow, narrow, torch.arange(2)[None])
    cache = cache.extend(KVCache(narrow[:, :, :1], narrow[:, :, :1], torch.tensor([[2]])))  # with room
    wide = torch.full((1, 1, 1, 4), 1 / 3, dtype=torch.float64)
    extended = cache.extend(KVCache(wide, wide, torch.tensor([[3]])))
    assert extended.k.dtype == extended.v.dtype == torch.float64
    assert torch.equal(extended.k[:, :, 3:], wide) and torch.equal(
        extended.k[:, :, :3].float(), narrow[:, :, :1].float().expand(1, 1, 3, 4)
    )


def test_gradients_through_a_cached_pass_equal_the_full_pass():
    """Under autograd the cache is never written in place (a saved key would change under backward)."""
    module = layer("goat", encoding="rope")
    x = inputs(2, 9)
    full, _ = module(x)
    expected = torch.autograd.grad(full.square().sum(), list(module.parameters()))
    cached, _ = decode(module, x, [3, 1, 1, 2, 1, 1])
    got = torch.autograd.grad(cached.square().sum(), list(module.parameters()))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_rope_layer_is_invariant_to_shifting_every_position():
    module = layer(None, encoding="rope")
    x = inputs(2, 6)
    y, _ = module(x)
    shifted, _ = module(x, positions=torch.arange(1000, 1006))
    torch.testing.assert_close(shifted, y, rtol=0, atol=1e-12)


def test_rope_layer_reads_a_runs_rotations_from_its_table_exactly():
    """Default positions (a run) read the RoPE's table; the same positions given are formed."""
    module = layer("goat", encoding="rope", num_kv_heads=2)
    x = inputs(2, 9)
    with torch.no_grad():
        read, read_cache = decode(module, x, [5, 1, 3])
        assert module.rope._tables
        given, given_cache = decode(module, x, [5, 1, 3], positions=torch.arange(9)[None].expand(2, -1))
    assert torch.equal(read_cache.k, given_cache.k)  # the keys as rotated
    torch.testing.assert_close(read, given, rtol=0, atol=1e-14)  # given positions may take another route


def test_layer_equals_its_definition_by_hand():
    """``softmax(<rope q, rope k> / sqrt(d_q) + ALiBi) v`` with grouped heads, then ``out_proj``."""
    module = layer("alibi", encoding="rope", num_kv_heads=2)
    assert module.content_dim == HEAD_DIM - 2  # one ALiBi lane + one padding lane for RoPE pairs
    B, L, Dq = 2, 7, module.content_dim
    x = inputs(B, L)
    pos = torch.arange(L)
    rope = RoPE(Dq)
    q = rope(module.q_proj(x).view(B, L, H, Dq).transpose(1, 2), pos)
    k = rope(module.k_proj(x).view(B, L, 2, Dq).transpose(1, 2), pos).repeat_interleave(2, dim=1)
    v = module.v_proj(x).view(B, L, 2, HEAD_DIM).transpose(1, 2).repeat_interleave(2, dim=1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(Dq) + ALiBi(H).double().log_prior(pos, pos)
    logits = logits.masked_fill(pos[None, :] > pos[:, None], -math.inf)
    expected = module.out_proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(B, L, H * HEAD_DIM))
    y, _ = module(x)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)


def test_goat_head_keeps_its_width(monkeypatch):
    """Seed 000 Algorithm 1: ``head_dim - fold_width`` content lanes + the prior's = head_dim."""
    module = PriorMultiheadAttention(128, 4, prior=GOAT(4), num_kv_heads=2)
    head_dim, fold_width = 32, GOAT(4).fold_width
    assert module.head_dim == head_dim and module.content_dim == head_dim - fold_width
    assert module.q_proj.out_features == 4 * (head_dim - fold_width)
    assert module.k_proj.out_features == 2 * (head_dim - fold_width)
    assert module.v_proj.out_features == 2 * head_dim
    assert module.out_proj.in_features == 4 * head_dim

    widths = []
    inputs = flash.flash_inputs  # what the CPU flash kernel is given

    def spy(*args):
        q, k, v = inputs(*args)
        widths.extend([q.shape[-1], k.shape[-1], v.shape[-1]])
        return q, k, v

    monkeypatch.setattr(flash, "flash_inputs", spy)
    module(torch.randn(1, 5, 128))
    assert widths == [head_dim, head_dim, head_dim]


def test_unfolded_prior_keeps_every_lane_for_content():
    assert layer("ggd").content_dim == HEAD_DIM
    assert PriorMultiheadAttention(32, 4, prior=ALiBi(4), causal=False).content_dim == 8
    assert PriorMultiheadAttention(32, 4, prior=ALiBi(4)).content_dim == 7


@pytest.mark.parametrize("prior_name", ["goat", "ggd"])
def test_decoding_never_takes_the_dense_reference_route(prior_name, monkeypatch):
    taken = []
    for name, route in api.ROUTES.items():
        monkeypatch.setitem(
            api.ROUTES, name, lambda *a, name=name, route=route: taken.append(name) or route(*a)
        )
    module = layer(prior_name, encoding="rope", ssmax=True, window=4)
    decode(module, inputs(1, 6), [3, 1, 2])
    assert taken and "reference" not in taken


def test_encoding_takes_a_rope_module_or_builds_one():
    rope = RoPE(8, interpolation=2.0)
    assert PriorMultiheadAttention(32, 4, encoding=rope).rope is rope
    assert PriorMultiheadAttention(32, 4, prior=GOAT(4, 2), encoding="rope").rope.head_dim == 2
    assert PriorMultiheadAttention(32, 4, prior=Uniform(), encoding="rope").rope.head_dim == 8
    built = PriorMultiheadAttention(32, 4, prior=GOAT(4, 2), encoding=partial(RoPE, interpolation=4.0))
    assert (built.rope.head_dim, built.rope.interpolation) == (2, 4.0)  # interpolation is RoPE's own
    # a function of the content width builds a RoPE the layer sizes: GOAT's 8 lanes leave 8 of 16
    yarn = partial(YaRNRoPE, scale=4.0, original_len=64)
    built = PriorMultiheadAttention(32, 2, prior=GOAT(2, 3), encoding=yarn).rope
    assert type(built) is YaRNRoPE and (built.head_dim, built.scale, built.original_len) == (8, 4.0, 64)


def test_ssmax_true_builds_one_scale_per_head():
    module = PriorMultiheadAttention(32, 4, ssmax=True)
    assert isinstance(module.ssmax, SSMax) and module.ssmax.s.shape == (4,)
    assert PriorMultiheadAttention(32, 4, ssmax=False).ssmax is None


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_kv_heads=3), ValueError, "num_heads=4 is not a multiple of num_kv_heads=3"),
        (dict(prior=ALiBi(2)), ValueError, "prior has 2 heads but num_heads=4"),
        (
            dict(prior=GOAT(4)),
            ValueError,
            r"head_dim=8 leaves no content lanes: GOAT folds into 18",
        ),
        (dict(prior="alibi"), TypeError, "prior must be a priorattn.priors.Prior"),
        (dict(encoding="alibi"), ValueError, "encoding must be None, 'rope' or a RoPE module"),
        (dict(encoding=Sinusoidal(32)), TypeError, "added to the token embeddings"),
        (dict(encoding=RoPE(6)), ValueError, "encoding rotates 6 lanes but q/k have 8"),
        (
            dict(encoding=lambda width: Sinusoidal(width)),
            TypeError,
            "encoding must be None, 'rope', a RoPE module or a function of the content width giving one",
        ),
        (dict(ssmax=SSMax(2)), ValueError, "ssmax has 2 heads"),
        (dict(ssmax=torch.ones(4)), TypeError, "ssmax must be None, True or an SSMax module"),
        (dict(window=0), ValueError, "window must be a positive int"),
        (dict(backend="flash"), ValueError, "backend must be one of"),
        (dict(head_dim=0), ValueError, "head_dim must be a positive int"),
        (dict(encoding=partial(RoPE, interpolation=0.0)), ValueError, "interpolation must be > 0"),
    ],
)
def test_bad_construction_names_the_problem(kwargs, error, message):
    with pytest.raises(error, match=message):
        PriorMultiheadAttention(32, 4, **kwargs)


def test_prior_too_wide_for_the_head_with_rope_names_the_problem():
    with pytest.raises(ValueError, match="leaves no content lanes"):
        PriorMultiheadAttention(32, 4, prior=GOAT(4, 3), encoding="rope")  # 8 lanes, 8 wide


def test_prior_leaving_one_odd_lane_to_rope_is_refused():
    # 23 of 24 lanes folded leaves one content lane, which RoPE cannot rotate on its own
    with pytest.raises(ValueError, match="head_dim=24 leaves no content lanes: GOAT folds into 23"):
        PriorMultiheadAttention(24, 1, prior=GOAT(1, 11, slope=False), encoding="rope")


def test_goat_taking_more_than_half_the_head_warns():
    with pytest.warns(UserWarning, match="GOAT folds into 18 of the 32 query/key lanes .* leaving 14"):
        PriorMultiheadAttention(128, 4, prior=GOAT(4, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PriorMultiheadAttention(128, 4, prior=GOAT(4, 7))  # 16 of 32: content keeps half


def test_d_model_not_divisible_by_heads_needs_an_explicit_head_dim():
    with pytest.raises(ValueError, match="d_model=100 is not divisible by num_heads=8: .* give head_dim"):
        PriorMultiheadAttention(100, 8)
    assert PriorMultiheadAttention(100, 8, head_dim=12).out_proj.in_features == 96


@pytest.mark.parametrize(
    "x, kwargs, error, message",
    [
        (
            torch.randn(5, 32),
            {},
            ValueError,
            r"x must be a 3-D tensor \(B, L, d_model\)",
        ),
        (torch.randn(1, 5, 16), {}, ValueError, "x has d_model=16 but the layer was built for 32"),
        (torch.randn(1, 5, 32), dict(positions=torch.arange(5.0)), ValueError, "integer tensor"),
        (
            torch.randn(1, 5, 32),
            dict(positions=torch.arange(4)),
            ValueError,
            r"shape \(5,\) or \(1, 5\)",
        ),
        (
            torch.randn(1, 5, 32),
            dict(doc_ids=torch.zeros(1, 4).long()),
            ValueError,
            "doc_ids must be",
        ),
        (
            torch.randn(1, 5, 32),
            dict(key_padding_mask=torch.zeros(1, 5)),
            ValueError,
            "key_padding_mask must be a bool tensor",
        ),
        (torch.randn(1, 5, 32), dict(cache=(1, 2)), TypeError, "cache must be a KVCache"),
    ],
)
def test_bad_call_names_the_problem(x, kwargs, error, message):
    with pytest.raises(error, match=message):
        PriorMultiheadAttention(32, 4, prior=GGD(4))(x, **kwargs)


def test_cache_from_another_layer_shape_names_the_problem():
    _, cache = PriorMultiheadAttention(32, 4, num_kv_heads=2)(torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match=r"cache keys are \(1, 2, 3, 8\), expected"):
        PriorMultiheadAttention(32, 4)(torch.randn(1, 1, 32), cache=cache)


def test_doc_ids_on_some_calls_only_names_the_problem():
    module = PriorMultiheadAttention(32, 4)
    _, cache = module(torch.randn(1, 3, 32), doc_ids=torch.zeros(1, 3).long())
    with pytest.raises(ValueError, match="the cache has doc_ids but this call gives none"):
        module(torch.randn(1, 1, 32), cache=cache)
    _, cache = module(torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="the cache has no doc_ids but this call gives some"):
        module(torch.randn(1, 1, 32), cache=cache, doc_ids=torch.zeros(1, 1).long())


def test_kv_cache_of_tensors_has_their_length_and_no_documents_or_padding():
    cache = KVCache(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 5), torch.arange(3)[None])
    assert len(cache) == 3 and cache.doc_ids is None and cache.key_padding_mask is None
