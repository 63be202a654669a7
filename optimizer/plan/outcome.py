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

PLAN_SCHEMA_VERSION = 2


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


def ordering_text(
    windows: tuple[PlanWindow, ...],
    lower: LowerBound,
    fleets: tuple[FleetReplay, ...],
    policy: AutoscalerPolicy,
) -> str:
    """Whether GPU-hours run lower bound <= scheduled <= reactive <= static, and why not
    where they do not (from the replays' own figures)."""
    by_kind = {f.kind: f for f in fleets}
    chain: list[tuple[str, float]] = [("lower bound", lower.gpu_hours)]
    for kind in (FleetKind.SCHEDULED, FleetKind.REACTIVE, FleetKind.STATIC):
        chain.append((kind.value, by_kind[kind].gpu_hours))
    shown = " <= ".join(f"{name} {hours:,.1f}" for name, hours in chain)
    broken = [(a, b) for a, b in itertools.pairwise(chain) if a[1] > b[1] * (1 + 1e-9)]
    if not broken:
        return f"GPU-hours in the expected order: {shown}"
    reasons = []
    for (a, ha), (b, hb) in broken:
        why = _why(a, b, windows, lower, by_kind, policy)
        reasons.append(f"{a} {ha:,.1f} > {b} {hb:,.1f}: {why}")
    return "GPU-hours out of the expected order: " + "; ".join(reasons)


def _why(
    a: str,
    b: str,
    windows: tuple[PlanWindow, ...],
    lower: LowerBound,
    by_kind: dict[FleetKind, FleetReplay],
    policy: AutoscalerPolicy,
) -> str:
    static = by_kind[FleetKind.STATIC]
    reactive = by_kind[FleetKind.REACTIVE]
    busy = [w for w in windows if w.num_requests]
    if a == FleetKind.SCHEDULED.value and b == FleetKind.REACTIVE.value:
        below = sum(
            1
            for w in busy
            if reactive.schedule.replica_seconds(w.start_s, w.end_s) / w.duration_s
            < lower.units[w.index]
        )
        met = f"it meets the target in {reactive.windows_meeting_target} of {len(busy)} windows"
        if below:
            return (
                f"the reactive fleet held fewer units than the lower bound's "
                f"ceil(rate / capacity) in {below} of {len(busy)} windows with requests "
                f"(time-weighted); {met}"
            )
        return (
            "the scheduled fleet's early starts (one cold start before each window that adds "
            "units) and draining units cost more than the reactive fleet holds above the "
            f"lower bound; {met}"
        )
    if a == FleetKind.REACTIVE.value and b == FleetKind.STATIC.value:
        span = windows[-1].end_s - windows[0].start_s
        mean = reactive.schedule.replica_seconds(windows[0].start_s, windows[-1].end_s) / span
        why = (
            f"the reactive fleet held {mean:,.2f} units on average against the static "
            f"fleet's {static.peak_units} (its peak: {reactive.peak_units}, "
            f"{reactive.num_cold_starts} cold starts): it adds units once the gauge's mean "
            f"passes {policy.target:g} per unit by over {policy.tolerance:.0%} and lowers its "
            f"count only to the highest recommendation of the last "
            f"{policy.scale_down_stabilization_s:g} s"
        )
        peak = max(lower.units)
        if static.peak_units < peak:
            why += (
                f"; the static fleet is smaller than the lower bound's peak ({peak} units): "
                "the lower bound divides each window's rate by one unit's capacity measured "
                "alone, and the static fleet, verified on the window of that peak, serves "
                "more per unit there (units behind one router share their queueing)"
            )
        return why
    # lower bound > scheduled: the replay held fewer units than the schedule asks for,
    # which holds the lower bound's units in every window
    return "the scheduled fleet held fewer units than its schedule, which is not expected"
