"""``priorattn retrieval``: can attention still find the needle far beyond the training length?

The seeds' headline claims are about retrieval at 2x-500x the training length ``T`` (seed 003 Sec.
3.1, Fig. 2-3, App. F.4; seed 000 Fig. 3). A tiny model trained on byte-level text for minutes never
learns retrieval; trained directly on synthetic retrieval sequences over a small vocabulary
(:mod:`priorattn.data.synthetic`, answers only in the loss, lengths drawn up to ``T``) it learns it
within a few hundred steps. A token shift (``GPTConfig.token_shift``: every position also sees its
predecessor's embedding, as RWKV's token shift or Olsson et al. 2022's smeared keys) makes each
answer one attention hop for every positional mechanism, so what the study compares is exactly
whether attention still finds the needle at ``2T .. 64T`` (``512T`` from ``budget=2``).

One tiny model per (mechanism, seed), all trained alike on a mixture of ``tasks`` and scored alike
on the same sequences (:func:`~priorattn.eval.synthetic.score_synthetic`). A mechanism is a
positional mechanism (:func:`study_positions`), optionally with SSMax (``"bam+ssmax"``), so a result can
be told apart as coming from the prior or from SSMax. Everything lands in ``out``:
``models/<mechanism>/seed-<s>/`` (``model.safetensors``, ``model.json``: configs and training
log, ``scores-<mechanism>.json``: counts keyed by the evaluation settings and the weights' hash) and
the study's ``results.json``, figures and ``report.html``
(:mod:`priorattn.studies.retrieval.report`). A re-run reuses what matches.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from tqdm.auto import tqdm

from ...checks import check_int
from ...data.synthetic import SYNTHETIC_TASKS, SyntheticTask, targets_of
from ...eval.ppl import check_factors
from ...eval.retrieval import uniform_depths
from ...eval.synthetic import exact_matches, score_synthetic
from ...figures import RunScale
from ...files import as_saved, prepare_out, read_json, sha256_of, write_atomic, write_json_atomic
from ...models import GPT, GPTConfig
from ...models.named import SSMAX, positions, split_mechanism
from ...priors import GGD, GOAT, with_defaults
from ...ssmax import SSMax
from ...train import TrainConfig
from ...train.optim import build_optimizer, build_scheduler, optimizer_step
from ..styles import mechanism_label

#: RoPE's context extensions as evaluation variants of RoPE's model, by name: each scores it at length
#: ``n`` extended by ``n / T`` from ``T`` (``eval.synthetic.extended_rope``). "rope_pi": position
#: interpolation (seed 000 Fig. 3); "rope_ntk": NTK-aware; "rope_yarn": YaRN (Peng et al. 2023).
EXTENSIONS = {"rope_pi": "pi", "rope_ntk": "ntk", "rope_yarn": "yarn"}
DEFAULT_POSITIONS = ("nope", "rope", "alibi", "bam", "goat")
DEFAULT_MECHANISMS = tuple(m for p in DEFAULT_POSITIONS for m in (p, p + SSMAX))
RETRIEVES_AT_T = 0.95  # a mechanism below this at T cannot be judged beyond it
#: The training steps at budget 1: a cap, each model stopping when it retrieves at T.
STEPS = 2000


def study_positions() -> dict[str, dict]:
    """The models' positions and their ``GPTConfig`` fields (:func:`priorattn.models.named.positions`:
    the named models and every registered prior) and the evaluation variants of :data:`EXTENSIONS`,
    RoPE's model scored with each of RoPE's context extensions."""
    table = positions()
    return table | {name: table["rope"] for name in EXTENSIONS}


def all_mechanisms() -> tuple[str, ...]:
    """Every mechanism the study can run: each of :func:`study_positions` with and without SSMax."""
    return tuple(m for p in study_positions() for m in (p, p + SSMAX))


def position_of(mechanism: str) -> tuple[str, bool]:
    """``("bam", True)`` for ``"bam+ssmax"``; a ValueError naming the known mechanisms otherwise."""
    return split_mechanism(mechanism, study_positions())


def label_of(mechanism: str) -> str:
    """``"RoPE PI + SSMax"``: the name in words of a mechanism the study can run."""
    position_of(mechanism)
    return mechanism_label(mechanism)


def trained_as(mechanism: str) -> str:
    """The mechanism whose trained model ``mechanism`` evaluates: RoPE PI, NTK and YaRN are RoPE's."""
    position, ssmax = position_of(mechanism)
    return ("rope" if position in EXTENSIONS else position) + (SSMAX if ssmax else "")


