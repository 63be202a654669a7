"""A fleet plan on stored data: `run_plan(request, trace, ...) -> (FleetPlan, plan id)`.

The trace is a stored trace (`request.trace_id`) or a trace file, parsed and stored with
the plan only when the plan succeeds: bad input (`PlanError`) leaves nothing stored.
The latency source is the one `tune` prices with (`api.services.tuning.stored_latency`:
the newest fitted model per accelerator, else the roofline). The unit is the request's,
else the newest stored recommendation for this trace, model, GPU, SLOs and attainment
(from `servetune tune`'s runs or the service's jobs), else the core's screening
(`optimizer.plan.screen_unit`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from api.services.tuning import stored_latency
from optimizer.latency.base import LatencySource
from optimizer.plan import (
    FleetPlan,
    PlanError,
    PlanRequest,
    UnitChoice,
    UnitSource,
    build_plan,
    check_inputs,
    screen_unit,
)
from optimizer.plan.unit import describe_unit
from optimizer.search.outcome import LatencyInfo, Recommendation, TuneOutcome
from optimizer.search.sizing import unit_of
from optimizer.workload import Workload

__all__ = ["PlanError", "PlanTrace", "load_plan_trace", "run_plan", "stored_unit"]


@dataclass(frozen=True, slots=True)
class PlanTrace:
    """The trace a plan runs on: its requests, and the file to store with the plan when
    it is not stored yet (`file` None: `trace_id` names it)."""

    workload: Workload
    trace_id: int | None
    file: Path | None = None


def load_plan_trace(database_url: str, source: int | Path) -> PlanTrace:
    """A stored trace by id, or a trace file parsed (stored later, with the plan; when
    the same file is stored already, its id). `TraceNotFound` / `TraceFormatError` say
    what is wrong."""
    from optimizer.traces import parse_trace
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.traces import find_trace_by_hash, load_trace_columns

    upgrade_database(database_url)
    engine = make_engine(database_url)
    try:
        if isinstance(source, int):
            with session_scope(engine) as s:
                columns = load_trace_columns(s, source)
            return PlanTrace(Workload.from_columns(columns, name=f"trace-{source}"), source)
        parsed = parse_trace(source)
        with session_scope(engine) as s:
            found = find_trace_by_hash(s, parsed.content_hash)
        workload = Workload.from_columns(parsed.columns, name=source.stem)
        if found is not None:
            return PlanTrace(workload, found.id)
        return PlanTrace(workload, None, source)
    finally:
        engine.dispose()


def stored_unit(session: Session, request: PlanRequest) -> UnitChoice | None:
    """The unit of the newest stored recommendation for the request's trace, model, GPU,
    SLOs and attainment: from `servetune tune`'s runs or the service's jobs."""
    from storage.recommendations import (
        DeploymentFilter,
        RecommendationNotFound,
        latest_recommendation,
    )
    from storage.traces import DEFAULT_PROJECT
    from storage.tuning import finished_runs

    if request.trace_id is None:
        return None
    found: list[tuple[datetime, Recommendation, str]] = []
    for run in finished_runs(session, trace_id=request.trace_id, model=request.model):
        asked = run.request
        same = (
            list(asked.get("gpu_types") or ()) == [request.gpu]
            and asked.get("slo_ttft_ms") == request.slo_ttft_ms
            and asked.get("slo_tpot_ms") == request.slo_tpot_ms
            and asked.get("slo_e2e_ms") is None
            and asked.get("attainment", 0.9) == request.attainment
        )
        if not same or run.outcome is None:
            continue
        rec = TuneOutcome.from_dict(run.outcome).recommendation
        if rec is not None:
            found.append((run.updated_at, rec, f"tuning run {run.study_name!r}"))
            break
    where = DeploymentFilter(
        source=f"trace:{request.trace_id}",
        model=request.model,
        gpu=request.gpu,
        slo_ttft_ms=request.slo_ttft_ms,
        slo_tpot_ms=request.slo_tpot_ms,
    )
    try:
        info = latest_recommendation(session, project=DEFAULT_PROJECT, where=where)
        if info.attainment_target == request.attainment:
            found.append((info.created_at, info.recommendation, f"job {info.job_id}"))
    except RecommendationNotFound:
        pass
    if not found:
        return None
    when, rec, where_from = max(found, key=lambda f: f[0])
    unit = unit_of(rec.config, rec.predicted.num_units)
    return UnitChoice(
        unit,
        UnitSource.RECOMMENDATION,
        f"the newest stored recommendation for this trace, model, GPU and SLOs ({where_from}, "
        f"{when:%Y-%m-%d %H:%M} UTC), one unit of its {rec.predicted.num_units}: "
        f"{describe_unit(unit)}",
    )


def run_plan(
    request: PlanRequest,
    trace: PlanTrace,
    *,
    database_url: str,
    latency: LatencySource | None = None,
    num_threads: int = 1,
    on_step: Callable[[str], None] = lambda _m: None,
) -> tuple[FleetPlan, int]:
    """Make the plan (see the module docstring), store it and return it with its id.
    Raises `PlanError` (nothing stored) for bad input."""
    from api.services.ingest import ingest_trace
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.plans import save_plan

    upgrade_database(database_url)
    request = replace(request, trace_id=trace.trace_id)
    checked = check_inputs(request, trace.workload)  # the cheap refusals first
    if latency is None:
        resolved = stored_latency(database_url, request.model, num_threads)
        source, label, estimate = resolved.source, resolved.label, resolved.is_estimate
    else:
        source, label, estimate = latency, "custom latency source", False
    engine = make_engine(database_url)
    try:
        unit = None
        if request.unit is not None:
            unit = UnitChoice(
                request.unit, UnitSource.GIVEN, f"given (--unit): {describe_unit(request.unit)}"
            )
        else:
            with session_scope(engine) as s:
                unit = stored_unit(s, request)
        if unit is None:
            on_step("screening units of the default space on the busiest window")
            unit = screen_unit(request, trace.workload, checked.busiest_by_rate, source)
        # priced as tune prices: the latency models, run by the unit's engine release
        info = LatencyInfo(f"{label}; priced as {unit.config.engine_release.label}", estimate)
        plan = build_plan(request, trace.workload, checked, unit, source, info, on_step=on_step)
        with session_scope(engine) as s:
            if trace.file is not None:
                stored = ingest_trace(s, trace.file).trace
                plan = replace(plan, request=replace(plan.request, trace_id=stored.id))
            saved = save_plan(s, plan)
        return plan, saved.id
    finally:
        engine.dispose()
