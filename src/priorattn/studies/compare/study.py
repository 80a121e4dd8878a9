"""``priorattn compare``: models that differ only in their positional mechanism, trained alike,
evaluated alike, in one report (the main job; seed 003 Sec. 3 and App. D-E, seed 000 Sec. 6).

Every model is the ``tiny`` preset trained with the same data, steps, seed and retrieval mix; only the
way position enters differs (a mechanism of :mod:`priorattn.models.named`). Each is then scored at
lengths from the training length ``T`` upwards: perplexity, and passkey accuracy at ``T``. Byte-level
retrieval costs minutes per model, and a model that does not retrieve at ``T`` cannot show how retrieval
survives beyond it, so the passkey past ``T`` and the NIAH run only for the models that retrieve at
``T`` (accuracy at least :data:`RETRIEVES`). The output directory holds one run directory per model
(``models/NAME``), each model's evaluation results (``models/NAME/eval/TASK``), and the report
(``report.html``, ``results.json``, the figures). Everything finished is reused: a re-run only does what
is missing, was asked with other settings, or was measured on another checkpoint (a run trained
further).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...data import vocab_size_of
from ...data.retrieval import NIAH_VARIANTS
from ...eval.jobs import RESULTS_JSON, checkpoint_identity, niah_job, passkey_job, ppl_job
from ...eval.ppl import check_factors
from ...eval.retrieval import RETRIEVES
from ...figures import RunScale
from ...files import check_text_encoding, prepare_out, write_json_atomic
from ...models import preset
from ...models.named import mechanism_fields, split_mechanism
from ...train import OtherSettings, TrainConfig, train
from ..retrieval.run import run_retrieval_study
from ..retrieval.study import RetrievalStudyConfig
from ..styles import mechanism_label

# The language models compare trains by default: seed 003 Fig. 6's and seed 000 Fig. 3's mechanisms,
# BAM as seed 003 defines it (GGD + SSMax).
DEFAULT_MODELS = ("nope", "sinusoidal", "rope", "local_rope", "alibi", "bam+ssmax", "goat")
#: Each language model's training steps at budget 1.
STEPS = 600


@dataclass
class CompareConfig:
    """What ``compare`` trains and measures; :meth:`for_budget` makes one from ``--budget``.

    The default (budget 1) trains each tiny model for 600 steps of 8 x 256 bytes with half of the
    sequences replaced by retrieval samples, and evaluates perplexity from T = 256 to 64 T and
    retrieval to 16 T.

    - ``models``: the mechanisms trained (:mod:`priorattn.models.named`), or prior specs that
      are one of them, as ``train --prior`` writes them: ``goat(slope=none)`` is ``goat_noslope``.
    - ``data``: the corpus (:func:`priorattn.data.load_corpus`: a text file, folder, glob or
      ``hf:PATH``; ``None``: the embedded Shakespeare works).
    - ``text_encoding``: how ``data``'s text files are decoded.
    - ``preset``: the model size every mechanism is trained at (:data:`priorattn.models.PRESETS`).
    - ``seq_len``: the training length ``T``.
    - ``window``: the sliding window of ``local_rope``.
    - ``steps``, ``batch_size``: each model's optimizer steps, and sequences per step.
    - ``retrieval_mix``: the fraction of training sequences replaced by passkey and needle samples.
    - ``seed``: the seed of every model's weights and batches, and of the evaluations' samples.
    - ``ppl_factors``, ``retrieval_factors``: the evaluation lengths in units of ``T``: increasing,
      from 1 (the report reads the first as ``T``), perplexity with at least one length past ``T``.
    - ``ppl_windows``: the text windows scored per perplexity length.
    - ``passkey_depths``, ``niah_depths``: the needle depths of the passkey and of the NIAH.
    - ``trials``: the prompts per length and depth of each retrieval evaluation.
    - ``niah_variants``: the NIAH variants evaluated (``NIAH_VARIANTS``).
    - ``retrieval``: the synthetic retrieval study run first (``None``: none).
    - ``budget``: the one these settings were made for (:attr:`scale`).
    """

    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    data: str | None = None
    text_encoding: str = "utf-8"
    preset: str = "tiny"
    seq_len: int = 256
    window: int = 128
    steps: int = STEPS
    batch_size: int = 8
    retrieval_mix: float = 0.5
    seed: int = 0
    ppl_factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    ppl_windows: int = 4
    retrieval_factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    passkey_depths: int = 20
    niah_depths: int = 5
    trials: int = 2
    niah_variants: list[str] = field(default_factory=lambda: list(NIAH_VARIANTS))
    retrieval: RetrievalStudyConfig | None = field(default_factory=RetrievalStudyConfig)
    budget: float = 1.0

    def __post_init__(self):
        if not self.models:
            raise ValueError(f"models must name at least one mechanism, e.g. {','.join(DEFAULT_MODELS)}")
        for name in self.models:
            split_mechanism(name)
        bad = [v for v in self.niah_variants if v not in NIAH_VARIANTS]
        if bad:
            raise ValueError(f"unknown NIAH variant {bad[0]!r}: use some of {list(NIAH_VARIANTS)}")
        check_text_encoding(self.text_encoding)
        check_factors("ppl_factors", self.ppl_factors, past_T=True)
        check_factors("retrieval_factors", self.retrieval_factors, past_T=False)
        if isinstance(self.retrieval, dict):  # a saved config read back
            self.retrieval = RetrievalStudyConfig(**self.retrieval)
        if self.retrieval is not None and not isinstance(self.retrieval, RetrievalStudyConfig):
            raise ValueError(f"retrieval must be a RetrievalStudyConfig or None, got {self.retrieval!r}")

    @classmethod
    def for_budget(
        cls,
        budget: float = 1.0,
        models: Sequence[str] | None = None,
        retrieval_mechanisms: Sequence[str] | None = None,
    ) -> CompareConfig:
        """Training steps scale with ``budget``; below 0.5 the evaluations shrink to a smoke test
        (shorter lengths, fewer depths and trials), from 4 the retrieval reaches 32 T. The retrieval
        study takes the same budget (:meth:`RetrievalStudyConfig.for_budget`) and runs
        ``retrieval_mechanisms`` (its defaults when None)."""
        if not budget > 0 or not math.isfinite(budget):
            raise ValueError(f"budget must be a positive number, got {budget!r}")
        study = {} if retrieval_mechanisms is None else dict(mechanisms=list(retrieval_mechanisms))
        config = cls(
            models=list(models or DEFAULT_MODELS),
            steps=max(10, round(STEPS * budget)),
            retrieval=RetrievalStudyConfig.for_budget(budget, **study),
            budget=budget,
        )
        if budget < 0.5:
            config.ppl_factors, config.retrieval_factors = [1, 2, 4, 8], [1, 2, 4]
            config.passkey_depths, config.niah_depths, config.trials, config.ppl_windows = 5, 3, 1, 2
        elif budget >= 4:
            config.retrieval_factors.append(32)
            config.trials = 4
        return config

    @property
    def scale(self) -> RunScale:
        """The budget and steps of the language models, as ``results.json`` and the figures state
        them (the retrieval study states its own)."""
        return RunScale(self.steps, STEPS, self.budget)

    def model_config(self, name: str):
        fields = dict(mechanism_fields(name), seq_len=self.seq_len, vocab_size=vocab_size_of("byte"))
        if fields.get("encoding") == "local_rope":
            fields["window"] = self.window
        return preset(self.preset, **fields)

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            data=self.data,
            text_encoding=self.text_encoding,
            steps=self.steps,
            batch_size=self.batch_size,
            retrieval_mix=self.retrieval_mix,
            seed=self.seed,
            warmup_steps=min(100, self.steps // 10),
            eval_every=0,
            save_every=0,
        )

    def evaluations(self) -> dict[str, dict]:
        """The settings of each evaluation, as recorded with its results (a change re-runs it):
        ``ppl``, ``passkey_at_T`` (the gate), ``passkey`` (every length, T again among them: its
        results are what ``priorattn eval passkey`` writes) and ``niah``."""
        T = self.seq_len
        retrieval = [T * f for f in self.retrieval_factors]
        passkey = dict(depths=self.passkey_depths, trials=self.trials, seed=self.seed)
        return dict(
            ppl=dict(lengths=[T * f for f in self.ppl_factors], windows=self.ppl_windows, seed=self.seed),
            passkey_at_T=dict(lengths=[T], **passkey),
            passkey=dict(lengths=retrieval, **passkey),
            niah=dict(
                lengths=retrieval,
                depths=self.niah_depths,
                trials=self.trials,
                seed=self.seed,
                variants=self.niah_variants,
            ),
        )


JOBS = dict(ppl=ppl_job, passkey_at_T=passkey_job, passkey=passkey_job, niah=niah_job)


def compare(config: CompareConfig, out: str | Path, *, progress: bool = True, log=print) -> dict:
    """Train and evaluate every model of ``config`` into ``out``, run the synthetic retrieval study
    (``config.retrieval``, into ``out/retrieval``; skipped when None); write the report; return its
    data.

    Per model (``results.json``'s ``models.NAME``): ``ppl`` and ``passkey_at_T`` always; ``passkey``
    and ``niah`` when the passkey accuracy at ``T`` is at least :data:`RETRIEVES`, else ``None``
    (skipped)."""
    out = prepare_out(out)
    results = {}
    for i, name in enumerate(config.models, 1):
        run_dir = out / "models" / name
        log(f"[{i}/{len(config.models)}] {mechanism_label(name)}: training {config.steps} steps in {run_dir}")
        try:
            trained = train(
                config.model_config(name), config.train_config(), run_dir, resume=True, progress=progress
            )
        except OtherSettings as other:  # e.g. trained by an earlier priorattn whose defaults differed
            raise ValueError(
                f"{run_dir} holds a {mechanism_label(name)} model trained with other settings than this "
                f"study's ({'; '.join(other.differences)}): remove it, or give another --out, to train "
                "it with these"
            ) from None
        entry = dict(label=mechanism_label(name), run=str(run_dir), val_loss=trained.val_loss)
        entry["unigram_loss"] = trained.unigram_loss
        settings = config.evaluations()
        for task in ("ppl", "passkey_at_T"):
            entry[task] = evaluation(task, settings[task], run_dir, progress, log)
        at_T = entry["passkey_at_T"]["by_length"][0]
        retrieves = at_T >= RETRIEVES
        if not retrieves:
            log(f"    passkey past T, niah: skipped (passkey accuracy {at_T:.2f} at T, below {RETRIEVES})")
        for task in ("passkey", "niah"):
            entry[task] = evaluation(task, settings[task], run_dir, progress, log) if retrieves else None
        results[name] = entry
    retrieval = None
    if config.retrieval is not None:
        study = config.retrieval
        log(f"retrieval study: {len(study.mechanisms)} mechanisms x {len(study.seeds)} seeds")
        retrieval = run_retrieval_study(config.retrieval, out / "retrieval", progress=progress, log=log)
    from .report import write_report  # matplotlib and the HTML only when there is something to show

    return write_report(config, results, out, retrieval)


def evaluation(task: str, settings: dict, run_dir: Path, progress: bool, log) -> dict:
    """The results of ``task`` on ``run_dir`` with ``settings``: read back if they were measured
    with these settings on the checkpoint the run holds now."""
    task_dir = run_dir / "eval" / task
    path = task_dir / RESULTS_JSON
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("settings") == settings and saved.get("checkpoint") == checkpoint_identity(run_dir):
            log(f"    {task}: reusing {path}")
            return saved
    log(f"    {task}: evaluating")
    result = JOBS[task](run_dir, task_dir, progress=progress, **settings)
    result["settings"] = settings
    write_json_atomic(path, result)
    return result