@dataclass
class RetrievalStudyConfig:
    """What the study trains and measures; :meth:`for_budget` makes one from ``--budget``.

    Defaults (budget 1): ten mechanisms (NoPE, RoPE, ALiBi, BAM, GOAT, each with and without SSMax)
    x three seeds; each a 2-layer model of width 64 (2 heads of 32 lanes, GOAT with 3 frequencies)
    with a token shift, trained on 32 sequences a step of passkey and multi-key NIAH samples at
    lengths drawn uniformly up to ``train_len = 64`` (after a ``curriculum_steps`` ramp) until it
    answers every one of ``check_prompts`` check sequences per task at ``T`` exactly (checked every
    ``check_every`` steps, at most ``steps``), then scored at ``T .. 64 T`` on 5 needle depths x 8
    sequences per cell and seed (:func:`train_synthetic`).

    - ``mechanisms``: the positions trained, each optionally ``+ssmax`` (``all_mechanisms()``), or
      prior specs that are one of them.
    - ``seeds``: one model per mechanism and seed.
    - ``tasks``: the synthetic tasks trained together and scored apart (``SYNTHETIC_TASKS``).
    - ``train_len``: the training length ``T``.
    - ``token_shift``: every position also sees its predecessor's embedding.
    - ``d_model``, ``n_layers``, ``n_heads``: each model's width, blocks and heads.
    - ``goat_freqs``: GOAT's frequencies.
    - ``batch_size``, ``lr``, ``warmup_steps``: sequences per step, the peak learning rate and its
      warmup.
    - ``check_every``, ``check_prompts``: how often the criterion is checked, on how many check
      sequences per task.
    - ``factors``: the scoring lengths in units of ``T``.
    - ``depths``, ``prompts``: needle depths, and sequences per depth, of each scored length.
    - ``eval_seed``: the seed of the check and scoring sequences, the same for every model.
    - ``budget``: the one these settings were made for (:attr:`scale`).

    The protocol's settings, each an option so that its effect can be measured:

    - ``steps``: the training steps at budget 1: a cap, or with ``stop_at_criterion=False`` the count.
    - ``stop_at_criterion``: stop a model when it answers every check sequence at ``T``; False:
      every model trains all ``steps``, its checks only logged.
    - ``curriculum_steps``: the steps over which the longest training length rises to ``T``, scaled
      by a budget below 1; 0: no length curriculum.
    - ``prior_lr``: the learning rate of the priors and SSMax (the rest take ``lr``).
    - ``task_weights``: each task's share of the training sequences, in ``tasks``' order, e.g.
      ``3,1`` (``None``: equal shares).
    """

    mechanisms: list[str] = field(default_factory=lambda: list(DEFAULT_MECHANISMS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    tasks: list[str] = field(default_factory=lambda: ["passkey", "niah"])
    train_len: int = 64
    token_shift: bool = True
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    goat_freqs: int = 3
    steps: int = STEPS
    stop_at_criterion: bool = True
    task_weights: list[float] | None = None
    batch_size: int = 32
    lr: float = 3e-3
    prior_lr: float = 1e-3
    warmup_steps: int = 50
    curriculum_steps: int = 300
    check_every: int = 100
    check_prompts: int = 64
    factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    depths: int = 5
    prompts: int = 8
    eval_seed: int = 1234
    budget: float = 1.0

    def __post_init__(self):
        if not self.mechanisms:
            raise ValueError("mechanisms must name at least one mechanism")
        for mechanism in self.mechanisms:
            position_of(mechanism)
        if len(set(self.mechanisms)) != len(self.mechanisms):
            raise ValueError(f"mechanisms name one twice: {self.mechanisms}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct non-negative ints, got {self.seeds!r}")
        for seed in self.seeds:
            check_int("seed", seed, low=0)
        unknown = [t for t in self.tasks if t not in SYNTHETIC_TASKS]
        if unknown or not self.tasks:
            raise ValueError(
                f"unknown task {unknown[0] if unknown else None!r}: use some of {SYNTHETIC_TASKS}"
            )
        for name in (
            "train_len",
            "d_model",
            "n_layers",
            "n_heads",
            "steps",
            "batch_size",
            "depths",
            "prompts",
        ):
            check_int(name, getattr(self, name), low=1)
        check_int("goat_freqs", self.goat_freqs, low=0)
        check_int("curriculum_steps", self.curriculum_steps, low=0)
        check_int("check_every", self.check_every, low=1)
        check_int("check_prompts", self.check_prompts, low=1)
        check_int("warmup_steps", self.warmup_steps, low=0)
        check_int("eval_seed", self.eval_seed, low=0)
        for name in ("token_shift", "stop_at_criterion"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        self.task_shares()  # checks task_weights
        for name in ("lr", "prior_lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        check_factors("factors", self.factors, past_T=False)
        shortest = self.min_train_len()
        if self.train_len < shortest:
            raise ValueError(
                f"train_len={self.train_len} is too short for tasks {self.tasks}: give at least {shortest}"
            )

    @classmethod
    def for_budget(cls, budget: float = 1.0, **fields) -> RetrievalStudyConfig:
        """Training steps scale with ``budget``; below 0.5 a smoke run (fewer steps, lengths to
        ``8 T``, 3 depths x 2 sequences); from 2 the lengths reach ``512 T`` (seed 003 reports 500x)."""
        if isinstance(budget, bool) or not isinstance(budget, int | float) or not (0 < budget < math.inf):
            raise ValueError(f"budget must be a positive number, got {budget!r}")
        config = cls(**fields)
        config.budget = float(budget)
        config.steps = max(20, round(config.steps * budget))
        config.warmup_steps = min(config.warmup_steps, config.steps // 10)
        config.curriculum_steps = round(config.curriculum_steps * min(1.0, budget))
        config.check_every = max(10, min(config.check_every, config.steps // 10))
        if budget < 0.5:
            config.factors, config.depths, config.prompts = [1, 2, 8], 3, 2
        elif budget >= 2:
            config.factors = config.factors + [128, 256, 512]
        return config

    @property
    def scale(self) -> RunScale:
        """The budget and step cap that ``results.json`` and every figure state."""
        return RunScale(self.steps, STEPS, self.budget, up_to=self.stop_at_criterion)

    @property
    def smoke(self) -> bool:
        """Whether this is a run below the default budget or steps, whose numbers judge nothing."""
        return self.scale.smoke

    def task_shares(self) -> list[float] | None:
        """Each task's share of the training sequences (``task_weights`` normalised to sum to 1), or
        None for equal shares; a ValueError for weights that do not fit ``tasks``."""
        weights = self.task_weights
        if weights is None:
            return None
        if (
            isinstance(weights, str | bytes)
            or not isinstance(weights, Sequence)
            or len(weights) != len(self.tasks)
        ):
            raise ValueError(f"task_weights must give one weight per task of {self.tasks}, got {weights!r}")
        for weight in weights:
            if isinstance(weight, bool) or not (isinstance(weight, int | float) and 0 < weight < math.inf):
                raise ValueError(f"task_weights must be positive numbers, got {weights!r}")
        total = math.fsum(weights)
        return [weight / total for weight in weights]

    def min_train_len(self) -> int:
        return max(SyntheticTask(name).min_length() for name in self.tasks)

    def lengths(self) -> list[int]:
        return [self.train_len * f for f in self.factors]

    def model_config(self, mechanism: str) -> GPTConfig:
        position, ssmax = position_of(trained_as(mechanism))
        fields = dict(study_positions()[position])
        if fields.get("encoding") == "local_rope":
            fields["window"] = self.train_len
        fields["prior"] = with_defaults(fields.get("prior", "uniform"), goat=dict(num_freqs=self.goat_freqs))
        return GPTConfig(
            vocab_size=max(SyntheticTask(name).vocab_size for name in self.tasks),
            seq_len=self.train_len,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            token_shift=self.token_shift,
            ssmax=ssmax,
            **fields,
        )

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            prior_lr=self.prior_lr,
            warmup_steps=self.warmup_steps,
        )

    def training_settings(self, mechanism: str, seed: int) -> dict:
        """Everything the trained model depends on: a model is reused only when these match.

        ``stop_at_criterion`` and ``task_weights`` appear only where they differ from their
        defaults, so that models trained before these options existed are still reused."""
        train = self.train_config()
        optional = {}
        if not self.stop_at_criterion:
            optional["stop_at_criterion"] = False
        if self.task_weights is not None:
            optional["task_shares"] = self.task_shares()
        return optional | dict(
            model=self.model_config(mechanism).to_dict(),
            tasks=list(self.tasks),
            seed=seed,
            steps=train.steps,
            batch_size=train.batch_size,
            lr=train.lr,
            prior_lr=train.prior_lr,
            warmup_steps=train.warmup_steps,
            curriculum_steps=self.curriculum_steps,
            check_every=self.check_every,
            check_prompts=self.check_prompts,
            check_seed=self.eval_seed,
            min_lr_ratio=train.min_lr_ratio,
            weight_decay=train.weight_decay,
        )

    def evaluation_settings(self) -> dict:
        return dict(
            lengths=self.lengths(),
            depths=uniform_depths(self.depths),
            prompts=self.prompts,
            seed=self.eval_seed,
        )


def training_batch(
    tasks: Sequence[SyntheticTask],
    batch_size: int,
    length: int,
    rng: np.random.Generator,
    shares: Sequence[float] | None = None,
):
    """``(inputs, targets)`` of ``batch_size`` sequences of ``length`` tokens, each row's task and
    needle depth drawn from ``rng``: ``(B, length - 1)`` each, targets ``IGNORE_INDEX`` outside each
    sample's ``loss_mask`` (the answers; every token of ``text_passkey``). A row's task is drawn with
    probability ``shares[i]`` for ``tasks[i]`` (None: uniformly, the draw of studies run before
    shares existed, so that their data streams are unchanged)."""

    def task() -> SyntheticTask:
        if shares is None:
            return tasks[int(rng.integers(len(tasks)))]
        return tasks[int(rng.choice(len(tasks), p=shares))]

    samples = [task().sample(length, float(rng.random()), rng) for _ in range(batch_size)]
    return targets_of(samples, "loss_mask")


def train_synthetic(config: RetrievalStudyConfig, mechanism: str, seed: int, progress: bool = True):
    """A model of ``mechanism`` trained on ``config.tasks`` until it retrieves at ``T``; ``(model, log)``.

    Initial weights come from ``seed``, and so does the data stream (a generator seeded by ``(seed,
    1)``): each step draws one length uniformly from ``[shortest task, longest]`` and fills the batch
    with samples of random tasks and depths. ``longest`` grows linearly from the shortest task's
    length to ``T`` over the first ``curriculum_steps``, then stays at ``T``: short sequences first,
    where the needle is a few tokens away, get every mechanism past the plateau before induction
    forms (without it, ALiBi and RoPE + SSMax stayed at chance for 1000 steps in some seeds).

    Training stops at the first check (every ``check_every`` steps past the curriculum) where the
    model answers every one of the :func:`check_set`'s sequences of each task exactly, or at
    ``steps``: every model is trained to the same criterion at ``T``, so what the study compares
    beyond ``T`` is not how fast each learned. With ``stop_at_criterion=False`` every model trains
    all ``steps`` (a fixed step count, the protocol the study replaced) and the checks are only
    logged. ``task_weights`` sets each task's share of the sequences. AdamW with the library's
    parameter groups (priors and SSMax without weight decay, at ``prior_lr``) and schedule (warmup,
    cosine to 0.1x over ``steps``). ``prior_lr`` is below ``lr`` because at ``lr`` GOAT's sink MLP
    grows a sink on the first token early on (seed 0 stayed at 0.7 passkey accuracy at T after 1000
    steps; 1.0 with ``prior_lr = 1e-3``).
    """
    train = config.train_config()
    torch.manual_seed(seed)
    model = GPT(config.model_config(mechanism))
    optimizer = build_optimizer(model, train)
    scheduler = build_scheduler(optimizer, train)
    tasks = [SyntheticTask(name) for name in config.tasks]
    shares = config.task_shares()
    checks = check_set(config)
    rng = np.random.default_rng([seed, 1])
    shortest = config.min_train_len()
    losses, checked, start = [], [], time.perf_counter()
    bar = tqdm(range(config.steps), desc=label_of(trained_as(mechanism)), unit="step", disable=not progress)
    for step in bar:
        length = int(rng.integers(shortest, curriculum_length(config, shortest, step) + 1))
        inputs, targets = training_batch(tasks, config.batch_size, length, rng, shares)
        _, loss, _ = model(inputs, targets=targets)
        loss.backward()
        optimizer_step(model, optimizer, scheduler, train.grad_clip)
        losses.append(float(loss.detach()))
        done = step + 1
        if done >= config.curriculum_steps and done % config.check_every == 0:
            model.eval()
            right = [
                float(exact_matches(model, inputs, targets).double().mean()) for inputs, targets in checks
            ]
            model.train()
            checked.append(dict(step=done, accuracy=right))
            bar.set_postfix(loss=f"{losses[-1]:.3f}", check=" ".join(f"{a:.2f}" for a in right))
            if config.stop_at_criterion and min(right) == 1.0:
                break
    bar.close()
    model.eval()
    tail = losses[-max(1, len(losses) // 20) :]
    log = dict(
        seconds=time.perf_counter() - start,
        steps=len(losses),
        retrieves=bool(checked) and min(checked[-1]["accuracy"]) == 1.0,
        final_loss=sum(tail) / len(tail),
        losses=losses[::10],
        checks=checked,
    )
    return model, log


def check_set(config: RetrievalStudyConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The sequences that decide when training stops: ``check_prompts`` of each task at length
    ``T``, depths uniform, from a generator of their own (the evaluation's are others)."""
    rng = np.random.default_rng([config.eval_seed, 2])
    return [SyntheticTask(name).batch(config.check_prompts, config.train_len, rng) for name in config.tasks]


def curriculum_length(config: RetrievalStudyConfig, shortest: int, step: int) -> int:
    """The longest training length at ``step``: ``shortest`` rising linearly to ``T`` over the
    first ``curriculum_steps``."""
    if step >= config.curriculum_steps:
        return config.train_len
    return shortest + int((config.train_len - shortest) * step / config.curriculum_steps)


def learned_parameters(model: GPT, train_len: int) -> list[dict]:
    """What each layer's prior and SSMax learned, per head: GGD's ``alpha, beta, mu`` (seed 003 App.
    C: ``alpha = exp(-theta_alpha / theta_beta)``, ``beta = theta_beta``, ``mu = 2 sinh(theta_mu)``),
    GOAT's recency slope and its sink ``u(j)`` at ``j = 0, T, 4T, 64T`` (seed 000 Eq. 19), SSMax's
    ``s``. One dict per layer; empty for a layer with none of these."""
    layers = []
    for block in model.blocks:
        attn, found = block.attn, {}
        priors = [] if attn.prior is None else list(getattr(attn.prior, "parts", [attn.prior]))
        with torch.no_grad():
            for prior in priors:
                if isinstance(prior, GGD):
                    beta = prior.theta_beta
                    found["ggd"] = dict(
                        alpha=torch.exp(-prior.theta_alpha / beta).tolist(),
                        beta=beta.tolist(),
                        mu=(2 * torch.sinh(prior.theta_mu)).tolist(),
                    )
                elif isinstance(prior, GOAT):
                    goat = dict(slope=None if prior.fold_slope() is None else prior.fold_slope().tolist())
                    if prior.sink is not None:
                        positions = torch.tensor([0, train_len, 4 * train_len, 64 * train_len])
                        goat["sink_positions"] = positions.tolist()
                        goat["sink"] = prior.sink.evaluate(positions).tolist()  # (H, 4)
                    found["goat"] = goat
            if isinstance(attn.ssmax, SSMax):
                found["ssmax"] = dict(s=attn.ssmax.s.tolist())
        layers.append(found)
    return layers


@torch.no_grad()
def prior_curves(model: GPT, length: int, points: int = 64) -> dict | None:
    """Each layer's log-prior ``K_h(n - 1, n - 1 - d)`` for the last query of a ``length``-token input
    at ``points`` key distances ``d`` spaced evenly in log: what the prior tells attention about a needle
    ``d`` tokens back. ``{"distance", "layers": [layer][head][point]}``; None without a prior."""
    if all(block.attn.prior is None for block in model.blocks):
        return None
    distance = np.unique(np.geomspace(1, length, points).round().astype(np.int64) - 1)  # includes 0
    q_pos = torch.tensor([length - 1])
    k_pos = torch.from_numpy(length - 1 - distance)
    layers = []
    for block in model.blocks:
        prior = block.attn.prior
        if prior is None:
            layers.append(None)
            continue
        layers.append(prior.log_prior(q_pos, k_pos)[:, 0].double().tolist())  # (H, points)
    return dict(distance=distance.tolist(), layers=layers)


def trained_model(config: RetrievalStudyConfig, mechanism: str, seed: int, model_dir: Path, progress: bool):
    """The model of ``mechanism`` and ``seed`` from ``model_dir`` if trained there with today's
    settings, else trained now and saved (atomically); ``(model, record, reused)``."""
    settings = as_saved(config.training_settings(mechanism, seed))
    record_path, weights = model_dir / "model.json", model_dir / "model.safetensors"
    model = GPT(config.model_config(mechanism))
    if record_path.exists() and weights.exists():
        record = read_json(record_path)
        recorded = record.get("settings") or {}
        if "model" in recorded:  # as today's config writes it (a record may hold flattened prior fields)
            recorded = recorded | dict(model=as_saved(GPTConfig.from_dict(recorded["model"]).to_dict()))
        if recorded == settings and record.get("weights_sha256") == sha256_of(weights):
            load_model(model, str(weights))
            return model.eval(), record, True
    model, training = train_synthetic(config, mechanism, seed, progress)
    prepare_out(model_dir)
    write_atomic(weights, lambda tmp: save_model(model, str(tmp)))
    record = dict(settings=settings, training=training, weights_sha256=sha256_of(weights))
    write_json_atomic(record_path, record)
    return model, record, False


def scores_of(config, mechanism: str, model, record: dict, model_dir: Path, progress: bool):
    """Each task's counts for ``mechanism`` (keyed by the evaluation settings and the weights' hash,
    so a model trained on is scored again), read back when they match; ``(scores, reused)``."""
    settings = dict(config.evaluation_settings(), weights_sha256=record["weights_sha256"])
    scaling = EXTENSIONS.get(position_of(mechanism)[0])
    if scaling is not None:  # scores of RoPE PI saved before the extension replaced the RoPE are stale
        settings["rope_extension"] = scaling
    settings = as_saved(settings)
    path = model_dir / f"scores-{mechanism.replace('+', '-')}.json"
    if path.exists():
        saved = read_json(path)
        if saved.get("settings") == settings:
            return saved["tasks"], True
    tasks = {
        name: score_synthetic(
            model,
            SyntheticTask(name),
            lengths=settings["lengths"],
            depths=settings["depths"],
            prompts=settings["prompts"],
            seed=settings["seed"],
            interpolate_from=None if scaling is None else config.train_len,
            rope_scaling=scaling or "pi",
            progress=progress,
        )
        for name in config.tasks
    }
    write_json_atomic(path, dict(settings=settings, tasks=tasks))
    return tasks, False


def study_job(config: RetrievalStudyConfig, model_name: str, seed: int, out: Path, progress: bool) -> dict:
    """One trained model (``model_name``, ``seed``) and the scores of every mechanism of ``config``
    that evaluates it (RoPE and its extensions share RoPE's); ``{"records": {mechanism: run record},
    "messages": [...]}``. Runs on one thread, so results are the same whatever runs beside it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model_dir = out / "models" / model_name.replace("+", "-") / f"seed-{seed}"
        model, record, reused = trained_model(config, model_name, seed, model_dir, progress)
        messages = [
            f"{label_of(model_name)}, seed {seed}: " + ("reusing" if reused else "trained") + f" {model_dir}"
        ]
        records = {}
        for mechanism in (m for m in config.mechanisms if trained_as(m) == model_name):
            scores, reused = scores_of(config, mechanism, model, record, model_dir, progress)
            if not reused:
                messages.append(f"{label_of(mechanism)}, seed {seed}: scoring")
            records[mechanism] = dict(
                seed=seed,
                model_dir=str(model_dir),
                training=record["training"],
                learned=learned_parameters(model, config.train_len),
                prior_curve=prior_curves(model, config.lengths()[-1]),
                tasks=scores,
            )
        return dict(records=records, messages=messages)
    finally:
        torch.set_num_threads(threads)


def train_and_score(
    config: RetrievalStudyConfig, out: Path, *, workers: int | None = None, progress: bool = True, log=print
) -> tuple[dict[str, list[dict]], int]:
    """Train and score every (mechanism, seed) of ``config`` into ``out/models``; ``(runs, workers)``
    with ``runs[mechanism]`` the records of its seeds in ``config.seeds``' order.

    ``workers``: processes that train and score models side by side, one thread each (``None``:
    one per CPU core, at most one per model). Tiny models keep one core busy each far better than
    two threads keep two, and each model's numbers are the same for any ``workers``.
    """
    if workers is not None:
        check_int("workers", workers, low=1)
    jobs = list(dict.fromkeys((trained_as(m), seed) for m in config.mechanisms for seed in config.seeds))
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    done: dict[tuple[str, int], dict] = {}
    bar = tqdm(total=len(jobs), desc="models", unit="model", disable=not progress)
    if workers == 1:
        for name, seed in jobs:
            done[name, seed] = finished(study_job(config, name, seed, out, progress), bar, log)
    else:
        context = multiprocessing.get_context("spawn")  # no fork of a process that holds OpenMP threads
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = {
                pool.submit(study_job, config, name, seed, out, False): (name, seed) for name, seed in jobs
            }
            for future in as_completed(futures):
                done[futures[future]] = finished(future.result(), bar, log)
    bar.close()
    runs = {m: [done[trained_as(m), seed]["records"][m] for seed in config.seeds] for m in config.mechanisms}
    return runs, workers


def finished(result: dict, bar, log) -> dict:
    for message in result["messages"]:
        if bar.disable:
            log(message)
        else:
            bar.write(message)
    bar.update(1)
    return result
