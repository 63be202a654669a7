"""A fleet plan on stored data: `make_plan(request, trace, ...) -> FleetPlan`, and
`run_plan` (`servetune plan`), which stores it: `(FleetPlan, plan id)`.

The trace is a stored trace (`request.trace_id`) or a trace file, parsed and stored with
the plan only when the plan succeeds: bad input (`PlanError`) leaves nothing stored.
The latency source is the one `tune` prices with (`api.services.tuning.stored_latency`:
the newest fitted model per accelerator, else the roofline). The unit is the request's,
else the newest stored recommendation for this trace, model, GPU, SLOs and attainment
(from `servetune tune`'s runs or the service's jobs), else the core's screening
(`optimizer.plan.screen_unit`).

A plan job from `POST /v1/plans` is checked before it is queued:
`parse_plan_request` reads the body (the unit as a `ServingConfig` document, as the
CLI's --unit YAML) and `check_plan_job` runs `check_inputs` on the stored trace, each
refusal naming the request fields at fault (`PlanInputError`); the worker then makes the
plan (`make_plan`; `api.worker.planning`), and a refusal only the plan itself finds (a
peak beyond the GPU budget) fails the job with the same message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from api.services.tuning import stored_latency
from optimizer.config import ConfigError, ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.plan import (
    FleetPlan,
    PartRunner,
    PlanError,
    PlanRequest,
    UnitChoice,
    UnitSource,
    build_plan,
    check_inputs,
    screen_unit,
)
from optimizer.plan.unit import describe_unit
from optimizer.plan.windows import cut_windows
from optimizer.search.outcome import LatencyInfo, Recommendation, TuneOutcome
from optimizer.search.sizing import unit_of
from optimizer.workload import Workload
from storage.service_records import WindowSummary
from storage.traces import DEFAULT_PROJECT

__all__ = [
    "PlanError",
    "PlanInputError",
    "PlanTrace",
    "check_plan_job",
    "load_plan_trace",
    "make_plan",
    "parse_plan_request",
    "priced_label",
    "run_plan",
    "stored_unit",
]


@dataclass(frozen=True, slots=True)
class PlanTrace:
    """The trace a plan runs on: its requests, and the file to store with the plan when
    it is not stored yet (`file` None: `trace_id` names it)."""

    workload: Workload
    trace_id: int | None
    file: Path | None = None
    synthetic: bool = False  # made by `traces synthesize` (the plan says so)


class PlanInputError(ValueError):
    """A plan request refused before it is queued: the message (the CLI's own for the
    same input) and the request fields at fault (none: the request as a whole)."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


_REQUEST_FIELDS = frozenset(f.name for f in fields(PlanRequest))
_LEADING_NAME = re.compile(r"(?:request\.)?([a-z_]+)\b")


def _fields_named(message: str) -> tuple[str, ...]:
    """The request field a `PlanError` from the request's own checks starts with
    ("slo_ttft_ms: expected ...", "request.unit: unknown keys ..."), if any."""
    m = _LEADING_NAME.match(message)
    return (m.group(1),) if m and m.group(1) in _REQUEST_FIELDS else ()


def parse_plan_request(data: object) -> PlanRequest:
    """A plan request from a JSON body: `PlanRequest`'s fields, the unit as a
    `ServingConfig` document (`ServingConfig.to_dict()`, schema_version optional: the
    CLI's --unit YAML as JSON). `PlanInputError` naming the field otherwise."""
    if not isinstance(data, Mapping):
        raise PlanInputError(f"expected a JSON object of the plan's fields, got {data!r:.80}")
    data = dict(data)
    unit = data.pop("unit", None)
    config = None
    if unit is not None:
        try:
            config = ServingConfig.from_dict(unit)
        except ConfigError as exc:
            raise PlanInputError(f"unit: {exc}", ("unit",)) from None
    try:
        request = PlanRequest.from_dict(data)
        return request if config is None else replace(request, unit=config)
    except PlanError as exc:
        raise PlanInputError(str(exc), _fields_named(str(exc))) from None


def check_plan_job(session: Session, request: PlanRequest, *, project: str) -> WindowSummary:
    """The stored trace a plan job runs on (`trace_id`, or a stream's newest upload),
    summarised, after `check_inputs` passed on it: a window longer than the trace or a
    trace shorter than two windows (`window_s` at fault), a cold start longer than a
    window (`cold_start_s` and `window_s`). `TraceNotFound` for another project's trace."""
    from api.services.stream_windows import summarize
    from storage.traces import get_trace, load_trace_columns, newest_upload

    if request.trace_id is not None:
        info = get_trace(session, request.trace_id, project=project)
    else:
        found = newest_upload(session, project=project, stream=request.stream or "")
        if found is None:
            raise PlanInputError(
                f"stream {request.stream!r} has no uploads; upload a trace with this stream "
                "name first",
                ("stream",),
            )
        info = found
    columns = load_trace_columns(session, info.id)
    workload = Workload.from_columns(columns, name=f"trace-{info.id}")
    try:
        cut_windows(workload, request.window_s)
    except PlanError as exc:
        raise PlanInputError(str(exc), ("window_s",)) from None
    try:
        check_inputs(replace(request, trace_id=info.id, stream=None), workload)
    except PlanError as exc:  # the windows passed: the cold start against a window
        raise PlanInputError(str(exc), ("cold_start_s", "window_s")) from None
    return summarize([info])


