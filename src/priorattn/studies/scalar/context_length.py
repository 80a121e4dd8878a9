"""Seed 002 experiment 4: inference approximation error against context length at a fixed window.

"For a trained hybrid model, sweep context length from 128 to 4096 and measure the fraction of
combined attention mass captured by top-k scalar neighbors at fixed k ... does error grow with
context length, or does the regularizer keep the window effectively constant?"

The model is trained at its short length and evaluated on longer validation windows. At each
length, the last ``queries`` positions of every window are decoded as a generation would decode
them: a :class:`~priorattn.scalar.SortedScalarCache` holds the window's tokens up to the query
(every head sorting by its own scalar key, the buffer merged at each token so the window is exactly
the ``k`` nearest keys), and :meth:`~priorattn.scalar.SortedScalarCache.decode` attends over ``k``
of them. Against exact attention (the dense definition in float64) this measures, per layer, head
and query:

- ``missed``: the exact attention mass outside the window (1 - the mass on the ``k`` nearest keys);
- ``output_error``: ``|o_window - o_exact| / |o_exact|``;
- ``bound``: the cache's own upper bound on ``missed`` (what a decoder knows without the exact mass);
- ``bandwidth_keys``: how many keys lie within one bandwidth ``sqrt(tau)`` of the query, the density
  that decides how much of the mass a fixed window can hold (docs/scalar_decoding.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ...figures import RunScale, captioned_figure, save, seed_expectation
from ...scalar.sorted_cache import SortedScalarCache
from . import regularizer_ablation
from .alignment import HYBRID
from .capture import ScalarLayerCapture, capture_scalar_layers, nearest_mass
from .common import Settings, load_run, summary, train_variant, validation_windows

LENGTHS = (128, 256, 512, 1024, 2048, 4096)
#: Decoded positions at the end of each window, and windows per length.
QUERIES, WINDOWS = 16, 2
#: Window sizes k (keys read per head and step).
KS = (8, 32)
#: Values below this are drawn at it on the log scales.
ERROR_FLOOR = 1e-12


@torch.no_grad()
def decode_errors(capture: ScalarLayerCapture, queries: int, ks: Sequence[int] = KS) -> dict[str, Tensor]:
    """Decode the last ``queries`` positions of each window of ``capture`` from a sorted cache with
    a window of each ``k`` in ``ks``: ``{"missed", "output_error", "bound": (len(ks), B, H, Q),
    "bandwidth_keys": (B, H, Q)}`` in float64."""
    layer, L = capture.layer, capture.length
    if layer.sink_value is not None or layer.prior is not None or layer.window is not None:
        raise ValueError(
            "the sorted cache decodes scalar heads without a sink, prior or window: evaluate a model "
            "trained without them"
        )
    if not 1 <= queries <= L:
        raise ValueError(f"queries must be in [1, {L}] (positions of the window), got {queries}")
    rows = torch.arange(L - queries, L)
    weights, _ = capture.weights(rows)  # (B, H, Q, L)
    distances = capture.distances(rows)
    exact = capture.output(weights, None)  # (B, H, Q, D)
    tau = capture.tau[..., rows].double()
    # 1 - mass, clamped at 0: a window holding all of it leaves a rounding error of either sign
    missed = torch.stack([(1 - nearest_mass(weights, distances, k)).clamp(min=0) for k in ks])
    bandwidth_keys = (distances < tau.sqrt()[..., None]).sum(-1).double()
    errors = torch.zeros(len(ks), *exact.shape[:3], dtype=torch.float64)
    bounds = torch.zeros_like(errors)
    hybrid = capture.q is not None
    for b in range(capture.q_s.shape[0]):
        cache = empty_cache(capture)
        append_tokens(cache, capture, b, slice(0, L - queries))
        for r, t in enumerate(rows.tolist()):
            append_tokens(cache, capture, b, slice(t, t + 1))
            q_vec = capture.q[b, :, t] if hybrid else None
            for i, k in enumerate(ks):
                step = cache.decode(capture.q_s[b, :, t].contiguous(), capture.tau[b, :, t], k, q_vec=q_vec)
                errors[i, b, :, r] = (step.output - exact[b, :, r]).norm(dim=-1) / exact[b, :, r].norm(dim=-1)
                bounds[i, b, :, r] = step.mass_outside_bound
    return dict(missed=missed, output_error=errors, bound=bounds, bandwidth_keys=bandwidth_keys)


def empty_cache(capture: ScalarLayerCapture) -> SortedScalarCache:
    """A float64 sorted cache for the layer's heads, every head sorting by its own key, that merges
    each token at once: the window is then exactly the ``k`` nearest keys."""
    G, D = capture.v.shape[1], capture.v.shape[-1]
    vector_key_dim = None if capture.k is None else capture.k.shape[-1]
    return SortedScalarCache(
        capture.layer.num_heads, G, D, vector_key_dim=vector_key_dim, buffer_size=1, dtype=torch.float64
    )


def append_tokens(cache: SortedScalarCache, capture: ScalarLayerCapture, b: int, tokens: slice) -> None:
    """Add the ``tokens`` of window ``b`` of ``capture`` to ``cache``."""
    k_vec = None if capture.k is None else capture.k[b, :, tokens].transpose(0, 1)
    cache.append(capture.k_s[b, :, tokens].T, capture.v[b, :, tokens].transpose(0, 1), k_vec)


def summarize(values: Tensor) -> dict[str, float]:
    flat = values.flatten().double()
    return dict(mean=float(flat.mean()), median=float(flat.median()), max=float(flat.max()))


@torch.no_grad()
def length_sweep(
    model,
    windows_at: Callable[[int], Tensor],
    *,
    lengths: Sequence[int] = LENGTHS,
    ks: Sequence[int] = KS,
    queries: int = QUERIES,
    progress: bool = True,
) -> list[dict]:
    """:func:`decode_errors` of every scalar layer of ``model`` on the windows ``windows_at(length)``
    (tokens ``(B, length)``) of each length; one record per length: ``{"length", "k": {k: {measure:
    {"mean", "median", "max"}}}, "bandwidth_keys": {...}, "layers": [per-layer means]}``."""
    records = []
    for length in tqdm(lengths, disable=not progress, unit="length", desc="context lengths"):
        captures = capture_scalar_layers(model, windows_at(length))
        per_layer = [decode_errors(c, min(queries, length), ks) for c in captures]
        record = dict(length=length, k={}, layers=[])
        for i, k in enumerate(ks):
            record["k"][str(k)] = {
                measure: summarize(torch.stack([layer[measure][i] for layer in per_layer]))
                for measure in ("missed", "output_error", "bound")
            }
        record["bandwidth_keys"] = summarize(torch.stack([layer["bandwidth_keys"] for layer in per_layer]))
        for layer in per_layer:
            record["layers"].append(
                {
                    f"{m}@{k}": float(layer[m][i].mean())
                    for m in ("missed", "output_error")
                    for i, k in enumerate(ks)
                }
                | dict(bandwidth_keys=float(layer["bandwidth_keys"].mean()))
            )
        records.append(record)
    return records


#: The window stays "effectively constant" (seed 002) while the mass it misses grows at most this
#: many times from the training length to the longest context.
FLAT_GROWTH = 2.0


def expectation(records: list[dict], run: RunScale) -> str:
    """Seed 002 experiment 4's hypothesis, judged on the regularized hybrid's :func:`length_sweep`
    ``records``: with the regularizers the window stays effectively constant, the mass a window of
    the largest k misses growing at most :data:`FLAT_GROWTH` times from the first length to the
    last."""
    k = records[0]["k"]
    largest = max(k, key=int)
    first, last = (r["k"][largest]["missed"]["mean"] for r in (records[0], records[-1]))
    measured = (
        f"with all three regularizers a window of k = {largest} misses {first:.3g} of the mass at "
        f"{records[0]['length']} tokens and {last:.3g} at {records[-1]['length']}"
    )
    return seed_expectation(
        "Seed 002 hypothesizes that the regularizers keep the window effectively constant: flat "
        f"lines, a fixed k suffices at any length (here: the missed mass grows at most "
        f"{FLAT_GROWTH:g}-fold).",
        last <= FLAT_GROWTH * first,
        measured,
        run,
    )


def plot_context_length(sweeps: dict[str, list[dict]], out: Path, expectation: str, *, run: RunScale) -> Path:
    """``context_length.png``: mass missed, output error and keys per bandwidth against length, one
    line per model and window size (``sweeps``: model name -> :func:`length_sweep` records); the
    caption ends with ``expectation``."""
    caption = (
        "Each model was trained at its short training length and is evaluated here on longer "
        "validation windows. At every length the last positions of each window are decoded from a "
        "sorted scalar-key cache that reads only the k keys nearest the query's scalar (seed 002 "
        "'Binary Search at Inference'), and compared with exact attention over every key, for every "
        "scalar layer and head. Left: the exact attention mass outside the window (mean over layers, "
        "heads and queries; results.json also holds the median and the largest). Middle: the relative "
        "error of the attention output, same mean. Right: how many keys lie within one bandwidth "
        "sqrt(tau) of the query: when it grows with the context, a fixed window holds less of the "
        "mass.\n\n"
        "Flat lines mean a fixed k suffices at any length; rising lines mean k must grow with the "
        f"context. Values below {ERROR_FLOOR:g} are drawn at it. {expectation}"
    )
    fig, panel = captioned_figure((16, 5.2), caption, run=run)
    ax_missed, ax_error, ax_keys = panel.subplots(1, 3)
    for c, (name, records) in enumerate(sweeps.items()):
        lengths = [r["length"] for r in records]
        for s, k in enumerate(records[0]["k"]):
            style = dict(
                color=f"C{c}", ls=("-", "--", ":", "-.")[s % 4], marker="o", label=f"{name}, k = {k}"
            )
            for ax, measure in ((ax_missed, "missed"), (ax_error, "output_error")):
                ax.plot(lengths, [max(r["k"][k][measure]["mean"], ERROR_FLOOR) for r in records], **style)
        ax_keys.plot(
            lengths, [r["bandwidth_keys"]["mean"] for r in records], color=f"C{c}", marker="o", label=name
        )
    titles = (
        (ax_missed, "attention mass outside the window", "Mass a window of k keys misses"),
        (ax_error, "relative output error |o_k - o| / |o|", "Output error of the windowed decode"),
        (ax_keys, "keys within one bandwidth of the query", "Key density around the query"),
    )
    for ax, label, title in titles:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(label)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    ax_missed.legend(fontsize=8)
    ax_keys.legend(fontsize=8)
    panel.suptitle(
        "Does a fixed window still hold the attention as the context grows? (seed 002 experiment 4)"
    )
    return save(fig, out / "context_length.png")


def run(settings: Settings, out: Path, *, progress: bool = True, log=print) -> dict:
    """Train the hybrid without and with all three regularizers (experiment 3's "all") at the training
    length; sweep lengths from it to 32 times it (128 to 4096 at budget 1)."""
    lengths = [settings.seq_len * 2**i for i in range(6)]
    variants, sweeps = {}, {}
    regularized = next(v for v in regularizer_ablation.variants(settings) if v.name == "all")
    for variant in (HYBRID, replace(regularized, label="hybrid + L_align + L_spread + L_tau")):
        trained = train_variant(variant, settings, out, progress=progress, log=log)
        model_run = load_run(trained.run_dir)

        def windows_at(length: int, model_run=model_run, run_dir=trained.run_dir) -> Tensor:
            return validation_windows(model_run, run_dir, length, WINDOWS, settings.seed)

        log(f"{variant.label}: decoding at lengths {lengths}")
        records = length_sweep(model_run.model, windows_at, lengths=lengths, progress=progress)
        variants[variant.name] = summary(variant, trained) | dict(lengths=records)
        sweeps[variant.label] = records
    judged = expectation(variants[regularized.name]["lengths"], settings.scale)
    figure = plot_context_length(sweeps, out, judged, run=settings.scale)
    return dict(variants=variants, ks=list(KS), queries=QUERIES, windows=WINDOWS, figures=[figure.name])
