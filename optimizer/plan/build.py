"""Making a plan: `check_inputs` (the cheap refusals, before any simulation), then
`build_plan`: the unit's capacity per length-mix bucket, the lower bound, the three
fleets and the reactive policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.plan.capacity import capacity_groups
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
from optimizer.plan.parts import (
    CapacityPart,
    FleetPart,
    PartInputs,
    PartResult,
    PartRunner,
    PlanPart,
    run_plan_part,
    run_plan_parts,
)
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


def _answers(part: PlanPart, result: PartResult) -> bool:
    if part.capacity is not None:
        return result.bucket is not None and result.bucket.index == part.capacity.bucket
    assert part.fleet is not None
    return result.fleet is not None and result.fleet.kind is part.fleet.kind


def _results(run: PartRunner, parts: tuple[PlanPart, ...]) -> tuple[PartResult, ...]:
    """`run`'s results of `parts`, checked to answer each part in order."""
    results = run(parts)
    if len(results) != len(parts) or not all(map(_answers, parts, results)):
        raise ValueError(f"the part runner did not answer {[p.describe() for p in parts]} in order")
    return results


def _replay_fleets(
    run: PartRunner, part: Callable[..., PlanPart], fleets: tuple[FleetPart, ...]
) -> tuple[FleetReplay, ...]:
    """Each fleet replayed on the whole trace. A fleet that can never change size and has
    the units of one replayed before it is that fleet (`FleetPart.fixed_units`): its
    replay stands for it, not run again."""
    first: dict[int, int] = {}  # fixed units -> the fleet replayed for them
    alias: list[int | None] = []
    for i, f in enumerate(fleets):
        n = f.fixed_units
        alias.append(first.get(n) if n is not None else None)
        if n is not None:
            first.setdefault(n, i)
    todo = [i for i, a in enumerate(alias) if a is None]
    replays = _results(run, tuple(part(fleet=fleets[i]) for i in todo))
    done = {i: r.fleet for i, r in zip(todo, replays, strict=True)}
    out = []
    for i, f in enumerate(fleets):
        a = alias[i]
        if a is None:
            replay = done[i]
        else:
            n = f.fixed_units
            replay = replace(
                done[a],
                kind=f.kind,
                note=f"{f.note}; it holds {n} unit{'s' if n != 1 else ''} throughout, as the "
                f"{fleets[a].kind.value} fleet does: the {fleets[a].kind.value} fleet's replay "
                "stands for it",
            )
        assert replay is not None
        out.append(replay)
    return tuple(out)


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
    run_parts: PartRunner | None = None,
    jobs: int = 1,
    on_step: Callable[[str], None] = lambda _m: None,
) -> FleetPlan:
    """The plan of `request` on `workload` with `unit` (see the package docstring).
    `dynamic` replays the scheduled and reactive fleets (the simulator's fleets that
    change size); `run_parts` runs the plan's parts, the capacity searches and then the
    fleets' replays (`optimizer.plan.parts`: by default in this process, in order, or
    over `jobs` forked processes; the worker pool runs them as jobs). Raises `PlanError`
    for a unit that cannot hold the trace's longest request, a length mix no unit
    sustains, or a peak beyond the GPU budget."""
    config = request.priced(unit.config)
    _check_fits(config, workload)
    settings = request.eval_settings()
    windows, cold = checked.windows, checked.cold_start
    part = partial(PlanPart, request, config, latency_info.label)
    inputs = PartInputs(workload, windows, cold, latency, settings, dynamic)

    def in_process(parts: tuple[PlanPart, ...]) -> tuple[PartResult, ...]:
        if jobs > 1 and len(parts) > 1:
            what = ", ".join(p.describe() for p in parts)
            on_step(f"{what} in {min(jobs, len(parts))} processes")
            return run_plan_parts(parts, inputs, jobs=jobs)
        results = []
        for p in parts:
            if p.capacity is not None:
                on_step(f"capacity of length-mix bucket {p.capacity.bucket + 1}/{len(parts)}")
            else:
                on_step(f"{p.describe()} on the whole trace")
            results.append(run_plan_part(p, inputs, jobs=jobs))
        return tuple(results)

    run = run_parts or in_process
    groups = capacity_groups(workload, windows, settings)
    buckets = _results(
        run, tuple(part(capacity=CapacityPart(b, groups)) for b in range(groups.num_buckets))
    )
    bucketing = groups.bucketing(workload, tuple(r.bucket for r in buckets if r.bucket is not None))
    lower = lower_bound(
        windows, bucketing, config.num_gpus, config.price_per_hour(), request.gpu_budget
    )
    on_step("sizing the static fleet on the busiest window")
    static_units, static_note = size_static(workload, windows, config, lower, latency, settings)
    policy, basis = reactive_policy(windows, bucketing, lower, static_units, cold)
    fleet_parts = (
        FleetPart(FleetKind.STATIC, static_note, static_units=static_units),
        FleetPart(
            FleetKind.SCHEDULED,
            scheduled_note(cold),
            schedule=scheduled_schedule(windows, lower, cold.total_s),
        ),
        FleetPart(FleetKind.REACTIVE, reactive_note(policy), policy=policy),
    )
    fleets = _replay_fleets(run, part, fleet_parts)
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
