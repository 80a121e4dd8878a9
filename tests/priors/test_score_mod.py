"""A prior as a FlexAttention ``score_mod`` (``prior.score_mod``) with ``flex_mask_mod``: its terms
add up to the log-prior, and ``flex_attention`` with them equals the reference route forward for
every prior (FlexAttention runs forward only on the CPU), under GQA, documents, a window and padding;
bad arguments are one line."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from factories import PRIOR_NAMES, make_prior
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import priorattn
from priorattn.data import document_positions
from priorattn.functional import flex_mask_mod
from priorattn.priors import FIRE, GOAT, Sum


def flex(q, k, v, score_mod, mask_mod, compiled=False):
    """``flex_attention`` with ``score_mod`` and the block mask of ``mask_mod``: eager (the unfused
    implementation, which materializes the scores) unless ``compiled``."""
    B, Lq, Lk = q.shape[0], q.shape[2], k.shape[2]
    mask = create_block_mask(mask_mod, B, None, Lq, Lk, device="cpu")
    attend = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        return attend(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def problem(B=2, H=4, Hkv=2, Lq=37, Lk=37, D=8, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=gen, dtype=dtype)
    k, v = (torch.randn(B, Hkv, Lk, D, generator=gen, dtype=dtype) for _ in range(2))
    doc_ids = torch.randint(0, 3, (B, Lk), generator=gen).sort(-1).values
    return q, k, v, doc_ids


#: Positions of the keys: far from 0 and a different offset per row, or restarting at each document
#: of a packed row (where GOAT's sink reads a key's position within its document).
POSITIONS = {
    "far, per row": lambda doc_ids: 1000 + torch.arange(doc_ids.shape[1]) + torch.tensor([[0], [7]]),
    "per document": document_positions,
}


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("name", PRIOR_NAMES)
def test_the_score_terms_add_up_to_the_log_prior(name, positions):
    prior = make_prior(name, 4)
    _, _, _, doc_ids = problem()
    k_pos = POSITIONS[positions](doc_ids).reshape(-1, doc_ids.shape[1])
    q_pos = k_pos[:, 5:]
    low = int(q_pos.min()) - int(k_pos.max())
    lags = torch.arange(low, int(q_pos.max()) - int(k_pos.min()) + 1)
    terms = prior.score_terms(q_pos, k_pos, lags)
    lag = q_pos[:, :, None] - k_pos[:, None, :]  # (B or 1, Lq, Lk)
    K = torch.zeros(lag.shape, dtype=torch.float64)[:, None]
    if terms.by_lag is not None:
        K = K + terms.by_lag[:, lag - low].movedim(0, 1)  # (B, H, Lq, Lk)
    if terms.by_key is not None:
        K = K + terms.by_key[:, :, None, :]
    if terms.dense is not None:
        K = K + terms.dense
    expected = prior.log_prior(q_pos, k_pos).double()  # Uniform's zeros are float32
    torch.testing.assert_close(K.expand_as(expected), expected, rtol=1e-12, atol=1e-12)
    assert terms.dense is None or not prior.is_relative  # a relative prior needs no Lq x Lk values


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("name", PRIOR_NAMES)
def test_flex_attention_with_a_priors_score_mod_equals_the_reference_route(name, positions):
    q, k, v, doc_ids = problem()
    pos = POSITIONS[positions](doc_ids)
    prior = make_prior(name, 4)
    out = flex(q, k, v, prior.score_mod(pos, q=q), flex_mask_mod(pos, doc_ids=doc_ids))
    with torch.no_grad():
        ref = priorattn.attention(
            q, k, v, prior=prior, q_pos=pos, k_pos=pos, doc_ids=doc_ids, backend="reference"
        )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", PRIOR_NAMES)
def test_queries_after_a_cache_and_bidirectional_masks_equal_the_reference_route(name):
    """The last 9 of 40 keys query (a prefill after a cache, positions shared by the batch), then
    every key queries every key within a window, with padding keys."""
    q, k, v, doc_ids = problem(Lq=9, Lk=40, seed=1)
    prior = make_prior(name, 4)
    k_pos = torch.arange(300, 340)
    q_pos = k_pos[-9:]
    out = flex(q, k, v, prior.score_mod(q_pos, k_pos, q=q), flex_mask_mod(q_pos, k_pos, doc_ids=doc_ids))
    kwargs = dict(q_pos=q_pos, k_pos=k_pos, doc_ids=doc_ids, backend="reference")
    with torch.no_grad():
        torch.testing.assert_close(
            out, priorattn.attention(q, k, v, prior=prior, **kwargs), rtol=1e-10, atol=1e-10
        )

    q, k, v, _ = problem(Lq=30, Lk=30, seed=2)
    padding = torch.rand(2, 30, generator=torch.Generator().manual_seed(3)) < 0.2
    padding[:, :3] = False  # every query sees a key
    masks = dict(causal=False, window=5, key_padding_mask=padding)
    out = flex(q, k, v, prior.score_mod(k_pos[:30], q=q), flex_mask_mod(k_pos[:30], **masks))
    with torch.no_grad():
        ref = priorattn.attention(
            q, k, v, prior=prior, q_pos=k_pos[:30], k_pos=k_pos[:30], backend="reference", **masks
        )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_compiled_flex_attention_reads_lag_key_and_dense_terms():
    """The kernel, not the unfused eager path: GOAT's lag table and sink and FIRE's dense values."""
    q, k, v, doc_ids = problem(dtype=torch.float32)
    pos = document_positions(doc_ids)
    prior = Sum(
        make_prior("goat", 4, dtype=torch.float32), make_prior("fire", 4, seed=1, dtype=torch.float32)
    )
    with torch.no_grad():
        out = flex(q, k, v, prior.score_mod(pos), flex_mask_mod(pos, doc_ids=doc_ids), compiled=True)
        ref = priorattn.attention(
            *(t.double() for t in (q, k, v)),
            prior=prior.double(),
            q_pos=pos,
            k_pos=pos,
            doc_ids=doc_ids,
            backend="reference",
        )
    assert (out.double() - ref).abs().max() < 1e-5


def test_the_score_mod_adds_the_prior_unscaled():
    """flex_attention's ``scale`` multiplies ``<q, k>`` only: a scale of 0 leaves the prior alone."""
    q, k, v, doc_ids = problem(H=2, Hkv=2)
    prior = make_prior("alibi", 2)
    pos = torch.arange(37)
    mask = create_block_mask(flex_mask_mod(pos), None, None, 37, 37, device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        out = flex_attention(q, k, v, score_mod=prior.score_mod(pos), block_mask=mask, scale=0.0)
    weights = torch.softmax(prior.log_prior(pos, pos).masked_fill(pos[None, :] > pos[:, None], -math.inf), -1)
    torch.testing.assert_close(out, weights @ v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p, q: p.score_mod(torch.arange(8.0)), r"q_pos must be an integer tensor \(L,\) or \(B, L\)"),
        (
            lambda p, q: p.score_mod(torch.arange(8), torch.zeros(2, 3, 8).long()),
            "k_pos must be an integer tensor",
        ),
        (lambda p, q: p.score_mod(torch.arange(0)), "with L >= 1"),
        (
            lambda p, q: p.score_mod(torch.zeros(2, 8).long(), torch.zeros(3, 8).long()),
            "q_pos has 2 rows but k_pos has 3",
        ),
        (
            lambda p, q: GOAT(2, 2, gate=True).score_mod(torch.arange(8)),
            "query gate reads the content queries: give q",
        ),
        (
            lambda p, q: GOAT(2, 2, gate=True).score_mod(torch.arange(8), q=q[:, :, :5]),
            r"q must be a floating tensor \(B, 2, 8, D\) matching q_pos",
        ),
        (lambda p, q: flex_mask_mod(torch.arange(8), window=0), "window must be a positive int"),
        (
            lambda p, q: flex_mask_mod(torch.arange(8), doc_ids=torch.zeros(2, 7).long()),
            r"doc_ids must be .* \(2, 8\)",
        ),
        (
            lambda p, q: flex_mask_mod(
                torch.zeros(2, 8).long(), key_padding_mask=torch.zeros(3, 8, dtype=torch.bool)
            ),
            r"q_pos must have shape \(8,\), \(1, 8\) or \(3, 8\)",
        ),
    ],
)
def test_bad_arguments_are_one_line_errors(call, message):
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match=message) as error:
        call(FIRE(2), q)
    assert "\n" not in str(error.value)
