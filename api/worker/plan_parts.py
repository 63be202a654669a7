"""A plan's fleet replays as jobs of the worker pool, so that the workers of several
machines sharing one database split one plan.

A plan job, once its fleets are sized (`optimizer.plan.build_plan`), queues their three
replays as `plan_part` jobs of its own (`pool_fleets`; each a `PlanPart` document, its
parent the plan job). Any worker claims a part as it claims any job and runs
`run_plan_part`: the stored trace, the stored latency models, the replay; the
`FleetReplay` is stored in the part's row. The plan job's worker, while it waits, claims
and runs its own parts too (`JobContext.run_part`), so one worker alone finishes a plan;
when every part has succeeded it assembles and stores the plan, which is the plan the
in-process path makes (the same replays on the same inputs).

- A part that fails (or is abandoned after its workers kept dying, or is cancelled)
  fails the plan job with the part's error; its other parts are cancelled and no plan
  is stored.
- A plan job cancelled while it waits cancels its unfinished parts and stores nothing.
- A worker that dies mid-part loses its lease, and the part is claimed again by another
  worker, as any job is; a worker that dies mid-plan does the same to the plan job, and
  the worker that takes it over sizes the fleets again and waits on the parts the dead
  one queued (those that succeeded are not run again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from api.services.planning import load_plan_trace, priced_label
from api.services.tuning import stored_latency
from api.settings import get_settings
from api.worker.context import JobContext, JobFailed, JobStopped
from optimizer.plan import FleetReplay, FleetRunner, PlanError, PlanPart, run_fleet_part
from optimizer.plan.build import check_inputs
from optimizer.sim.dynamic import simulate_fleet
from storage.db import make_engine, session_scope
from storage.jobs import JobPart, cancel_parts, enqueue_job, job_parts
from storage.service_records import JobStatus


def run_plan_part(ctx: JobContext) -> FleetReplay:
    """The executor of a `plan_part` job: its fleet replayed on the plan's stored trace,
    priced by the stored latency models (the part fails when they are not the ones the
    plan was priced with)."""
    part = ctx.job.params
    if not isinstance(part, PlanPart):
        raise JobFailed(f"a plan part's params are a plan part, not {type(part).__name__}")
    request = part.request
    if request.trace_id is None:
        raise JobFailed("the plan part names no stored trace")
    try:
        trace = load_plan_trace(ctx.storage_url, request.trace_id)
        checked = check_inputs(request, trace.workload)
    except (LookupError, PlanError) as exc:  # the trace was deleted since
        raise JobFailed(str(exc)) from exc
    resolved = stored_latency(ctx.storage_url, request.model, get_settings().native_threads)
    label = priced_label(resolved.label, part.unit)
    if label != part.latency:
        raise JobFailed(
            f"the stored latency models changed since the plan was sized: it was priced "
            f"with {part.latency!r}, this worker finds {label!r}; queue the plan again"
        )
    return run_fleet_part(
        part,
        trace.workload,
        checked.windows,
        checked.cold_start,
        resolved.source,
        request.eval_settings(),
        simulate_fleet,
    )


def _failure(part: JobPart) -> str:
    what = f"the {part.params.kind.value} fleet's replay (plan part job {part.id})"
    if part.status is JobStatus.CANCELLED:
        return f"{what} was cancelled: {part.error or 'cancelled'}"
    return f"{what} failed: {part.error or 'no error recorded'}"


def pool_fleets(ctx: JobContext, on_step: Callable[[str], None]) -> FleetRunner:
    """The plan job `ctx.job`'s fleet runner (see the module docstring). `on_step`
    reports progress and raises `JobStopped` when the job should stop."""

    def run(parts: tuple[PlanPart, ...]) -> tuple[FleetReplay, ...]:
        engine = make_engine(ctx.storage_url)
        try:
            return _run(engine, parts)
        finally:
            engine.dispose()

    def _run(engine, parts: tuple[PlanPart, ...]) -> tuple[FleetReplay, ...]:
        job = ctx.job
        with session_scope(engine) as s:
            queued = job_parts(s, job.id)
            if not queued:
                for part in parts:
                    enqueue_job(s, project=job.project, params=part, parent_id=job.id)
        if queued and tuple(q.params for q in queued) != parts:
            with session_scope(engine) as s:
                cancel_parts(s, job.id)
            raise JobFailed(
                "the plan's fleets differ from those its earlier attempt queued as parts "
                "(the stored trace or latency models changed); queue the plan again"
            )
        done = -1
        while True:
            with session_scope(engine) as s:
                states = job_parts(s, job.id)
            bad = next((p for p in states if p.status.finished and p.replay is None), None)
            if bad is not None:
                with session_scope(engine) as s:
                    cancel_parts(s, job.id)
                raise JobFailed(_failure(bad))
            finished = sum(p.replay is not None for p in states)
            if finished == len(states):
                return tuple(p.replay for p in states if p.replay is not None)
            try:
                if finished != done:
                    done = finished
                    on_step(f"replaying the fleets as part jobs: {finished} of {len(states)} done")
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
