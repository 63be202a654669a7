"""`FleetPlan`: a plan's answer, as printed, stored and drawn: (a) the unit and its
capacity, (b) the lower bound per window, (c) the static, scheduled and reactive fleets,
(e) the reactive policy (its KEDA YAML is `optimizer.plan.keda`); the picture (d) is
`optimizer.plan.report`. JSON round trip with `schema_version`."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.plan.capacity import Bucketing
from optimizer.plan.errors import PlanError
from optimizer.plan.fleets import FleetKind, FleetReplay
from optimizer.plan.lower_bound import LowerBound
from optimizer.plan.policy import PolicyBasis
from optimizer.plan.request import PlanRequest
from optimizer.plan.unit import UnitChoice
from optimizer.plan.windows import PlanWindow
from optimizer.search.outcome import LatencyInfo
from optimizer.sim.scaling import AutoscalerPolicy, ColdStart

PLAN_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class TraceSummary:
    name: str
    num_requests: int
    span_s: float  # first to last arrival
    mean_rate: float  # requests/s over the span
    synthetic: bool = False  # made by `traces synthesize` (said wherever it shows)


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """One plan (see the module docstring). `fleets` holds static, scheduled and reactive,
    in that order; `ordering` says whether their GPU-hours fall in the expected order
    (lower bound <= scheduled <= reactive <= static) and, where not, why."""

    request: PlanRequest
    trace: TraceSummary
    latency: LatencyInfo
    unit: UnitChoice
    cold_start: ColdStart
    windows: tuple[PlanWindow, ...]
    bucketing: Bucketing
    lower_bound: LowerBound
    fleets: tuple[FleetReplay, ...]
    policy: AutoscalerPolicy
    policy_basis: PolicyBasis
    ordering: str

    def fleet(self, kind: FleetKind) -> FleetReplay:
        return next(f for f in self.fleets if f.kind is kind)

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        assert isinstance(out, dict)
        return {"schema_version": PLAN_SCHEMA_VERSION, **out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FleetPlan:
        if not isinstance(data, Mapping):
            raise PlanError(f"plan: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", None)
        if version != PLAN_SCHEMA_VERSION:
            raise PlanError(
                f"plan.schema_version: {version!r} is not supported (this build reads "
                f"{PLAN_SCHEMA_VERSION})"
            )
        try:
            built = from_plain(cls, data, "plan")
        except (PlainDataError, ValueError) as exc:
            raise PlanError(str(exc)) from None
        assert isinstance(built, FleetPlan)
        return built


def ordering_text(lower: LowerBound, fleets: tuple[FleetReplay, ...]) -> str:
    """Whether GPU-hours run lower bound <= scheduled <= reactive <= static, and why not
    where they do not (figures not yet known are named and skipped)."""
    by_kind = {f.kind: f for f in fleets}
    chain: list[tuple[str, float]] = [("lower bound", lower.gpu_hours)]
    unknown = []
    for kind in (FleetKind.SCHEDULED, FleetKind.REACTIVE, FleetKind.STATIC):
        f = by_kind[kind]
        if f.gpu_hours is None:
            unknown.append(kind.value)
        else:
            chain.append((kind.value, f.gpu_hours))
    shown = " <= ".join(f"{name} {hours:,.1f}" for name, hours in chain)
    broken = [(a, b) for a, b in itertools.pairwise(chain) if a[1] > b[1] * (1 + 1e-9)]
    skipped = f" ({', '.join(unknown)}: not yet simulated)" if unknown else ""
    if not broken:
        return f"GPU-hours in the expected order: {shown}{skipped}"
    static = by_kind[FleetKind.STATIC]
    reasons = []
    for (a, ha), (b, hb) in broken:
        why = _why(a, b, lower, static)
        reasons.append(f"{a} {ha:,.1f} > {b} {hb:,.1f}: {why}")
    return f"GPU-hours out of the expected order{skipped}: " + "; ".join(reasons)


def _why(a: str, b: str, lower: LowerBound, static: FleetReplay) -> str:
    static_units = static.peak_units or 0
    peak = max(lower.units)
    if b == FleetKind.STATIC.value and static_units < peak:
        missed = ""
        if static.windows_meeting_target is not None:
            busy = sum(1 for a in static.window_attainment if a is not None)
            missed = f"; it meets the target in {static.windows_meeting_target} of {busy} windows"
        return (
            f"the static fleet ({static_units} units, sized on the busiest window's mix) is "
            f"smaller than the lower bound's peak ({peak} units, from another window's mix)"
            f"{missed}"
        )
    if a == FleetKind.SCHEDULED.value:
        return (
            "the schedule's early starts (each added unit held one cold start before its "
            "window) cost more than the static fleet's spare capacity"
        )
    return "the cheaper fleet does not hold the target everywhere (see its attainment)"
