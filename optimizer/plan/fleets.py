"""The three fleets a plan compares, each replayed on the whole trace:

- **static**: sized for the peak as `tune` sizes (the fewest units that meet the target
  on the busiest window: `TraceEvaluator.verify` on that window, at its busiest 60 s
  and at its own rate), then replayed on the whole trace with `optimizer.sim.simulate`;
- **scheduled**: the lower bound's units per window, each window's extra units started
  one cold start before the window (so they serve from its start) and removed at its
  end;
- **reactive**: an `AutoscalerPolicy` (HPA / KEDA on vLLM's gauges).

The scheduled and reactive fleets change size: a `DynamicReplay` replays them, by
default the simulator's `optimizer.sim.dynamic.simulate_fleet` (units that join serve
after a cold start, units that leave drain, the routers see ready units only). Every
fleet's GPU-hours are those of the units it held (provisioned: starting, serving or
draining) over the trace's windows. Here the fleets are sized (`size_static`,
`scheduled_schedule`) and a replay's figures read (`fleet_from_run`); each replay runs as
a part of the plan (`optimizer.plan.parts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.plan.lower_bound import LowerBound
from optimizer.plan.windows import PlanWindow
from optimizer.search.evaluation import EvalSettings
from optimizer.search.trace_evaluator import TraceEvaluator
from optimizer.sim import SLO
from optimizer.sim.scaling import AutoscalerPolicy, ColdStart, FleetRun, ReplicaSchedule
from optimizer.workload import Workload


class FleetKind(StrEnum):
    STATIC = "static"
    SCHEDULED = "scheduled"
    REACTIVE = "reactive"


@dataclass(frozen=True, slots=True)
class FleetReplay:
    """One fleet replayed over the trace: the units it held and those ready to serve over
    time (from the trace's first arrival), what they cost, and how its requests fared."""

    kind: FleetKind
    note: str  # how it was sized
    schedule: ReplicaSchedule  # units held (provisioned) over time
    ready: ReplicaSchedule  # units ready to serve over time
    gpu_hours: float
    dollars: float | None  # None: no price given
    num_cold_starts: int
    attainment: float  # over the whole trace
    window_attainment: tuple[float | None, ...]  # per window (None: no request)
    worst_window: int | None  # the window with the lowest attainment (None: no request)
    windows_meeting_target: int  # windows with requests at or above the target

    @property
    def peak_units(self) -> int:
        return self.schedule.peak


class DynamicReplay(Protocol):
    """The replay of a fleet that changes size (`optimizer.sim.dynamic.simulate_fleet`): `unit`
    replicas following `fleet` (a schedule of desired units, or an autoscaler's policy),
    `initial_units` ready at the trace's start, every joining unit serving after
    `cold_start.total_s`, every leaving unit draining; the router sees ready units
    only."""

    def __call__(
        self,
        workload: Workload,
        unit: ServingConfig,
        latency: LatencySource,
        *,
        fleet: ReplicaSchedule | AutoscalerPolicy,
        initial_units: int,
        cold_start: ColdStart,
        seed: int,
        slo: SLO,
    ) -> FleetRun: ...


def window_attainment(
    run: FleetRun, windows: tuple[PlanWindow, ...], slo: SLO
) -> tuple[float | None, ...]:
    """The share of each window's requests (by arrival) that met the SLOs."""
    ok = run.result.meets(slo)
    return tuple(float(ok[w.first : w.stop].mean()) if w.num_requests else None for w in windows)


def fleet_from_run(
    kind: FleetKind,
    run: FleetRun,
    windows: tuple[PlanWindow, ...],
    unit: ServingConfig,
    settings: EvalSettings,
    note: str,
) -> FleetReplay:
    """A replayed fleet's figures: GPU-hours of the units it held over the trace, its
    attainment over the trace and per window, its worst window and its cold starts."""
    start, end = windows[0].start_s, windows[-1].end_s
    unit_hours = run.provisioned.replica_seconds(start, end) / 3600.0
    price = unit.price_per_hour()
    per_window = window_attainment(run, windows, settings.slo)
    measured = [(a, i) for i, a in enumerate(per_window) if a is not None]
    worst = min(measured)[1] if measured else None
    return FleetReplay(
        kind=kind,
        note=note,
        schedule=run.provisioned,
        ready=run.ready,
        gpu_hours=unit_hours * unit.num_gpus,
        dollars=None if price is None else unit_hours * price,
        num_cold_starts=run.num_cold_starts,
        attainment=run.result.attainment(settings.slo),
        window_attainment=per_window,
        worst_window=worst,
        windows_meeting_target=sum(a >= settings.attainment for a, _ in measured),
    )


def busiest_window(windows: tuple[PlanWindow, ...], lower: LowerBound) -> PlanWindow:
    """The window needing the most units at the lower bound (the highest rate among
    equals): its mix and rate together."""
    return max(windows, key=lambda w: (lower.units[w.index], w.rate))


def size_static(
    workload: Workload,
    windows: tuple[PlanWindow, ...],
    unit: ServingConfig,
    lower: LowerBound,
    latency: LatencySource,
    settings: EvalSettings,
) -> tuple[int, str]:
    """The static fleet's units and how they were sized (see the module docstring): the
    fewest that meet the target on the busiest window, from the lower bound's count
    there (the largest within --gpus when none does). Its replay on the whole trace is
    `optimizer.plan.parts.run_plan_part`."""
    peak = busiest_window(windows, lower)
    window = workload.slice(peak.first, peak.stop)
    evaluator = TraceEvaluator.for_trace(window, latency, settings)
    verified = evaluator.verify(unit, max(1, lower.units[peak.index]))
    n = verified.evaluation.num_units
    held = "meets" if verified.evaluation.feasible else "misses (the largest within --gpus)"
    note = (
        f"{n} unit{'s' if n != 1 else ''} sized for the busiest window, {peak.label()} at "
        f"{peak.rate:,.2f} req/s "
        f"(its busiest {settings.peak_window_s:g} s: "
        f"{evaluator.evaluated.peak_rate:,.2f} req/s), where it {held} the target; replayed "
        "on the whole trace"
    )
    return n, note


def scheduled_schedule(
    windows: tuple[PlanWindow, ...], lower: LowerBound, cold_start_s: float
) -> ReplicaSchedule:
    """The lower bound's units, each window's extra units started `cold_start_s` before
    it (held from then on) and the surplus removed at the window's start: from
    start(k) - cold to start(k) the fleet holds max(units(k-1), units(k)). The first
    window's units are ready at the trace's start."""
    times: list[float] = [windows[0].start_s]
    counts: list[int] = [lower.units[0]]
    for w in windows[1:]:
        before, now = lower.units[w.index - 1], lower.units[w.index]
        early = w.start_s - cold_start_s
        if now > before and cold_start_s > 0:
            # A cold start no longer than a window (checked) starts within the window
            # before; a step at the same time as the last one replaces it.
            times.append(max(early, times[-1]))
            counts.append(now)
        times.append(w.start_s)
        counts.append(now)
    return _merged(times, counts)


def _merged(times: list[float], counts: list[int]) -> ReplicaSchedule:
    """The steps with equal neighbours merged and equal times kept last."""
    out_t: list[float] = []
    out_c: list[int] = []
    for t, c in zip(times, counts, strict=True):
        if out_t and t <= out_t[-1]:
            out_c[-1] = c
        elif out_c and c == out_c[-1]:
            continue
        else:
            out_t.append(t)
            out_c.append(c)
    return ReplicaSchedule(tuple(out_t), tuple(out_c))


def scheduled_note(cold_start: ColdStart) -> str:
    return (
        f"the lower bound's units per window, each added unit started "
        f"{cold_start.total_s:.0f} s (a cold start) before its window"
    )


def reactive_note(policy: AutoscalerPolicy) -> str:
    return (
        f"an HPA on {policy.metric.value} per unit, target {policy.target:g}, "
        f"{policy.min_replicas}-{policy.max_replicas} units"
    )


def replay_dynamic(
    kind: FleetKind,
    replay: DynamicReplay,
    workload: Workload,
    windows: tuple[PlanWindow, ...],
    unit: ServingConfig,
    fleet: ReplicaSchedule | AutoscalerPolicy,
    cold_start: ColdStart,
    latency: LatencySource,
    settings: EvalSettings,
    note: str,
) -> FleetReplay:
    """A scheduled or reactive fleet replayed by `replay`, starting with the units the
    fleet wants at the trace's start ready."""
    if isinstance(fleet, ReplicaSchedule):
        initial = fleet.count_at(windows[0].start_s)
    else:
        initial = fleet.min_replicas
    run = replay(
        workload,
        unit,
        latency,
        fleet=fleet,
        initial_units=initial,
        cold_start=cold_start,
        seed=settings.seed,
        slo=settings.slo,
    )
    return fleet_from_run(kind, run, windows, unit, settings, note)


def mean_units(schedule: ReplicaSchedule, windows: tuple[PlanWindow, ...]) -> np.ndarray:
    """The units a schedule holds in each window, time-weighted."""
    return np.array([schedule.replica_seconds(w.start_s, w.end_s) / w.duration_s for w in windows])
