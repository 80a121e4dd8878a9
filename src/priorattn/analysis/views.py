"""Views of a trained run (``priorattn analyze priors / sink-mass / attention``): the numbers behind
each figure, written to ``results.json`` next to its PNGs.

- :func:`analyze_priors`: the learned priors of each layer and head: their curves (seed 003 Figs. 1
  and 4, with BAM's learned shape beta), their heatmaps before and after the causal mask (seed 000
  Fig. 3b) and GOAT's sink ``u(j)`` far past the training length (seed 000 Fig. 2b).
- :func:`analyze_sink_mass`: the attention mass on key 0 as the content's dynamic range ``omega``
  grows (seed 000 Fig. 2c, Thm. 5.1), one curve per run; the protocol is :func:`sink_mass`'s.
- :func:`analyze_attention`: one head's attention weights on a prompt (seed 003 Fig. 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..eot.measures import content_range
from ..files import prepare_out, write_json_atomic
from ..priors import GGD, GOAT, ALiBi, Prior, Uniform
from ..scalar.model import prior_heads
from ..train import load_run
from ..train.runs import run_label
from . import learned_plots, plots
from .trained import attention_weights, layer_prior, pick_indices, runs_in

RESULTS_JSON = "results.json"
#: Content dynamic ranges of :func:`sink_mass` by default: 0 (the prior alone) to 64.
OMEGAS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def head_parameters(prior: Prior, head: int) -> dict[str, float | None]:
    """The learned parameters of head ``head`` of ``prior`` (of each part of a sum), by name."""
    params = {}
    for part in prior.modules():  # the prior itself, or each part of a sum
        if isinstance(part, GGD):  # seed 003 App. C
            beta, theta_alpha = part.theta_beta[head].item(), part.theta_alpha[head].item()
            params["ggd_shape_beta"] = beta
            log_width = -theta_alpha / beta if beta else math.inf  # alpha = exp(-theta_alpha / beta)
            params["ggd_width_tokens"] = math.exp(log_width) if log_width < 700 else None  # beyond float

            params["ggd_centre_tokens"] = 2 * math.sinh(part.theta_mu[head].item())
        elif isinstance(part, ALiBi):
            params["alibi_slope"] = part.slopes[head].item()
        elif isinstance(part, GOAT):
            if part.fold_slope() is not None:
                params["goat_recency_slope"] = part.fold_slope()[head].item()
            if part.sink is not None:
                u = part.sink(torch.arange(2))[head]
                params["goat_sink_spike"] = (u[0] - u[1]).item()  # u(0) - u(1): only differences matter
    return params


def head_label(head: int, params: dict[str, float | None]) -> str:
    """``params`` of :func:`head_parameters` in legend words: ``"head 0: BAM shape beta 0.93, ..."``."""
    words = []
    if "ggd_shape_beta" in params:
        width = params["ggd_width_tokens"]
        width = "unbounded" if width is None else f"{width:.3g} tokens"
        words.append(
            f"BAM shape beta {params['ggd_shape_beta']:.3g}, width {width}, "
            f"centre {params['ggd_centre_tokens']:.3g}"
        )
    if "alibi_slope" in params:
        words.append(f"ALiBi slope {params['alibi_slope']:.3g}")
    if "goat_recency_slope" in params:
        words.append(f"GOAT recency slope {params['goat_recency_slope']:.3g}")
    if "goat_sink_spike" in params:
        words.append(f"sink u(0) - u(1) = {params['goat_sink_spike']:.3g}")
    return f"head {head}: " + ("; ".join(words) if words else "no learned parameters")


def goat_with_sink(prior: Prior) -> GOAT | None:
    """The GOAT inside ``prior`` (itself or a part of a sum) if it has a sink."""
    return next((m for m in prior.modules() if isinstance(m, GOAT) and m.sink is not None), None)


@torch.no_grad()
def analyze_priors(
    run_dir: str | Path,
    out: str | Path,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    length: int | None = None,
    extrapolate: int = 16,
) -> dict:
    """The learned priors of ``run_dir``'s ``layers`` and ``heads`` (all by default) over ``length``
    positions (the training length), GOAT's sink up to ``extrapolate`` times the training length;
    writes ``prior_curves.png``, ``prior_heatmaps.png``, ``sink.png`` (GOAT) and ``results.json``."""
    if extrapolate < 1:
        raise ValueError(f"extrapolate must be >= 1, got {extrapolate}")
    run = load_run(run_dir)
    config = run.model_config
    layers = pick_indices("layer", layers, config.n_layers, "layers")
    heads = pick_indices("head", heads, prior_heads(config), "heads")
    length = config.seq_len if length is None else length
    if length < 2:
        raise ValueError(f"length must be >= 2 to have a relative position, got {length}")
    model = run.model.double()
    priors = {layer: layer_prior(model, layer) for layer in layers}
    if all(isinstance(prior, Uniform) for prior in priors.values()):
        raise ValueError(
            f"{run_dir} has no prior to draw (prior={config.prior!r}): its attention is standard"
        )
    positions = learned_plots.sink_positions(extrapolate * config.seq_len)
    results, curves, rows, sinks, decompositions = [], [], [], [], []
    for layer, prior in priors.items():
        params = {head: head_parameters(prior, head) for head in heads}
        labels = [head_label(head, params[head]) for head in heads]
        entry = dict(layer=layer, heads=[dict(head=head, **params[head]) for head in heads])
        curves.append((f"layer {layer}", [(label, prior, head) for label, head in zip(labels, heads)]))
        rows += [(f"layer {layer}, head {head}", prior, head) for head in heads]
        goat = goat_with_sink(prior)
        if goat is not None:
            u = learned_plots.sink_values(goat, torch.from_numpy(positions))[heads]  # (heads, N)
            sinks.append((f"layer {layer}", u, labels))
            entry["sink"] = u.tolist()
        if isinstance(prior, GOAT):  # a sum's parts do not split into one sink and one relative part
            components = [
                plots.identified_goat_components(*plots.goat_components(prior, length, h)) for h in heads
            ]
            decompositions += [(layer, head, parts) for head, parts in zip(heads, components)]
            entry["identified_sink"] = [parts[0].tolist() for parts in components]
        results.append(entry)
    out = prepare_out(out)
    figures = [
        learned_plots.plot_learned_curves(out, curves, length),
        learned_plots.plot_mask_renormalization(out, rows, length),
    ]
    figures += [draw_learned_decomposition(out, layer, head, parts) for layer, head, parts in decompositions]
    if sinks:
        figures.append(learned_plots.plot_learned_sink(out, sinks, positions, config.seq_len))
    result = dict(
        run=str(run_dir),
        step=run.step,
        prior=config.prior,
        train_len=config.seq_len,
        length=length,
        layers=results,
        figures=[path.name for path in figures],
    )
    if sinks:
        result["sink_positions"] = positions.tolist()
    write_json_atomic(out / RESULTS_JSON, result)
    return result


def draw_learned_decomposition(out: Path, layer: int, head: int, components) -> Path:
    """``goat_decomposition_layer{layer}_head{head}.png``: seed 000 Fig. 1 of one learned GOAT head."""
    caption = (
        "One GOAT head of the trained run over the training length. Heatmaps have one row per query "
        "position i and one column per key position j; the blank upper triangle holds keys after the "
        "query, which causal attention never sees. A sink u(j) and a relative part kappa(i - j) are "
        "defined only up to a straight line: a sink u(j) = a j is the same prior as a recency term "
        "-a (i - j) plus a row constant. So the line that best fits u over these positions is moved "
        "into the relative part before drawing: (a) is the sink without its straight-line part, (b) "
        "the relative part with it, (c) their sum with each row shifted to mean 0, (d) the attention "
        "the prior alone gives.\n\n"
        "Look for: a spike of (a) at key 0 (an attention sink, seed 000 Fig. 2b) and where (b) is "
        "largest: along the diagonal for recency, at a fixed distance for a head that copies from "
        "there. Black in (d): weight below 1e-8."
    )
    title = f"What a learned GOAT prior is made of (layer {layer}, head {head}, L = {len(components[0])})"
    return plots.draw_goat_decomposition(
        out / f"goat_decomposition_layer{layer}_head{head}.png", components, title, caption
    )


@torch.no_grad()
def sink_mass(prior: Prior, length: int, omegas: Sequence[float], samples: int, seed: int = 0) -> Tensor:
    """Mean attention mass on key 0, ``(H, len(omegas))``, of ``softmax_j(omega z_ij + K_h(i, j))``
    over the keys ``j <= i``, averaged over the queries ``i = 1 .. length - 1`` and ``samples`` draws.

    The protocol (seed 000 Thm. 5.1 fixes a query's content dynamic range
    ``omega_i = max_k s_ik - min_k s_ik``): the content scores ``z_ij`` of a query are i.i.d. standard
    normal draws, rescaled to ``[0, 1]`` over the query's visible keys, so that ``omega z`` has
    dynamic range exactly ``omega`` on every row. Query 0 sees only key 0 and is left out. The same
    draws (``seed``) serve every ``omega`` and every prior, so curves differ only by their priors.
    At ``omega = 0`` the mass is the prior's own, ``pi_i0``; Thm. 5.1 keeps it within
    ``pi_i0 exp(+-omega)``.
    """
    pos = torch.arange(length)
    K = prior.log_prior(pos, pos).double()  # (H or 1, L, L)
    visible = torch.ones(length, length, dtype=torch.bool).tril()
    generator = torch.Generator().manual_seed(seed)
    mass = torch.zeros(K.shape[0], len(omegas), dtype=torch.float64)
    for _ in range(samples):
        z = torch.randn(length, length, generator=generator, dtype=torch.float64)
        low = z.masked_fill(~visible, math.inf).amin(-1, keepdim=True)
        spread = content_range(z, visible)[:, None].clamp_min(1e-300)  # query 0: one key, range 0
        unit = (z - low) / spread  # each row's visible keys span [0, 1]
        for n, omega in enumerate(omegas):
            p = plots.causal_prior_probs(K + omega * unit)  # (H, L, L)
            mass[:, n] += p[:, 1:, 0].mean(-1)
    return mass / samples


def uniform_share(length: int) -> float:
    """Key 0's mean weight over the queries ``i = 1 .. length - 1`` when every visible key is alike:
    ``1 / (i + 1)`` each, the limit of :func:`sink_mass` as ``omega`` grows (exchangeable content)."""
    return sum(1 / (i + 1) for i in range(1, length)) / (length - 1)


def run_sink_mass(
    run_dir: Path, length: int | None, omegas: Sequence[float], samples: int, seed: int
) -> dict:
    """:func:`sink_mass` of every layer and head of one run: ``mass[layer][head][omega]``."""
    run = load_run(run_dir)
    config = run.model_config
    length = config.seq_len if length is None else length
    model = run.model.double()
    layers = [
        sink_mass(layer_prior(model, layer), length, omegas, samples, seed)
        for layer in range(config.n_layers)
    ]
    masses = torch.stack([m.expand(prior_heads(config), -1) for m in layers])  # (layers, heads, omegas)
    flat = masses.flatten(0, 1)
    return dict(
        run=str(run_dir),
        label=run_label(Path(run_dir)),
        prior=config.prior,
        step=run.step,
        length=length,
        uniform_share=uniform_share(length),
        mean=flat.mean(0).tolist(),
        lowest=flat.amin(0).tolist(),
        highest=flat.amax(0).tolist(),
        mass=masses.tolist(),
    )


def analyze_sink_mass(
    runs: Sequence[str | Path],
    out: str | Path,
    *,
    length: int | None = None,
    omegas: Sequence[float] = OMEGAS,
    samples: int = 8,
    seed: int = 0,
) -> dict:
    """:func:`sink_mass` of each run (a run directory, or a compare output: each of its models) at
    ``length`` (each run's training length); writes ``sink_mass.png`` and ``results.json``."""
    omegas = sorted(float(o) for o in omegas)
    if not omegas or omegas[0] < 0 or not math.isfinite(omegas[-1]):
        raise ValueError(f"omegas must be finite numbers >= 0, got {omegas}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if length is not None and length < 2:
        raise ValueError(f"length must be >= 2: query 0 sees only key 0, got {length}")
    run_dirs = [run for path in runs for run in runs_in(path)]
    results = [run_sink_mass(run, length, omegas, samples, seed) for run in run_dirs]
    out = prepare_out(out)
    curves = [(r["label"], *(np.array(r[k]) for k in ("mean", "lowest", "highest"))) for r in results]
    shares = {r["length"]: r["uniform_share"] for r in results}
    figure = learned_plots.plot_sink_mass(out, np.array(omegas), curves, shares)
    result = dict(
        protocol=sink_mass.__doc__.split("\n\n")[1].strip(),
        omegas=omegas,
        samples=samples,
        seed=seed,
        runs=results,
        figures=[figure.name],
    )
    write_json_atomic(out / RESULTS_JSON, result)
    return result


@torch.no_grad()
def analyze_attention(run_dir: str | Path, out: str | Path, *, prompt: str, layer: int, head: int) -> dict:
    """Head ``head`` of layer ``layer``'s attention weights on ``prompt`` (float64, the reference
    route); writes ``attention.png`` and ``results.json`` (the weights, the tokens, the head's prior)."""
    run = load_run(run_dir)
    config = run.model_config
    (layer,) = pick_indices("layer", [layer], config.n_layers, "layers")
    (head,) = pick_indices("head", [head], config.n_heads, "heads")
    ids = run.tokenizer.encode(prompt)
    if not ids:
        raise ValueError("prompt is empty: give at least one character")
    out = prepare_out(out)
    model = run.model.double()
    weights = attention_weights(model, torch.tensor([ids]))[layer][0, head]  # (L, L)
    pieces = [run.tokenizer.decode([i]) for i in ids]
    params = head_parameters(layer_prior(model, layer), head)
    note = f"This head's prior ({run_label(Path(run_dir))}): {head_label(head, params)}."
    title = f"Attention of layer {layer}, head {head} on a {len(ids)}-token prompt"
    figure = learned_plots.plot_attention_map(out, weights.numpy(), pieces, title, note)
    result = dict(
        run=str(run_dir),
        step=run.step,
        layer=layer,
        head=head,
        prior=config.prior,
        prior_parameters=params,
        tokens=ids,
        pieces=pieces,
        weights=weights.tolist(),
        figures=[figure.name],
    )
    write_json_atomic(out / RESULTS_JSON, result)
    return result
