"""GOAT's options of issue 28: a recency slope that cannot turn negative, the sinks, the query gate,
and runs saved with the old slope."""

from __future__ import annotations

import json

import pytest
import torch

from priorattn.priors import GOAT, ALiBi, Sum, alibi_slopes, build_prior, canonical_spec


def test_a_learned_slope_pushed_down_never_goes_negative():
    prior = GOAT(4, 2, init="alibi", train_len=32)
    optimizer = torch.optim.SGD(prior.parameters(), lr=10.0)
    for _ in range(50):
        optimizer.zero_grad()
        prior.fold_slope().sum().backward()  # d/dm > 0: descent pushes every m_h down
        optimizer.step()
    m = prior.fold_slope()
    assert (m > 0).all() and m.max() < 0.01
    q = torch.arange(32)
    K = prior.log_prior(q, q)  # a recency: never higher for an older key
    assert (K[:, -1, 1:] - K[:, -1, :-1] >= -1e-6).all()


def test_the_slope_kinds():
    learned, fixed = GOAT(4, 2), GOAT(4, 2, slope="fixed")
    for start in (learned, GOAT(4, 2, init="alibi")):  # "seeded" (the default) and "alibi"
        torch.testing.assert_close(start.fold_slope().double(), alibi_slopes(4), rtol=1e-6, atol=0)
    assert "slopes" in dict(fixed.named_buffers()) and not any(
        "slope" in n for n, _ in fixed.named_parameters()
    )
    torch.testing.assert_close(fixed.fold_slope().double(), alibi_slopes(4))
    assert GOAT(4, 2, slope="none").fold_slope() is None
    assert GOAT(4, 2, init="uniform").fold_slope().max() < 1e-12  # softplus(-30)


@pytest.mark.parametrize(
    "old",
    [
        "goat(sink=false, slope=false)",
        dict(name="goat", sink=False, slope=False),
        json.loads('{"name": "goat", "sink": false, "slope": false}'),
    ],
)
def test_old_true_and_false_read_as_the_kinds(old):
    """Arguments, spec strings and JSON specs alike: sink true/false is shared/none, slope
    learned/none (as the legacy loader reads goat_slope), and the spec names the word."""
    spec = build_prior(old, 2).spec()
    assert (spec["sink"], spec["slope"]) == ("none", "none")
    assert spec == build_prior("goat(sink=none, slope=none)", 2).spec()
    assert canonical_spec(old) == "goat(sink=none, slope=none)"
    made = GOAT(2, 1, sink=True, slope=True)
    assert (made.spec()["sink"], made.spec()["slope"], made.slope_kind) == ("shared", "learned", "learned")
    with pytest.raises(ValueError, match="slope must be one of learned, fixed, none, got 'false'"):
        GOAT(2, 1, slope="false")  # the words of a spec string are read by the spec, not the constructor


def test_the_shared_sink_is_gain_times_one_mlp_plus_a_bump_at_zero():
    prior = GOAT(3, 1, slope="none")
    sink = prior.sink
    with torch.no_grad():
        for p in sink.parameters():
            p.normal_()
    k = torch.arange(-2, 6)
    u = sink(k)  # (H, Lk)
    shared = sink.mlp(sink.features(k))[:, 0]  # (Lk,)
    expected = sink.gain[:, None] * shared + sink.bump[:, None] * (k == 0)
    torch.testing.assert_close(u, expected)


def test_a_run_saved_with_a_negative_slope_is_refused_with_the_reason():
    old = {"alpha": torch.zeros(2, 1), "beta": torch.zeros(2, 1), "freqs": GOAT(2, 1).freqs}
    prior = GOAT(2, 1, sink="none")
    prior.load_state_dict(old | {"slope": torch.tensor([0.25, 0.0])})
    torch.testing.assert_close(prior.fold_slope(), torch.tensor([0.25, 0.0]), rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match="anti-recency"):
        prior.load_state_dict(old | {"slope": torch.tensor([0.25, -0.02])})


def test_a_state_with_the_per_head_sink_names_the_option_that_loads_it():
    state = GOAT(2, 1, sink="per_head").state_dict()
    with pytest.raises(ValueError, match="goat\\(sink=per_head\\)"):
        GOAT(2, 1).load_state_dict(state)
    GOAT(2, 1, sink="per_head").load_state_dict(state)


def test_the_gate_multiplies_each_querys_log_prior():
    prior = GOAT(2, 1, gate=True)
    q = torch.randn(1, 2, 5, 8)
    g = prior.query_gate(q)
    expected = torch.sigmoid(
        prior.gate_bias[:, None, None]
        - torch.nn.functional.softplus(prior.gate_scale_raw)[:, None, None] * q.norm(dim=-1, keepdim=True)
    )
    torch.testing.assert_close(g, expected)
    assert GOAT(2, 1).query_gate(q) is None


def test_a_sum_refuses_a_gated_part():
    with pytest.raises(ValueError, match="query gate"):
        Sum(ALiBi(2), GOAT(2, 1, gate=True))


@pytest.mark.parametrize("bad", [dict(slope="steep"), dict(sink="mlp"), dict(gate=1)])
def test_bad_options_are_refused_by_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        GOAT(2, 1, **bad)


def test_goats_alibi_start_keeps_its_earlier_name():
    """``init="recency"`` (GOAT's word before GGD's and the model's ``"alibi"`` named it too) builds
    the same start, from the constructor and from a spec saved with it."""
    torch.manual_seed(0)
    new = GOAT(4, 2, init="alibi", slope="none", train_len=32)
    torch.manual_seed(0)
    old = GOAT(4, 2, init="recency", slope="none", train_len=32)
    assert all(torch.equal(a, b) for a, b in zip(new.state_dict().values(), old.state_dict().values()))
    old, new = (build_prior(f"goat(init={start})", 4) for start in ("recency", "alibi"))
    assert torch.equal(old.slope_raw, new.slope_raw)
