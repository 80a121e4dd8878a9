"""``priorattn compare``: train models that differ only in the positional mechanism, evaluate them
all (:mod:`priorattn.eval`) and write one HTML report (report.py) that opens with the retrieval
study (:mod:`priorattn.studies.retrieval`)."""

from .study import DEFAULT_MODELS, CompareConfig, compare

__all__ = ["DEFAULT_MODELS", "CompareConfig", "compare"]
