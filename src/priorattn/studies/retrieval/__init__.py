"""``priorattn retrieval``: synthetic passkey, MQAR, NIAH and the tasks that need position, one model per
(mechanism, seed) trained to a criterion, exact match to 64 T, verdicts on the seeds' claims (study.py
trains and scores, report.py pools and judges, figures.py draws, run.py runs the three in turn,
sweep.py runs it across model sizes and training lengths)."""

from .report import summarize
from .run import run_retrieval_study
from .study import RetrievalStudyConfig, train_and_score
from .sweep import run_retrieval_sweep

__all__ = [
    "RetrievalStudyConfig",
    "run_retrieval_study",
    "run_retrieval_sweep",
    "summarize",
    "train_and_score",
]
