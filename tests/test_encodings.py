"""RoPE and sinusoidal encodings: formulas by hand, the relative property, offsets, RoPE's table of
rotations, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from priorattn.encodings import RoPE, Sinusoidal
from priorattn.encodings.rope import TABLE_POSITIONS


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def rotated(rope, x, position):
    """``x: (D,)`` rotated to ``position``, as ``(D,)``."""
    return rope(x[None, None, None], torch.tensor([position]))[0, 0, 0]


@pytest.mark.parametrize("interpolation", [1.0, 4.0])
def test_rope_score_depends_only_on_relative_position(interpolation):
    rope = RoPE(16, interpolation=interpolation)
    q, k = randn(16, seed=1), randn(16, seed=2)

    def score(i, j):
        return rotated(rope, q, i) @ rotated(rope, k, j)

    for lag in (0, 3, -5):
        scores = torch.stack([score(i + lag, i) for i in (0, 7, 1000, 100_000)])
        torch.testing.assert_close(scores, scores[:1].expand(4), rtol=0, atol=1e-9)
    assert not torch.isclose(score(3, 0), score(0, 0))


def test_rope_hand_computed():
    """D = 4, base = 100: lanes (0, 2) turn by 1 rad per position, lanes (1, 3) by 0.1 rad."""
    a, b, c, d = 0.3, -1.2, 0.7, 2.0
    p = 3
    out = rotated(RoPE(4, base=100.0), torch.tensor([a, b, c, d], dtype=torch.float64), p)
    expected = [
        a * math.cos(p) - c * math.sin(p),
        b * math.cos(0.1 * p) - d * math.sin(0.1 * p),
        c * math.cos(p) + a * math.sin(p),
        d * math.cos(0.1 * p) + b * math.sin(0.1 * p),
    ]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64))


def test_rope_position_zero_is_identity_and_rotation_keeps_norm():
    rope = RoPE(8)
    x = randn(2, 3, 5, 8)
    assert torch.equal(rope(x, torch.zeros(5, dtype=torch.long)), x)
    y = rope(x, torch.arange(100, 105))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_rope_at_an_offset_matches_the_full_sequence():
    """A KV-cache chunk at positions 6..9 gets exactly the rotations of the full pass."""
    rope = RoPE(8)
    x = randn(2, 3, 10, 8)
    full = rope(x, torch.arange(10))
    assert torch.equal(rope(x[:, :, 6:], torch.arange(6, 10)), full[:, :, 6:])


def test_rope_batched_positions_rotate_each_row():
    rope = RoPE(8)
    x = randn(2, 3, 4, 8)
    positions = torch.tensor([[0, 1, 2, 3], [50, 51, 52, 53]])
    out = rope(x, positions)
    for b in range(2):
        assert torch.equal(out[b], rope(x[b : b + 1], positions[b])[0])


def test_rope_interpolation_divides_positions():
    x = randn(1, 2, 5, 8)
    positions = torch.arange(5)
    torch.testing.assert_close(
        RoPE(8, interpolation=4.0)(x, 4 * positions), RoPE(8)(x, positions), rtol=0, atol=1e-15
    )
    assert not torch.allclose(RoPE(8, interpolation=4.0)(x, positions), RoPE(8)(x, positions))


def test_rope_base_and_interpolation_cannot_be_edited_behind_its_tables():
    rope = RoPE(8)
    rope.rotations_of_run(0, 4, torch.float32, torch.device("cpu"))
    for name in ("base", "interpolation"):
        with pytest.raises(AttributeError):
            setattr(rope, name, 2.0)


def test_rope_angles_are_float64_at_long_positions():
    """At position ~10^6 a float32 angle is off by up to 0.03 rad; float64 angles are not."""
    D, base, p = 8, 10.0, 1_234_567
    out = RoPE(D, base=base)(torch.ones(1, 1, 1, D), torch.tensor([p]))[0, 0, 0]
    assert out.dtype == torch.float32
    for r in range(D // 2):  # ones rotate to [cos - sin, cos + sin] on lanes (r, r + D/2)
        angle = p * base ** (-2 * r / D)
        assert out[r].item() == pytest.approx(math.cos(angle) - math.sin(angle), abs=1e-5)
        assert out[r + D // 2].item() == pytest.approx(math.cos(angle) + math.sin(angle), abs=1e-5)


@pytest.mark.parametrize(
    "build, call, message",
    [
        (dict(head_dim=7), None, "head_dim must be even"),
        (dict(head_dim=8, interpolation=0.0), None, "interpolation must be > 0"),
        (dict(head_dim=8), (randn(3, 5, 8), torch.arange(5)), r"x must have shape \(B, H, L, 8\)"),
        (
            dict(head_dim=8),
            (randn(1, 3, 5, 6), torch.arange(5)),
            r"x must have shape \(B, H, L, 8\)",
        ),
        (
            dict(head_dim=8),
            (randn(1, 3, 5, 8), torch.arange(4)),
            r"positions must be an integer tensor of shape \(5,\)",
        ),
        (
            dict(head_dim=8),
            (randn(2, 3, 5, 8), torch.zeros(3, 5).long()),
            r"of shape \(5,\) or \(2, 5\), got torch.int64 \(3, 5\)",
        ),
        (
            dict(head_dim=8),
            (randn(1, 3, 5, 8), torch.arange(5.0)),
            "positions must be an integer tensor",
        ),
    ],
)
def test_rope_bad_input_names_the_problem(build, call, message):
    with pytest.raises(ValueError, match=message):
        RoPE(**build)(*call)


def formed(rope, start, length, dtype):
    """The rotations of positions ``start .. start + length - 1`` formed from their angles."""
    return rope.rotations(torch.arange(start, start + length), dtype)


RUNS = [
    (0, 1),
    (5, 7),
    (0, TABLE_POSITIONS),
    (TABLE_POSITIONS - 1, 1),
    (TABLE_POSITIONS - 1, 2),  # leaves the first table: a new one from its start
    (10**6, 3),  # beyond any table so far
    (3, TABLE_POSITIONS + 1),  # longer than a table: formed as it comes
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim, interpolation", [(2, 1.0), (8, 4.0), (64, 1.0)])
def test_rope_rotations_of_a_run_equal_the_formed_ones(dtype, head_dim, interpolation):
    rope = RoPE(head_dim, interpolation=interpolation)
    for start, length in RUNS:
        read = rope.rotations_of_run(start, length, dtype, torch.device("cpu"))
        for got, expected in zip(read, formed(rope, start, length, dtype)):
            assert got.dtype == dtype and torch.equal(got, expected), (start, length)


def test_rope_table_is_made_again_only_when_a_run_leaves_it():
    """Decode steps read views of one table until a run leaves it; the next starts at that run."""
    rope, cpu = RoPE(8), torch.device("cpu")
    cos, _ = rope.rotations_of_run(100, 1, torch.float32, cpu)
    [table] = rope._tables.values()
    assert table.start == 100 and table.cos.shape == (TABLE_POSITIONS, 8)
    for position in (101, 500, 100 + TABLE_POSITIONS - 1):
        cos, _ = rope.rotations_of_run(position, 1, torch.float32, cpu)
        assert cos.untyped_storage().data_ptr() == table.cos.untyped_storage().data_ptr()  # no copy
        assert rope._tables[(torch.float32, cpu)] is table
    rope.rotations_of_run(100 + TABLE_POSITIONS, 1, torch.float32, cpu)
    assert rope._tables[(torch.float32, cpu)].start == 100 + TABLE_POSITIONS
    rope.rotations_of_run(0, 4, torch.float32, cpu)  # back to the start (a new prompt)
    assert rope._tables[(torch.float32, cpu)].start == 0
    rope.rotations_of_run(0, TABLE_POSITIONS + 1, torch.float32, cpu)  # too long: no table made
    assert rope._tables[(torch.float32, cpu)].start == 0


def test_rope_keeps_a_table_per_dtype_and_device():
    rope = RoPE(8)
    for dtype, device in [(torch.float32, "cpu"), (torch.float64, "cpu"), (torch.float32, "meta")]:
        cos, signed_sin = rope.rotations_of_run(7, 3, dtype, torch.device(device))
        assert (cos.dtype, cos.device.type, signed_sin.device.type) == (dtype, device, device)
    assert set(rope._tables) == {
        (torch.float32, torch.device("cpu")),
        (torch.float64, torch.device("cpu")),
        (torch.float32, torch.device("meta")),
    }


def test_rope_table_made_under_inference_mode_serves_a_backward():
    """An inference tensor could not be saved for a backward: the table is made outside that mode."""
    rope = RoPE(8)
    with torch.inference_mode():
        rope.rotations_of_run(0, 4, torch.float64, torch.device("cpu"))
    x = randn(1, 2, 4, 8).requires_grad_()
    rope.rotate(x, rope.rotations_of_run(0, 4, torch.float64, torch.device("cpu"))).sum().backward()
    expected = x.detach().requires_grad_()
    rope(expected, torch.arange(4)).sum().backward()
    assert torch.equal(x.grad, expected.grad)


def test_rope_forms_a_runs_rotations_while_compiling(monkeypatch):
    """A traced graph keeps no table (state written while tracing would not be replayed)."""
    rope = RoPE(8)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for got, expected in zip(
        rope.rotations_of_run(3, 5, torch.float32, torch.device("cpu")), formed(rope, 3, 5, torch.float32)
    ):
        assert torch.equal(got, expected)
    assert not rope._tables


def test_sinusoidal_hand_computed():
    """d = 4, base = 10^4: ``[sin p, cos p, sin(p / 100), cos(p / 100)]``."""
    positions = torch.tensor([0, 1, 7])
    pe = Sinusoidal(4)(positions, dtype=torch.float64)
    expected = [[math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)] for p in (0, 1, 7)]
    torch.testing.assert_close(pe, torch.tensor(expected, dtype=torch.float64))


def test_sinusoidal_matches_vaswani_formula():
    d, base = 10, 500.0
    pe = Sinusoidal(d, base)(torch.tensor([[3, 40, 1000]]), dtype=torch.float64)
    assert pe.shape == (1, 3, d)
    for row, p in enumerate((3, 40, 1000)):
        for i in range(d // 2):
            angle = p / base ** (2 * i / d)
            assert pe[0, row, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[0, row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_sinusoidal_dtype_defaults_to_torch_default():
    pe = Sinusoidal(6)(torch.arange(4))
    assert pe.dtype == torch.get_default_dtype() and pe.shape == (4, 6)
    assert Sinusoidal(6)(torch.arange(4), dtype=torch.bfloat16).dtype == torch.bfloat16


def test_sinusoidal_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="d_model must be even"):
        Sinusoidal(5)
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        Sinusoidal(4)(torch.arange(3.0))
