"""The tuning executor: `api.services.tuning.run_tuning_job` on the job queue.

The job's params are the search's own `TuneRequest`; a stream job tunes on the
newest upload of the window it resolved at creation. The Optuna study
`ctx.study_name` lives in the service database, so a job taken over after a
crash resumes it: finished trials are kept and never re-run.
"""

from __future__ import annotations

from dataclasses import replace

from api.services.tuning import run_tuning_job
from api.settings import get_settings
from api.worker.context import JobContext, JobFailed
from optimizer.search import TuneOutcome, TuneRequest, TuneRequestError
from optimizer.search.floors import FloorError


def job_request(params: TuneRequest, trace_ids: tuple[int, ...]) -> TuneRequest:
    """The request the job runs: a stream's params pinned to the newest upload of its
    window; JobFailed when the window was empty or the search rejects the request."""
    if params.trace_id is not None or params.workload is not None:
        return params
    if not trace_ids:
        raise JobFailed("the job has no trace: its stream window was empty")
    try:
        return replace(params, trace_id=trace_ids[-1], stream=None)
    except TuneRequestError as exc:
        raise JobFailed(f"invalid tuning request: {exc}") from exc


def run_tuning(ctx: JobContext) -> TuneOutcome:
    window = ctx.job.window
    request = job_request(ctx.job.params, window.trace_ids if window is not None else ())
    try:
        return run_tuning_job(
            request,
            database_url=ctx.storage_url,
            study_name=ctx.study_name,
            should_stop=ctx.should_stop,
            on_progress=ctx.report,
            num_threads=get_settings().native_threads,
        )
    except LookupError as exc:  # the trace was deleted since the job was queued
        raise JobFailed(str(exc)) from exc
    except FloorError as exc:  # an SLO below a physical floor (a schedule's job, say)
        raise JobFailed(str(exc)) from exc
