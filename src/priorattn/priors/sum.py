"""A product of priors: their log-priors add."""

from __future__ import annotations

from torch import Tensor, nn

from .base import FoldLanes, Prior, concat_lanes, sum_of_present
from .score_mod import ScoreTerms


class Sum(Prior):
    """``K = K_1 + K_2 + ...``; folds when every part folds (their lanes are concatenated)."""

    def __init__(self, *priors: Prior):
        super().__init__()
        if not priors:
            raise ValueError("Sum needs at least one prior")
        heads = {p.num_heads for p in priors if p.num_heads is not None}
        if len(heads) > 1:
            raise ValueError(f"Sum of priors with different head counts {sorted(heads)}")
        gated = [type(p).__name__ for p in priors if p.gated]
        if gated:
            raise ValueError(
                f"Sum cannot hold {gated[0]} with a query gate: the gate scales its own prior's terms, "
                "not its neighbours'"
            )
        self.num_heads = heads.pop() if heads else None
        self.parts = nn.ModuleList(priors)

    def spec(self) -> list:
        """The parts' specs, in order: a list spec builds this sum again."""
        return [p.spec() for p in self.parts]

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return sum(p.log_prior(q_pos, k_pos) for p in self.parts)

    def score_terms(self, q_pos: Tensor, k_pos: Tensor, lags: Tensor) -> ScoreTerms:
        """The parts' terms, each added to its kind."""
        parts = [p.score_terms(q_pos, k_pos, lags) for p in self.parts]
        return ScoreTerms(*(sum_of_present([getattr(t, kind) for t in parts]) for kind in ScoreTerms._fields))

    @property
    def is_relative(self) -> bool:
        return all(p.is_relative for p in self.parts)

    def can_fold(self, causal: bool) -> bool:
        return all(p.can_fold(causal) for p in self.parts)

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        return concat_lanes([p.fold(q_pos, k_pos) for p in self.parts])

    def fold_slope(self) -> Tensor | None:
        return sum_of_present([p.fold_slope() for p in self.parts])

    def slope_bound(self) -> float:
        return sum(p.slope_bound() for p in self.parts)
