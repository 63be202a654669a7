"""The plan executor: `api.services.planning.make_plan` on the job queue.

The job's params are the plan's own `PlanRequest`, checked on its stored trace when it
was queued; a stream's plan runs on the upload it resolved then (the job's window), a
schedule's on the window's trace it was pinned to. Each step of the plan is reported
(`PlanProgress`), and a cancel is honoured between steps (a plan has no partial answer:
nothing is stored). Its capacity searches and fleet replays run as part jobs that any
worker of the pool may run (`api.worker.plan_parts`). A refusal the plan finds (a peak
beyond the GPU budget, a unit that cannot hold the longest request) fails the job with
the plan's message; the worker then stores nothing else. The plan itself is stored by
`storage.jobs.finish_job`, linked to the job, in the transaction that marks it
succeeded.
"""

from __future__ import annotations

from dataclasses import replace

from api.services.planning import load_plan_trace, make_plan
from api.settings import get_settings
from api.worker.context import JobContext, JobFailed, JobStopped
from api.worker.plan_parts import pool_parts
from optimizer.plan import FleetPlan, PlanError, PlanProgress, PlanRequest


def plan_request(params: PlanRequest, trace_ids: tuple[int, ...]) -> PlanRequest:
    """The request the job runs: a stream's pinned to the upload resolved when the job
    was queued (the newest of its window)."""
    if params.trace_id is not None:
        return params
    if not trace_ids:
        raise JobFailed("the plan job has no trace: its stream had no upload")
    return replace(params, trace_id=trace_ids[-1], stream=None)


def run_planning(ctx: JobContext) -> FleetPlan:
    params = ctx.job.params
    if not isinstance(params, PlanRequest):
        raise JobFailed(f"a plan job's params are a plan request, not {type(params).__name__}")
    window = ctx.job.window
    request = plan_request(params, window.trace_ids if window is not None else ())
    steps = 0

    def step(message: str) -> None:
        nonlocal steps
        if ctx.should_stop():
            raise JobStopped(message)
        steps += 1
        ctx.report(PlanProgress(steps, message))

    step("loading the trace")
    settings = get_settings()
    try:
        assert request.trace_id is not None
        trace = load_plan_trace(ctx.storage_url, request.trace_id)
        plan = make_plan(
            request,
            trace,
            database_url=ctx.storage_url,
            project=ctx.job.project,
            num_threads=settings.native_threads,
            run_parts=pool_parts(ctx, step),
            on_step=step,
        )
    except LookupError as exc:  # the trace was deleted since the job was queued
        raise JobFailed(str(exc)) from exc
    except PlanError as exc:
        raise JobFailed(str(exc)) from exc
    step("storing the plan")
    return plan
