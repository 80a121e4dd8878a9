"""DNA language modelling (seed 000 Fig. 4): nucleotide-level models on a bacterial genome, compared
by positional mechanism. Genomes are read by :mod:`priorattn.data.fasta` (``"fasta:PATH"`` corpora)."""

from .config import DNAConfig
from .experiment import dna
from .measures import gc_trajectory, match_rate, pearson

__all__ = ["DNAConfig", "dna", "gc_trajectory", "match_rate", "pearson"]
