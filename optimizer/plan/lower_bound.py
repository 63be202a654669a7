"""The perfect-system lower bound (DOMAIN.md §11): with instant scaling and no waste, a
window needs units(t) = ceil(rate(t) / capacity(t)), capacity being one unit's
SLO-bounded rate for the window's length mix; GPU-hours = sum of units(t) x GPUs per unit
x the window's hours. No real fleet can beat it. A window with no request needs none."""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.plan.capacity import Bucketing
from optimizer.plan.errors import PlanError
from optimizer.plan.windows import PlanWindow


@dataclass(frozen=True, slots=True)
class LowerBound:
    """Units per window for a perfect system, and what they add up to."""

    units: tuple[int, ...]  # per window
    unit_gpus: int
    gpu_hours: float
    peak_gpus: int
    mean_gpus: float  # time-weighted over the trace
    dollars: float | None  # None without a price

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(n * self.unit_gpus for n in self.units)


def units_needed(rate: float, capacity: float) -> int:
    """ceil(rate / capacity), with a relative tolerance for a rate that is a whole
    multiple of the capacity up to rounding."""
    if rate <= 0:
        return 0
    return max(1, math.ceil(rate / capacity - 1e-9))


def lower_bound(
    windows: tuple[PlanWindow, ...],
    bucketing: Bucketing,
    unit_gpus: int,
    unit_price_per_hour: float | None,
    gpu_budget: int,
) -> LowerBound:
    """The lower bound per window (see the module docstring). Raises `PlanError` naming
    the window when a window's mix has no sustainable rate, or when its units need more
    GPUs than `gpu_budget`."""
    units = []
    for w in windows:
        cap = bucketing.capacity_of(w.index)
        if cap is None:
            units.append(0)
            continue
        if cap <= 0:
            raise PlanError(
                f"{w.label()}: one unit meets the SLOs for no rate of this length mix "
                f"(mean {w.mean_input_tokens:,.0f} prompt / {w.mean_output_tokens:,.0f} output "
                "tokens); expected SLOs the unit can meet: loosen them or pick a larger unit"
            )
        units.append(units_needed(w.rate, cap))
    worst = max(windows, key=lambda w: (units[w.index], w.rate))
    need = units[worst.index] * unit_gpus
    if need > gpu_budget:
        cap = bucketing.capacity_of(worst.index)
        short = need - gpu_budget
        raise PlanError(
            f"the peak needs more than --gpus {gpu_budget}: {worst.label()} brings "
            f"{worst.rate:,.2f} req/s, and at the unit's capacity of {cap:,.2f} req/s for its "
            f"length mix even a perfect system needs {units[worst.index]} units = {need} GPUs, "
            f"{short} GPUs ({short / gpu_budget:.0%}) over the budget; expected --gpus of at "
            f"least {need}"
        )
    total_s = windows[-1].end_s - windows[0].start_s
    gpu_s = sum(n * unit_gpus * w.duration_s for n, w in zip(units, windows, strict=True))
    hours = gpu_s / 3600.0
    dollars = None if unit_price_per_hour is None else hours / unit_gpus * unit_price_per_hour
    return LowerBound(
        units=tuple(units),
        unit_gpus=unit_gpus,
        gpu_hours=hours,
        peak_gpus=need,
        mean_gpus=gpu_s / total_s,
        dollars=dollars,
    )
