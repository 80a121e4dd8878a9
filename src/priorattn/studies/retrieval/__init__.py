"""``priorattn retrieval``: synthetic passkey, MQAR and NIAH, one model per (mechanism, seed) trained
to a criterion, exact match to 64 T, verdicts on the seeds' claims (study.py trains and scores,
report.py pools and judges, figures.py draws)."""

from .report import run_retrieval_study, summarize
from .study import RetrievalStudyConfig, train_and_score

__all__ = ["RetrievalStudyConfig", "run_retrieval_study", "summarize", "train_and_score"]
