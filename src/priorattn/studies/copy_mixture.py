"""Seed 000 Fig. 1: train a small causal model with a GOAT prior on the copy-mixture task and read
off what its prior learned.

Each token copies the first token, copies the previous token, or is noise
(:mod:`priorattn.data.copy_mixture`). Seed 000 Sec. 6 ("Ablating the prior") expects GOAT's sink
``u(j)`` to peak at the first token and its relative part ``kappa(i - j)`` at the previous one.

Two models, both one GOAT attention layer with no other position signal:

- ``"probe"`` (default): token embedding, one causal attention layer whose query is a learned
  vector shared by every position, and a linear read-out; no residual stream, no MLP. A query holds
  no token, so it can find the first and the previous token only through the prior: the prior is
  the whole positional mechanism, which is what the figure is meant to show.
- ``"gpt"``: the library's :class:`~priorattn.models.GPT` with one block. Its query at position
  ``i`` holds token ``i``, which is exactly the token a "previous" copy repeats next, and the
  residual stream carries it to the output without attention: GPT learns the sink, but nothing
  forces a local relative part (docs/copy_mixture.md has the measured runs).

Lags: the query at position ``i`` predicts token ``i + 1``, and seed 000 counts "the previous token
``j = i - 1``" from the predicted token, so ``relative_argmax_lag`` is ``(i + 1) - j >= 1``: lag 1 is
the key ``j = i``, the query's own token. A token is never visible to its own prediction, so there
is no lag 0 in that count.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.plots import (
    causal_prior_probs,
    draw_goat_decomposition,
    goat_components,
    identified_goat_components,
)
from ..checks import check_int
from ..data.copy_mixture import CopyMixture, CopyMixtureBatches
from ..figures import RunScale, seed_expectation
from ..files import prepare_out, write_json_atomic
from ..functional import attention
from ..models import GPT, GPTConfig
from ..models.gpt import token_cross_entropy
from ..priors import GOAT
from ..train.config import TrainConfig
from ..train.distributed import Process
from ..train.loop import train_step
from ..train.optim import build_optimizer, build_scheduler

MODELS = ("probe", "gpt")
RESULTS_JSON = "results.json"
FIGURE = "copy_mixture_prior.png"
#: The default training steps: fewer make a smoke run.
STEPS = 600
LAG_CONVENTION = (
    "lags count from the predicted token, (i + 1) - j: lag 1 is key j = i, the query's own token, "
    "which token i + 1 repeats when it copies the previous token (seed 000's j = i - 1)"
)


@dataclass
class CopyMixtureConfig:
    """The task, the model and its training; the defaults train the probe in about half a minute on
    one CPU thread.

    - ``vocab_size``, ``length``: the task's tokens, and tokens per sequence.
    - ``weights``: the probabilities of copying the first token, copying the previous token, noise.
    - ``model``: ``"probe"``, an attention layer with a position-free query, or ``"gpt"``, the
      library's GPT with one block (``MODELS``).
    - ``d_model``, ``heads``: the model's width and heads.
    - ``goat_freqs``: the GOAT prior's frequencies.
    - ``steps``, ``batch_size``: optimizer steps, and sequences per step.
    - ``lr``: the learning rate of the content.
    - ``prior_lr``: the learning rate of the prior, higher than ``lr``: the sink starts flat
      (GOAT's uniform init) and its MLP learns a spike at ``j = 0`` slowly at the content's rate.
    - ``eval_sequences``: the sequences of the evaluation loss.
    - ``seed``: the seed of the weights and the sequences.
    """

    vocab_size: int = 16
    weights: tuple[float, float, float] = (0.3, 0.4, 0.3)
    length: int = 64
    model: str = "probe"
    d_model: int = 32
    heads: int = 1
    goat_freqs: int = 8
    steps: int = STEPS
    batch_size: int = 32
    lr: float = 3e-3
    prior_lr: float = 3e-2
    eval_sequences: int = 256
    seed: int = 0

    def __post_init__(self):
        self.weights = CopyMixture(self.vocab_size, self.weights).weights  # checks both
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        for name in ("d_model", "heads", "steps", "batch_size", "eval_sequences"):
            check_int(name, getattr(self, name), low=1)
        check_int("length", self.length, low=2)  # a previous token to copy
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by heads={self.heads}")

    @property
    def scale(self) -> RunScale:
        """The steps that ``results.json`` and the figure state; below :data:`STEPS` a smoke run."""
        return RunScale(self.steps, STEPS)

    def train_config(self) -> TrainConfig:
        # "window" positions: every row is one sequence from position 0, and the probe is not a GPT
        return TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            prior_lr=self.prior_lr,
            warmup_steps=self.steps // 10,
            seed=self.seed,
            positions="window",
        )


class FixedQueryLM(nn.Module):
    """``tokens (B, L) -> logits (B, L, V)`` through one causal GOAT attention layer whose query is a
    learned vector per head, the same at every position: the attention of query ``i`` over keys
    ``j <= i`` is ``softmax_j(<q, k_j> / sqrt(D) + K(i, j))``, so what depends on ``i`` is the prior.
    """

    def __init__(self, vocab_size: int, d_model: int, heads: int, prior: GOAT):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab_size, d_model)
        self.query = nn.Parameter(torch.randn(heads, 1, d_model // heads) * 0.02)  # (H, 1, D)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.prior = prior
        self.head = nn.Linear(d_model, vocab_size)

    def forward(
        self, tokens: Tensor, *, positions: Tensor | None = None, doc_ids: Tensor | None = None
    ) -> tuple[Tensor, None, None]:
        """``(logits, None, None)``, as :class:`GPT` returns ``(logits, loss, caches)`` to
        ``train_step``; ``positions`` and ``doc_ids`` as :func:`~priorattn.attention` takes them."""
        B, L = tokens.shape
        x = self.embed(tokens)  # (B, L, d_model)
        k = self.k_proj(x).view(B, L, self.heads, -1).transpose(1, 2)  # (B, H, L, D)
        v = self.v_proj(x).view(B, L, self.heads, -1).transpose(1, 2)  # (B, H, L, D)
        q = self.query.expand(B, -1, L, -1)  # (B, H, L, D)
        y = attention(q, k, v, prior=self.prior, q_pos=positions, k_pos=positions, doc_ids=doc_ids)
        return self.head(y.transpose(1, 2).reshape(B, L, -1)), None, None


def build_model(config: CopyMixtureConfig) -> nn.Module:
    if config.model == "gpt":
        return GPT(
            GPTConfig(
                vocab_size=config.vocab_size,
                seq_len=config.length,
                d_model=config.d_model,
                n_layers=1,
                n_heads=config.heads,
                # seed 000 Fig. 1 has a sink and a relative part only
                prior=dict(name="goat", num_freqs=config.goat_freqs, slope="none"),
            )
        )
    prior = GOAT(config.heads, config.goat_freqs, slope="none", train_len=config.length)
    return FixedQueryLM(config.vocab_size, config.d_model, config.heads, prior)


def goat_layers(model: nn.Module) -> list[GOAT]:
    """The GOAT prior of each attention layer, in order."""
    return [m for m in model.modules() if isinstance(m, GOAT)]


def train_copy_mixture(config: CopyMixtureConfig, progress: bool = True) -> tuple[nn.Module, list[float]]:
    """The trained model and its loss at every step (nats per token), with the library's
    :func:`~priorattn.train.loop.train_step`, optimizer groups and schedule."""
    task = CopyMixture(config.vocab_size, config.weights)
    batches = CopyMixtureBatches(task, config.batch_size, config.length, config.seed)
    train_config = config.train_config()
    torch.manual_seed(config.seed)
    model = build_model(config)
    optimizer = build_optimizer(model, train_config)
    scheduler = build_scheduler(optimizer, train_config)
    losses = []
    for step in tqdm(range(config.steps), disable=not progress, unit="step"):
        loss, _ = train_step(
            model, [batches.batch(step)], optimizer, train_config, Process(), scheduler=scheduler
        )
        losses.append(loss)
    return model, losses


@torch.no_grad()
def eval_losses(model: nn.Module, config: CopyMixtureConfig) -> dict:
    """The model's loss on ``eval_sequences`` fresh sequences, with the best possible loss there
    (the task's own next-token law) and the loss of guessing uniformly."""
    task = CopyMixture(config.vocab_size, config.weights)
    generator = torch.Generator().manual_seed(config.seed)  # not a training stream (those hash the step)
    sequences, _ = task.sample(config.eval_sequences, config.length + 1, generator)
    tokens, targets = sequences[:, :-1], sequences[:, 1:]
    model.eval()
    logits, _, _ = model(tokens)
    model.train()
    return dict(
        eval_loss=float(token_cross_entropy(logits, targets).mean()),
        optimal_loss=float(task.optimal_nll(tokens, targets).mean()),
        uniform_loss=math.log(config.vocab_size),
    )


def head_recovery(prior: GOAT, length: int, head: int) -> dict:
    """What one head's prior learned over the training length (seed 000 Fig. 1):

    - ``sink_argmax``: the key where the sink ``u*(j)`` peaks (its straight-line part removed, see
      :func:`~priorattn.analysis.plots.identified_goat_components`);
    - ``relative_argmax_lag``: the lag where ``kappa*`` peaks, counted from the predicted token
      (``LAG_CONVENTION``);
    - ``prior_first``, ``prior_previous``: the attention the prior alone gives to key 0 and to key
      ``i`` (the token a previous-copy repeats), averaged over queries ``i >= 1``; compare them with
      the mixture weights.
    """
    u, relative, K = identified_goat_components(*goat_components(prior, length, head))
    kappa = relative[-1, ::-1]  # kappa*(i - j) for i - j = 0 .. L - 1, read on the last query's row
    probs = causal_prior_probs(torch.from_numpy(K)).numpy()
    queries = np.arange(1, length)
    return dict(
        sink_argmax=int(u.argmax()),
        relative_argmax_lag=int(kappa.argmax()) + 1,
        prior_first=float(probs[queries, 0].mean()),
        prior_previous=float(probs[queries, queries].mean()),
    )


def copy_mixture_job(
    config: CopyMixtureConfig, out, *, layer: int = 0, head: int = 0, progress: bool = True
) -> dict:
    """Train, measure every head, draw head ``head`` of layer ``layer`` to ``out/FIGURE`` and write
    ``out/results.json``; the result's top-level ``sink_argmax`` and ``relative_argmax_lag`` are
    that head's."""
    if not 0 <= head < config.heads:
        raise ValueError(f"head must be in [0, {config.heads}), got {head}")
    if layer != 0:  # both models have one attention layer
        raise ValueError(f"layer must be 0 (the models have one attention layer), got {layer}")
    out = prepare_out(out)
    start = time.perf_counter()
    model, losses = train_copy_mixture(config, progress)
    seconds = time.perf_counter() - start
    priors = goat_layers(model)
    heads = [
        dict(layer=i, head=h) | head_recovery(prior, config.length, h)
        for i, prior in enumerate(priors)
        for h in range(config.heads)
    ]
    drawn = heads[layer * config.heads + head]
    result = dict(
        config=asdict(config),
        scale=config.scale.record(),
        layer=layer,
        head=head,
        sink_argmax=drawn["sink_argmax"],
        relative_argmax_lag=drawn["relative_argmax_lag"],
        lag_convention=LAG_CONVENTION,
        heads=heads,
        **eval_losses(model, config),
        train_losses=losses,
        train_seconds=seconds,
    )
    components = identified_goat_components(*goat_components(priors[layer], config.length, head))
    draw_goat_decomposition(
        out / FIGURE, components, figure_title(config, head), figure_caption(config, drawn), run=config.scale
    )
    write_json_atomic(out / RESULTS_JSON, result)
    return result


def figure_title(config: CopyMixtureConfig, head: int) -> str:
    model = "one-layer attention probe" if config.model == "probe" else "one-layer GPT"
    return f"GOAT prior learned on the copy-mixture task ({model}, head {head}, L = {config.length})"


def figure_caption(config: CopyMixtureConfig, measured: dict) -> str:
    first, previous, noise = config.weights
    return (
        f"Task: sequences over {config.vocab_size} token values where each token copies the first token "
        f"(probability {first:g}), copies the previous token ({previous:g}) or is uniform noise "
        f"({noise:g}); the model is trained {config.steps} steps to predict the next token (seed "
        "000 Fig. 1). Heatmaps have one row per query position i, which predicts token i + 1, and "
        "one column per key position j; the blank upper triangle is masked. A sink u(j) and a "
        "relative part kappa(i - j) can trade a straight line without changing attention (it only "
        "shifts rows), so (a) shows u with its least-squares line removed and (b) holds that line.\n\n"
        f"{expectation(measured, config.scale)} In (d) the prior alone gives on average "
        f"{measured['prior_first']:.2f} of a query's attention to the first token and "
        f"{measured['prior_previous']:.2f} to its own position."
    )


def expectation(measured: dict, run: RunScale) -> str:
    """Seed 000 Fig. 1, judged on one head's :func:`head_recovery`: the sink peaks at key 0 and the
    relative part at lag 1."""
    sink, lag = measured["sink_argmax"], measured["relative_argmax_lag"]
    return seed_expectation(
        "Seed 000 reports the sink peaking at key 0, the first token, and the relative part along "
        "the diagonal j = i, the query's own token, which the predicted token i + 1 repeats when it "
        "copies the previous one (the seed's j = i - 1, counted from the predicted token: lag 1).",
        sink == 0 and lag == 1,
        f"the sink peaks at key {sink}, the relative part at lag {lag}",
        run,
    )
