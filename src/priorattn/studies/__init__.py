"""Studies: each trains models, evaluates them and writes ``results.json``, figures and a report.

- :mod:`~priorattn.studies.compare` (``priorattn compare``, the main job): language models that
  differ only in position, perplexity and retrieval beyond the training length, with the retrieval
  study inside its report;
- :mod:`~priorattn.studies.retrieval` (``priorattn retrieval``): synthetic retrieval to 64 T with
  verdicts on the seeds' claims;
- :mod:`~priorattn.studies.scalar` (``priorattn scalar-exp``): seed 002's proposed experiments;
- :mod:`~priorattn.studies.vision`, :mod:`~priorattn.studies.dna`,
  :mod:`~priorattn.studies.copy_mixture`: seed 000's image, genome and copy-mixture experiments.

A study never imports another, except that ``compare`` runs the retrieval study as part of the main
job; what two studies share lives in a lower layer (docs/architecture.md).
"""
