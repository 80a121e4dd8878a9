"""NTK-aware RoPE and YaRN: frequencies against Peng et al. 2023's formulas written out here, s = 1
is plain RoPE bit for bit, YaRN's temperature, Hugging Face's implementation where it follows the
same definitions, cached decoding through a layer, bad options."""

from __future__ import annotations

import math

import pytest
import torch

from priorattn import PriorMultiheadAttention
from priorattn.encodings import ROPE_SCALINGS, NTKAwareRoPE, RoPE, YaRNRoPE, scaled_rope


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def rotated(rope, x, position):
    """``x: (D,)`` rotated to ``position``, as ``(D,)``."""
    return rope(x[None, None, None], torch.tensor([position]))[0, 0, 0]


def ntk_freqs(D: int, base: float, s: float) -> list[float]:
    """The paper's NTK-aware interpolation: ``b' = b s^(|D| / (|D| - 2))``, ``theta_d = b'^(-2d/|D|)``."""
    scaled_base = base * s ** (D / (D - 2))
    return [scaled_base ** (-2 * d / D) for d in range(D // 2)]


def yarn_freqs(D: int, base: float, s: float, L: int, alpha: float, beta: float) -> list[float]:
    """The paper's NTK-by-parts: ``lambda_d = 2 pi b^(2d/|D|)``, ``r = L / lambda_d``, the ramp
    ``gamma(r)``, ``h(theta_d) = (1 - gamma) theta_d / s + gamma theta_d``."""
    out = []
    for d in range(D // 2):
        theta = base ** (-2 * d / D)
        r = L / (2 * math.pi * base ** (2 * d / D))
        if r < alpha:
            gamma = 0.0
        elif r > beta:
            gamma = 1.0
        else:
            gamma = (r - alpha) / (beta - alpha)
        out.append((1 - gamma) * theta / s + gamma * theta)
    return out


def regimes(D: int, base: float, L: int, alpha: float, beta: float) -> set[str]:
    """Which of YaRN's three regimes (kept, ramped, interpolated) the lane pairs fall in."""
    turns = [L / (2 * math.pi * base ** (2 * d / D)) for d in range(D // 2)]
    return {"interpolated" if r < alpha else "kept" if r > beta else "ramped" for r in turns}


@pytest.mark.parametrize("D", [4, 8, 64])
@pytest.mark.parametrize("s", [1.5, 4.0, 16.0])
def test_ntk_aware_frequencies_are_the_papers(D, s):
    rope = NTKAwareRoPE(D, s, base=10_000.0)
    expected = torch.tensor(ntk_freqs(D, 10_000.0, s), dtype=torch.float64)
    torch.testing.assert_close(rope.freqs(), expected, rtol=1e-14, atol=0)
    plain = RoPE(D).freqs()
    # the highest frequency is kept, the lowest is divided by s
    assert rope.freqs()[0] == plain[0] == 1.0
    torch.testing.assert_close(rope.freqs()[-1], plain[-1] / s, rtol=1e-14, atol=0)


@pytest.mark.parametrize(
    "D, base, L, alpha, beta",
    [(64, 10_000.0, 2048, 1.0, 32.0), (32, 500.0, 64, 1.0, 32.0), (16, 10_000.0, 256, 2.0, 8.0)],
)
@pytest.mark.parametrize("s", [2.0, 8.0])
def test_yarn_frequencies_are_ntk_by_parts(D, base, L, alpha, beta, s):
    rope = YaRNRoPE(D, s, L, base=base, alpha=alpha, beta=beta)
    expected = torch.tensor(yarn_freqs(D, base, s, L, alpha, beta), dtype=torch.float64)
    torch.testing.assert_close(rope.freqs(), expected, rtol=1e-14, atol=0)


def test_the_yarn_cases_reach_every_regime_of_the_ramp():
    assert regimes(64, 10_000.0, 2048, 1.0, 32.0) == {"kept", "ramped", "interpolated"}
    assert regimes(16, 10_000.0, 256, 2.0, 8.0) == {"kept", "ramped", "interpolated"}


@pytest.mark.parametrize("scaling", ROPE_SCALINGS)
@pytest.mark.parametrize("D", [4, 64])
def test_a_factor_of_one_is_plain_rope_bit_for_bit(scaling, D):
    rope = scaled_rope(scaling, D, 1.0, original_len=32, base=500.0)
    plain = RoPE(D, base=500.0)
    assert torch.equal(rope.freqs(), plain.freqs()) and rope.attention_factor == 1.0
    x = randn(2, 3, 50, D)
    for positions in (torch.arange(50), torch.arange(10**6, 10**6 + 50)):
        assert torch.equal(rope(x, positions), plain(x, positions))
    cpu = torch.device("cpu")
    for got, expected in zip(
        rope.rotations_of_run(7, 30, torch.float32, cpu), plain.rotations_of_run(7, 30, torch.float32, cpu)
    ):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("s", [1.0, 2.0, 16.0])
def test_yarn_temperature_divides_the_content_logits_by_t(s):
    """``sqrt(1/t) = 0.1 ln(s) + 1`` on q and on k: the logit of a pair is ``1/t`` times the logit of
    the same rotation by ``h(theta)`` without it, written out here lane pair by lane pair."""
    D, L = 16, 64
    rope = YaRNRoPE(D, s, L, base=500.0)
    assert rope.attention_factor == pytest.approx(0.1 * math.log(s) + 1, rel=1e-15)
    freqs = yarn_freqs(D, 500.0, s, L, 1.0, 32.0)

    def rotate_by_hand(x, p):
        out = x.clone()
        for d, w in enumerate(freqs):  # lanes (d, d + D/2) turn by w p
            c, n = math.cos(w * p), math.sin(w * p)
            out[d] = x[d] * c - x[d + D // 2] * n
            out[d + D // 2] = x[d + D // 2] * c + x[d] * n
        return out

    q, k = randn(D, seed=1), randn(D, seed=2)
    inverse_t = (0.1 * math.log(s) + 1) ** 2
    for i, j in ((5, 3), (1000, 0), (70, 70)):
        logit = rotated(rope, q, i) @ rotated(rope, k, j)
        by_hand = rotate_by_hand(q, i) @ rotate_by_hand(k, j)
        torch.testing.assert_close(logit, inverse_t * by_hand, rtol=1e-12, atol=1e-12)


def hf_config(D: int, base: float, rope_type: str, **parameters):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        hidden_size=2 * D,
        num_attention_heads=2,
        head_dim=D,
        max_position_embeddings=parameters.pop("max_position_embeddings", 2048),
        rope_parameters=dict(rope_type=rope_type, rope_theta=base, **parameters),
    )


@pytest.mark.parametrize("s", [2.0, 8.0])
def test_yarn_agrees_with_hugging_face_outside_the_ramp_and_in_its_temperature(s):
    """Hugging Face ramps linearly in the lane index between the (rounded) indices where ``r = beta``
    and ``r = alpha``, the paper linearly in ``r``: the two agree on every lane pair outside the ramp,
    and on the temperature."""
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    D, base, L = 64, 10_000.0, 2048
    config = hf_config(
        D, base, "yarn", factor=s, original_max_position_embeddings=L, beta_fast=32.0, beta_slow=1.0
    )
    inv_freq, attention_factor = _compute_yarn_parameters(config)
    rope = YaRNRoPE(D, s, L, base=base)
    assert attention_factor == pytest.approx(rope.attention_factor, rel=1e-12)
    turns = L * RoPE(D, base).freqs() / (2 * math.pi)
    outside = (turns > 32.0) | (turns < 1.0)
    assert outside.sum() >= D // 4
    torch.testing.assert_close(inv_freq.double()[outside], rope.freqs()[outside], rtol=1e-6, atol=0)


@pytest.mark.parametrize("s", [2.0, 8.0])
def test_ntk_aware_is_hugging_faces_dynamic_ntk_at_s_times_the_training_length(s):
    """Hugging Face's dynamic NTK raises the base by ``(factor n / L - (factor - 1))^(D / (D - 2))`` at
    length ``n``: with ``factor = 1`` and ``n = s L`` that is the NTK-aware base of ``s``."""
    from transformers.modeling_rope_utils import _compute_dynamic_ntk_parameters

    D, base, L = 64, 10_000.0, 2048
    config = hf_config(D, base, "dynamic", factor=1.0, max_position_embeddings=L)
    inv_freq, _ = _compute_dynamic_ntk_parameters(config, seq_len=int(s * L))
    torch.testing.assert_close(inv_freq.double(), NTKAwareRoPE(D, s, base).freqs(), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "rope",
    [NTKAwareRoPE(8, 4.0), YaRNRoPE(8, 4.0, 16, base=100.0)],
    ids=["ntk", "yarn"],
)
def test_cached_decoding_through_a_layer_equals_a_full_pass(rope):
    torch.manual_seed(0)
    layer = PriorMultiheadAttention(16, 2, encoding=rope, num_kv_heads=1).double()
    x = randn(2, 20, 16)
    with torch.no_grad():
        full, _ = layer(x)
        outputs, cache = [], None
        for start, n in ((0, 7), (7, 1), (8, 5), (13, 1), (14, 6)):
            y, cache = layer(x[:, start : start + n], cache=cache)
            outputs.append(y)
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=0, atol=1e-12)
    plain = PriorMultiheadAttention(16, 2, encoding="rope", num_kv_heads=1).double()
    plain.load_state_dict(layer.state_dict())
    with torch.no_grad():
        assert not torch.allclose(full, plain(x)[0])  # the scaling is applied


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: NTKAwareRoPE(8, 0.5), "scale must be a finite number >= 1"),
        (lambda: NTKAwareRoPE(8, math.inf), "scale must be a finite number >= 1"),
        (lambda: NTKAwareRoPE(8, True), "scale must be a finite number >= 1"),
        (lambda: NTKAwareRoPE(2, 2.0), "head_dim must be >= 4"),
        (lambda: NTKAwareRoPE(7, 2.0), "head_dim must be even"),
        (lambda: YaRNRoPE(8, 0.9, 16), "scale must be a finite number >= 1"),
        (lambda: YaRNRoPE(8, 2.0, 0), "original_len must be an int >= 1"),
        (lambda: YaRNRoPE(8, 2.0, 16.0), "original_len must be an int >= 1"),
        (lambda: YaRNRoPE(8, 2.0, 16, alpha=32.0, beta=1.0), "0 <= alpha < beta"),
        (lambda: YaRNRoPE(8, 2.0, 16, alpha=-1.0), "0 <= alpha < beta"),
        (lambda: YaRNRoPE(8, 2.0, 16, beta=math.nan), "beta must be a finite number"),
        (lambda: scaled_rope("linear", 8, 2.0, original_len=16), "RoPE scaling must be one of pi, ntk, yarn"),
        (lambda: scaled_rope("pi", 8, 0.0, original_len=16), "interpolation must be > 0"),
    ],
)
def test_bad_options_are_one_line_errors(build, message):
    with pytest.raises(ValueError, match=message) as error:
        build()
    assert "\n" not in str(error.value)
