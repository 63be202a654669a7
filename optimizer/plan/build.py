"""Making a plan: `check_inputs` (the cheap refusals, before any simulation), then
`build_plan`: the unit's capacity per length-mix bucket, the lower bound, the three
fleets and the reactive policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.plan.capacity import measure_capacities
from optimizer.plan.errors import PlanError
from optimizer.plan.fleets import (
    DynamicReplay,
    FleetKind,
    FleetReplay,
    reactive_note,
    scheduled_note,
    scheduled_schedule,
    size_static,
)
from optimizer.plan.lower_bound import lower_bound
from optimizer.plan.outcome import FleetPlan, TraceSummary, ordering_text
from optimizer.plan.parts import FleetRunner, PlanPart, run_fleet_part
from optimizer.plan.policy import reactive_policy
from optimizer.plan.request import PlanRequest
from optimizer.plan.unit import UnitChoice
from optimizer.plan.windows import PlanWindow, cut_windows
from optimizer.search.outcome import LatencyInfo
from optimizer.sim import max_request_tokens
from optimizer.sim.dynamic import simulate_fleet
from optimizer.sim.scaling import ColdStart, ScalingError
from optimizer.workload import Workload


@dataclass(frozen=True, slots=True)
class CheckedInput:
    """The windows and the cold start of a request its trace passed the checks with."""

    windows: tuple[PlanWindow, ...]
    cold_start: ColdStart

    @property
    def busiest_by_rate(self) -> PlanWindow:
        return max(self.windows, key=lambda w: w.rate)


def check_inputs(request: PlanRequest, workload: Workload) -> CheckedInput:
    """The refusals that need no simulation: a window longer than the trace, a trace
    shorter than two windows, a cold start longer than a window (`PlanError`)."""
    windows = cut_windows(workload, request.window_s)
    try:
        cold = ColdStart.for_model(request.model, override_s=request.cold_start_s)
    except ScalingError as exc:
        raise PlanError(str(exc)) from None
    if cold.total_s > request.window_s:
        given = "--cold-start-s" if request.cold_start_s is not None else "the default"
        raise PlanError(
            f"the cold start ({cold.total_s:,.0f} s, {given}) is longer than a window "
            f"(--window {request.window_s:g} s): a unit started for a window would serve only "
            f"after it; expected a window of at least {cold.total_s:,.0f} s or a shorter "
            "--cold-start-s"
        )
    return CheckedInput(windows, cold)


def _check_fits(unit: ServingConfig, workload: Workload) -> None:
    longest = int((workload.input_tokens + workload.output_tokens).max())
    limit = max_request_tokens(unit)
    if limit < longest:
        raise PlanError(
            f"unit: holds at most {limit:,} prompt + output tokens per request, and the "
            f"trace's longest request has {longest:,}; expected a unit that holds every "
            "request (a larger max_model_len, more KV cache or a higher TP)"
        )


def build_plan(
    request: PlanRequest,
    workload: Workload,
    checked: CheckedInput,
    unit: UnitChoice,
    latency: LatencySource,
    latency_info: LatencyInfo,
    *,
    dynamic: DynamicReplay = simulate_fleet,
    synthetic: bool = False,
    run_fleets: FleetRunner | None = None,
    on_step: Callable[[str], None] = lambda _m: None,
) -> FleetPlan:
    """The plan of `request` on `workload` with `unit` (see the package docstring).
    `dynamic` replays the scheduled and reactive fleets (the simulator's fleets that
    change size); `run_fleets` replays the three fleets' parts (`optimizer.plan.parts`:
    by default in this process, in order; the worker pool runs them as jobs). Raises
    `PlanError` for a unit that cannot hold the trace's longest request, a length mix no
    unit sustains, or a peak beyond the GPU budget."""
    config = request.priced(unit.config)
    _check_fits(config, workload)
    settings = request.eval_settings()
    windows, cold = checked.windows, checked.cold_start
    bucketing = measure_capacities(workload, windows, config, latency, settings, on_step=on_step)
    lower = lower_bound(
        windows, bucketing, config.num_gpus, config.price_per_hour(), request.gpu_budget
    )
    on_step("sizing the static fleet on the busiest window")
    static_units, static_note = size_static(workload, windows, config, lower, latency, settings)
    policy, basis = reactive_policy(windows, bucketing, lower, static_units, cold)
    part = partial(PlanPart, request, config, latency_info.label)
    parts = (
        part(FleetKind.STATIC, static_note, static_units=static_units),
        part(
            FleetKind.SCHEDULED,
            scheduled_note(cold),
            schedule=scheduled_schedule(windows, lower, cold.total_s),
        ),
        part(FleetKind.REACTIVE, reactive_note(policy), policy=policy),
    )

    def in_process(parts: tuple[PlanPart, ...]) -> tuple[FleetReplay, ...]:
        replays = []
        for p in parts:
            on_step(f"replaying the {p.kind.value} fleet on the whole trace")
            replays.append(run_fleet_part(p, workload, windows, cold, latency, settings, dynamic))
        return tuple(replays)

    fleets = (run_fleets or in_process)(parts)
    if tuple(f.kind for f in fleets) != tuple(p.kind for p in parts):
        raise ValueError(
            f"the fleet runner returned {[f.kind.value for f in fleets]}, expected the "
            f"replays of {[p.kind.value for p in parts]} in order"
        )
    trace = TraceSummary(
        workload.name, len(workload), workload.duration_s, workload.mean_rate, synthetic
    )
    return FleetPlan(
        request=request,
        trace=trace,
        latency=latency_info,
        unit=UnitChoice(config, unit.source, unit.reason),
        cold_start=cold,
        windows=windows,
        bucketing=bucketing,
        lower_bound=lower,
        fleets=fleets,
        policy=policy,
        policy_basis=basis,
        ordering=ordering_text(windows, lower, fleets, policy),
    )
