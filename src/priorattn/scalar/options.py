"""The options of the ``"scalar"``, ``"hybrid"`` and ``"mixed"`` mechanisms: what
``GPTConfig.attention_options`` holds for them, saved nested in a run's ``config.json``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

from .regularizers import Regularization
from .temperature import TAU_FLOOR, TAU_KINDS, check_train_length


@dataclass(frozen=True)
class ScalarOptions:
    """The scalar heads of a layer (seed 002) and the regularizers that train them.

    - ``heads``: the scalar heads of a ``"mixed"`` layer, beside its dot-product heads (``None``:
      half of ``n_heads``); only for ``"mixed"``.
    - ``groups``: the value groups of the scalar heads (``None``: one per head).
    - ``tau``: how the bandwidth tau is shared: one for every head, one per head, or one per
      head and token (``TAU_KINDS``).
    - ``tau_init``: the starting bandwidth.
    - ``tau_cap``: the largest bandwidth (``None``: no cap).
    - ``tau_length_scaling``: a length ``T``: a query seeing ``n > T`` keys uses tau
      ``(T / n)^2``, in training and after; with ``T`` below ``seq_len`` the model learns local
      attention (docs/scalar_experiments.md section 8). ``None``: no rule.
    - ``sink``: a sink key at 0 with a learned value on the scalar heads.
    - ``reg_align``, ``reg_spread``, ``reg_tau``: the weights of the regularizers ``L_align``,
      ``L_spread``, ``L_tau`` in the training loss (seed 002 "Regularization for Efficient
      Inference"; 0: off).
    - ``reg_align_start``, ``reg_spread_start``, ``reg_tau_start``: the step each term starts at.
    - ``reg_spread_range``: ``L_spread``'s target range ``(a, b)`` with ``a < b``; ``None`` (the
      flag's ``adaptive``): the mean +- 3 standard deviations.
    """

    heads: int | None = None
    groups: int | None = None
    tau: str = "head"
    tau_init: float = 0.1
    tau_cap: float | None = None
    tau_length_scaling: int | None = None
    sink: bool = False
    reg_align: float = 0.0
    reg_spread: float = 0.0
    reg_tau: float = 0.0
    reg_align_start: int = 0
    reg_spread_start: int = 0
    reg_tau_start: int = 0
    reg_spread_range: tuple[float, float] | None = (-3.0, 3.0)

    #: Where a config saved before the options existed held them: the ``scalar_*`` fields of its
    #: ``GPTConfig`` and the ``reg_*`` fields of its ``TrainConfig``.
    LEGACY_FIELDS: ClassVar[dict[str, str]] = {
        "scalar_heads": "heads",
        "scalar_groups": "groups",
        "scalar_tau": "tau",
        "scalar_tau_init": "tau_init",
        "scalar_tau_cap": "tau_cap",
        "scalar_tau_length_scaling": "tau_length_scaling",
        "scalar_sink": "sink",
        **{f"reg_{name}": f"reg_{name}" for name in ("align", "spread", "tau")},
        **{f"reg_{name}_start": f"reg_{name}_start" for name in ("align", "spread", "tau")},
        "reg_spread_range": "reg_spread_range",
    }

    def __post_init__(self):
        for name in ("heads", "groups"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or a positive int, got {value!r}")
        if self.tau not in TAU_KINDS:
            raise ValueError(f"tau must be one of {TAU_KINDS}, got {self.tau!r}")
        init, cap = self.tau_init, self.tau_cap
        number = isinstance(init, (int, float)) and not isinstance(init, bool)
        if not number or not math.isfinite(init) or init <= TAU_FLOOR:
            raise ValueError(f"tau_init must be a finite number > {TAU_FLOOR}, got {init!r}")
        if cap is not None and not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > init):
            raise ValueError(f"tau_cap must be a finite number above tau_init={init}, got {cap!r}")
        check_train_length(self.tau_length_scaling, "tau_length_scaling")
        if not isinstance(self.sink, bool):
            raise ValueError(f"sink must be True or False, got {self.sink!r}")
        if self.reg_spread_range is not None:  # a list after a JSON round trip
            spread_range = tuple(self.reg_spread_range)
            if len(spread_range) != 2 or not all(isinstance(x, int | float) for x in spread_range):
                raise ValueError(f"reg_spread_range must be two numbers (a, b) or None, got {spread_range!r}")
            object.__setattr__(self, "reg_spread_range", tuple(float(x) for x in spread_range))
        self.regularization()  # checks the weights, start steps and range

    def regularization(self) -> Regularization:
        """The ``reg_*`` options without their prefix: the regularizers' weights and schedule."""
        names = {f.name for f in fields(Regularization)}
        return Regularization(
            **{f.name[4:]: getattr(self, f.name) for f in fields(self) if f.name[4:] in names}
        )