def load_plan_trace(database_url: str, source: int | Path) -> PlanTrace:
    """A stored trace by id, or a trace file parsed (stored later, with the plan; when
    the same file is stored already, its id). `TraceNotFound` / `TraceFormatError` say
    what is wrong."""
    from optimizer.traces import parse_trace
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.traces import find_trace_by_hash, get_trace, load_trace_columns

    upgrade_database(database_url)
    engine = make_engine(database_url)
    try:
        if isinstance(source, int):
            with session_scope(engine) as s:
                columns = load_trace_columns(s, source)
                synthetic = get_trace(s, source).synthetic is not None
            workload = Workload.from_columns(columns, name=f"trace-{source}")
            return PlanTrace(workload, source, synthetic=synthetic)
        parsed = parse_trace(source)
        with session_scope(engine) as s:
            found = find_trace_by_hash(s, parsed.content_hash)
        workload = Workload.from_columns(parsed.columns, name=source.stem)
        if found is not None:
            return PlanTrace(workload, found.id)
        return PlanTrace(workload, None, source)
    finally:
        engine.dispose()


def stored_unit(
    session: Session, request: PlanRequest, *, project: str = DEFAULT_PROJECT
) -> UnitChoice | None:
    """The unit of the newest stored recommendation for the request's trace, model, GPU,
    SLOs and attainment: from `servetune tune`'s runs or the project's jobs."""
    from storage.recommendations import (
        DeploymentFilter,
        RecommendationNotFound,
        latest_recommendation,
    )
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
        info = latest_recommendation(session, project=project, where=where)
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


def make_plan(
    request: PlanRequest,
    trace: PlanTrace,
    *,
    database_url: str,
    project: str = DEFAULT_PROJECT,
    latency: LatencySource | None = None,
    num_threads: int = 1,
    run_parts: PartRunner | None = None,
    jobs: int = 1,
    on_step: Callable[[str], None] = lambda _m: None,
) -> FleetPlan:
    """Make the plan (see the module docstring) without storing it: its request names
    `trace.trace_id` (None for a trace file not stored yet). `run_parts` runs its parts
    (`build_plan`; by default in this process, over `jobs` forked processes). Raises
    `PlanError` for bad input."""
    from storage.db import make_engine, session_scope, upgrade_database

    upgrade_database(database_url)
    request = replace(request, trace_id=trace.trace_id)
    checked = check_inputs(request, trace.workload)  # the cheap refusals first
    if latency is None:
        resolved = stored_latency(database_url, request.model, num_threads)
        source, label, estimate = resolved.source, resolved.label, resolved.is_estimate
    else:
        source, label, estimate = latency, "custom latency source", False
    unit = None
    if request.unit is not None:
        unit = UnitChoice(
            request.unit, UnitSource.GIVEN, f"given (--unit): {describe_unit(request.unit)}"
        )
    else:
        engine = make_engine(database_url)
        try:
            with session_scope(engine) as s:
                unit = stored_unit(s, request, project=project)
        finally:
            engine.dispose()
    if unit is None:
        on_step("screening units of the default space on the busiest window")
        unit = screen_unit(request, trace.workload, checked.busiest_by_rate, source)
    # priced as tune prices: the latency models, run by the unit's engine release
    info = LatencyInfo(priced_label(label, unit.config), estimate)
    return build_plan(
        request,
        trace.workload,
        checked,
        unit,
        source,
        info,
        on_step=on_step,
        synthetic=trace.synthetic,
        run_parts=run_parts,
        jobs=jobs,
    )


def priced_label(label: str, unit: ServingConfig) -> str:
    """How a plan names what priced it: the latency source's label and the engine
    release the unit runs (the latency models are run by it)."""
    return f"{label}; priced as {unit.engine_release.label}"


def run_plan(
    request: PlanRequest,
    trace: PlanTrace,
    *,
    database_url: str,
    latency: LatencySource | None = None,
    num_threads: int = 1,
    jobs: int = 1,
    on_step: Callable[[str], None] = lambda _m: None,
) -> tuple[FleetPlan, int]:
    """Make the plan (`make_plan`), store it (with its trace file, when it was one) and
    return it with its id. Raises `PlanError` (nothing stored) for bad input."""
    from api.services.ingest import ingest_trace
    from storage.db import make_engine, session_scope
    from storage.plans import save_plan

    plan = make_plan(
        request,
        trace,
        database_url=database_url,
        latency=latency,
        num_threads=num_threads,
        jobs=jobs,
        on_step=on_step,
    )
    engine = make_engine(database_url)
    try:
        with session_scope(engine) as s:
            if trace.file is not None:
                stored = ingest_trace(s, trace.file).trace
                plan = replace(plan, request=replace(plan.request, trace_id=stored.id))
            saved = save_plan(s, plan)
        return plan, saved.id
    finally:
        engine.dispose()
