"""The retrieval study's entry point: train and score every (mechanism, seed)
(:mod:`~priorattn.studies.retrieval.study`), then pool, judge and write what it found
(:mod:`~priorattn.studies.retrieval.report`)."""

from __future__ import annotations

from pathlib import Path

from ...files import prepare_out
from .report import write_study
from .study import RetrievalStudyConfig, train_and_score


def run_retrieval_study(
    config: RetrievalStudyConfig,
    out: str | Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    log=print,
    report: bool = True,
) -> dict:
    """The retrieval study (:mod:`priorattn.studies.retrieval.study`) into ``out``: every (mechanism,
    seed) trained and scored (:func:`~priorattn.studies.retrieval.study.train_and_score`; ``workers``
    processes side by side, so call it under ``if __name__ == "__main__":`` in a script, as
    ``multiprocessing`` requires), then ``results.json``, the figures and (``report=True``)
    ``report.html``. Returns the results."""
    out = prepare_out(out)
    runs, workers = train_and_score(config, out, workers=workers, progress=progress, log=log)
    return write_study(config, runs, out, workers=workers, standalone=report)
