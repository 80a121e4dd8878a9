"""What a prior does beyond the training length: perplexity, passkey and needle retrieval.

- :func:`evaluate_ppl` (ppl.py): loss per evaluation length, past the training length, by position,
  and paired with short-context scoring of the same tokens;
- :func:`evaluate_retrieval` (retrieval.py): accuracy per length and needle depth of any
  :class:`~priorattn.data.retrieval.RetrievalTask` (passkey or a RULER-style NIAH variant);
- run-level jobs (jobs.py) behind ``priorattn eval``, writing ``results.json`` and plots;
- exact-match scoring of the synthetic retrieval tasks (synthetic.py);
- verdicts (verdicts.py): a measurement as a value with its 95% interval (Wilson, normal), whether
  it is above or below a threshold or within noise, and a winner only beyond the noise.

The studies that train and compare many models (``compare``, the retrieval study) live in
:mod:`priorattn.studies`.

Long inputs are scored with chunked prefill through the KV cache (scoring.py), so memory stays
bounded by the chunk, never ``L x L``.
"""

from .jobs import niah_job, passkey_job, ppl_job
from .ppl import evaluate_ppl
from .retrieval import evaluate_retrieval, uniform_depths

__all__ = ["evaluate_ppl", "evaluate_retrieval", "niah_job", "passkey_job", "ppl_job", "uniform_depths"]
