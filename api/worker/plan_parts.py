"""A plan's independent pieces as jobs of the worker pool, so that the workers of several
machines sharing one database split one plan.

A plan job has two stages of independent work (`optimizer.plan.parts`): the capacity
search of each length-mix bucket, then, once the fleets are sized from those, the three
fleets' replays. At each stage it queues the pieces as `plan_part` jobs of its own
(`pool_parts`; each a `PlanPart` document, its parent the plan job). Any worker claims a
part as it claims any job and runs `run_part_job`: the stored trace, the stored latency
models, the part; its `PartResult` is stored in the part's row. The plan job's worker,
while it waits, claims and runs its own parts too (`JobContext.run_part`), so one worker
alone finishes a plan; when every part of a stage has succeeded it goes on, and at the
end stores the plan, which is the plan the in-process path makes (the same simulations
on the same inputs).

- A part that fails (or is abandoned after its workers kept dying, or is cancelled)
  fails the plan job with the part's error; its other parts are cancelled and no plan
  is stored.
- A plan job cancelled while it waits cancels its unfinished parts and stores nothing.
- A worker that dies mid-part loses its lease, and the part is claimed again by another
  worker, as any job is; a worker that dies mid-plan does the same to the plan job, and
  the worker that takes it over runs the plan again, waiting on the parts the dead one
  queued (those that succeeded are not run again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from api.services.planning import load_plan_trace, priced_label
from api.services.tuning import stored_latency
from api.settings import get_settings
from api.worker.context import JobContext, JobFailed, JobStopped
from optimizer.plan import (
    PartInputs,
    PartResult,
    PartRunner,
    PlanError,
    PlanPart,
    run_plan_part,
)
from optimizer.plan.build import check_inputs
from optimizer.sim.dynamic import simulate_fleet
from optimizer.workload import Workload
from storage.db import make_engine, session_scope
from storage.jobs import JobPart, cancel_parts, enqueue_job, job_parts
from storage.service_records import JobStatus
from storage.traces import get_trace

_last_trace: dict[tuple[str, int, str], Workload] = {}


def _stored_trace(storage_url: str, trace_id: int) -> Workload:
    """A stored trace's requests. A worker keeps the last one it read (a plan's parts
    share their trace), keyed by its content hash as well as its id (an id may be reused
    after a delete on SQLite). `TraceNotFound` when it is gone."""
    engine = make_engine(storage_url)
    try:
        with session_scope(engine) as s:
            key = (storage_url, trace_id, get_trace(s, trace_id).content_hash)
    finally:
        engine.dispose()
    if key not in _last_trace:
        workload = load_plan_trace(storage_url, trace_id).workload
        _last_trace.clear()
        _last_trace[key] = workload
    return _last_trace[key]


def run_part_job(ctx: JobContext) -> PartResult:
    """The executor of a `plan_part` job: its part run on the plan's stored trace, priced
    by the stored latency models (the part fails when they are not the ones the plan was
    priced with)."""
    part = ctx.job.params
    if not isinstance(part, PlanPart):
        raise JobFailed(f"a plan part's params are a plan part, not {type(part).__name__}")
    request = part.request
    if request.trace_id is None:
        raise JobFailed("the plan part names no stored trace")
    try:
        workload = _stored_trace(ctx.storage_url, request.trace_id)
        checked = check_inputs(request, workload)
    except (LookupError, PlanError) as exc:  # the trace was deleted since
        raise JobFailed(str(exc)) from exc
    resolved = stored_latency(ctx.storage_url, request.model, get_settings().native_threads)
    label = priced_label(resolved.label, part.unit)
    if label != part.latency:
        raise JobFailed(
            f"the stored latency models changed since the plan was sized: it was priced "
            f"with {part.latency!r}, this worker finds {label!r}; queue the plan again"
        )
    inputs = PartInputs(
        workload,
        checked.windows,
        checked.cold_start,
        resolved.source,
        request.eval_settings(),
        simulate_fleet,
    )
    return run_plan_part(part, inputs)


def _failure(part: JobPart) -> str:
    what = f"{part.params.describe()} (plan part job {part.id})"
    if part.status is JobStatus.CANCELLED:
        return f"{what} was cancelled: {part.error or 'cancelled'}"
    return f"{what} failed: {part.error or 'no error recorded'}"


def _stage(part: PlanPart) -> str:
    return "capacities" if part.capacity is not None else "fleets"


def pool_parts(ctx: JobContext, on_step: Callable[[str], None]) -> PartRunner:
    """The plan job `ctx.job`'s part runner (see the module docstring). `on_step`
    reports progress and raises `JobStopped` when the job should stop."""

    def run(parts: tuple[PlanPart, ...]) -> tuple[PartResult, ...]:
        if not parts:
            return ()
        engine = make_engine(ctx.storage_url)
        try:
            return _run(engine, parts)
        finally:
            engine.dispose()

    def _run(engine, parts: tuple[PlanPart, ...]) -> tuple[PartResult, ...]:
        job, stage = ctx.job, _stage(parts[0])

        def mine(s) -> list[JobPart]:  # this stage's parts
            return [p for p in job_parts(s, job.id) if _stage(p.params) == stage]

        with session_scope(engine) as s:
            queued = mine(s)
            if not queued:
                for part in parts:
                    enqueue_job(s, project=job.project, params=part, parent_id=job.id)
        if queued and tuple(q.params for q in queued) != parts:
            with session_scope(engine) as s:
                cancel_parts(s, job.id)
            raise JobFailed(
                f"the plan's {stage} parts differ from those its earlier attempt queued "
                "(the stored trace or latency models changed); queue the plan again"
            )
        done = -1
        while True:
            with session_scope(engine) as s:
                states = mine(s)
            bad = next((p for p in states if p.status.finished and p.result is None), None)
            if bad is not None:
                with session_scope(engine) as s:
                    cancel_parts(s, job.id)
                raise JobFailed(_failure(bad))
            finished = sum(p.result is not None for p in states)
            if finished == len(states):
                return tuple(p.result for p in states if p.result is not None)
            try:
                if finished != done:
                    done = finished
                    on_step(f"the {stage} as part jobs: {finished} of {len(states)} done")
                elif ctx.should_stop():
                    raise JobStopped("stopped while waiting on the plan's parts")
            except JobStopped:
                if ctx.cancel_requested():  # not a lost lease: its successor needs them
                    with session_scope(engine) as s:
                        cancel_parts(s, job.id)
                raise
            if not ctx.run_part():
                time.sleep(ctx.poll_s)

    return run
