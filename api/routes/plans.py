"""/v1/plans: queue a fleet plan (202), list plan jobs, status with progress, the plan,
cancel. A plan job runs `servetune plan` in a worker (`api.worker.planning`) on the same
queue as tuning jobs; it is addressed by its job id (`plan_job_id`), and its result is
the stored `FleetPlan` (whose own id, `plan_id`, is the plans table's)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from sqlalchemy.orm import Session

from api.deps import EngineDep, IdPath, PagingDep, PrincipalDep, ReaderDep, SessionDep
from api.problems import ApiError
from api.reads import encode_json, polled_json
from api.schemas import FieldError, JobCreated, Page, PlanResultOut, Problem, page
from api.services.planning import PlanInputError, check_plan_job, parse_plan_request
from storage.db import read_scope, session_scope
from storage.jobs import (
    JobNotFinished,
    count_jobs,
    enqueue_job,
    get_job,
    list_jobs,
    request_cancel,
)
from storage.plans import plan_text_of_job
from storage.service_records import JobInfo, JobKind, JobStatus

router = APIRouter(prefix="/v1/plans", tags=["plans"])

ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such plan job in this project"},
}
UNIT = {
    "model": "llama-3.1-8b",
    "mode": "colocated",
    "num_replicas": 1,
    "replica": {"accelerator": "h100", "tp": 1, "max_num_batched_tokens": 2048,
                "max_num_seqs": 256},
}  # fmt: skip
EXAMPLES = {
    "trace": {
        "summary": "plan a stored trace in 15-minute windows with a given unit",
        "value": {
            "trace_id": 1,
            "model": "llama-3.1-8b",
            "gpu": "h100",
            "slo_ttft_ms": 1000,
            "slo_tpot_ms": 50,
            "window_s": 900,
            "attainment": 0.9,
            "cold_start_s": 90,
            "gpu_budget": 64,
            "price_per_gpu_hour": 2.5,
            "unit": UNIT,
        },
    },
    "stream": {
        "summary": "plan a stream's newest upload; the unit tune recommended, else screened",
        "value": {
            "stream": "prod-chat",
            "model": "llama-3.1-8b",
            "gpu": "h100",
            "slo_ttft_ms": 1000,
            "slo_tpot_ms": 50,
            "window_s": 3600,
        },
    },
}
BODY = (
    "`PlanRequest`, the fields of `servetune plan`: `trace_id` (a stored trace) or `stream` "
    "(its newest upload); `model`, `gpu`, `slo_ttft_ms`, `slo_tpot_ms`; optional "
    "`window_s` (900), `attainment` (0.9), `cold_start_s` (default: weights at 2 GB/s + "
    "60 s start-up), `gpu_budget` (64), `unit` (a ServingConfig document, as the CLI's "
    "--unit YAML: one replica or one P:D group; default: the newest stored recommendation "
    "for this trace, model, GPU and SLOs, else a short screening), `price_per_gpu_hour`, "
    "`seed`, `screen_trials`. Unknown fields are refused."
)


def plan_links(job_id: int) -> dict[str, str]:
    return {
        "status_url": f"/v1/plans/{job_id}",
        "result_url": f"/v1/plans/{job_id}/result",
        "ui_url": f"/ui/plans/{job_id}",
    }


@router.post(
    "",
    status_code=202,
    response_model=JobCreated,
    summary="Queue a fleet plan (runs in a worker; poll its status)",
    responses={
        **ERRORS,
        422: {
            "model": Problem,
            "description": "invalid fields, or a trace the plan refuses (shorter than two "
            "windows, a window longer than it, a cold start longer than a window)",
        },
    },
)
def create(
    body: Annotated[dict[str, Any], Body(description=BODY, openapi_examples=EXAMPLES)],
    engine: EngineDep,
    principal: PrincipalDep,
    response: Response,
) -> JobCreated:
    """Checked as `servetune plan` checks its input, on the stored trace, before anything
    is stored; a peak that no fleet within `gpu_budget` serves is found by the plan
    itself: the job then fails with that message."""
    project = principal.project
    try:
        request = parse_plan_request(body)
        with read_scope(engine) as s:  # the trace is read outside the write transaction
            window = check_plan_job(s, request, project=project)
    except PlanInputError as exc:
        where = exc.fields or ("",)
        errors = [FieldError(where=f"body.{f}".rstrip("."), message=str(exc)) for f in where]
        raise ApiError(422, str(exc), kind="invalid-plan", errors=errors) from None
    with session_scope(engine) as s:  # a short write: the job
        job = enqueue_job(s, project=project, params=request, window=window)
    response.headers["Location"] = f"/v1/plans/{job.id}"
    return JobCreated(id=job.id, status=job.status, **plan_links(job.id))


@router.get("", response_model=Page[JobInfo], responses=ERRORS, summary="List plan jobs")
async def list_(
    reader: ReaderDep,
    principal: PrincipalDep,
    paging: PagingDep,
    status: Annotated[JobStatus | None, Query(description="only jobs in this state")] = None,
) -> Response:
    """Newest first."""
    project = principal.project

    def query(session: Session) -> Page[JobInfo]:
        items = list_jobs(
            session,
            project=project,
            status=status,
            kind=JobKind.PLAN,
            limit=paging.limit + 1,
            offset=paging.offset,
            after=paging.after,
        )
        total = count_jobs(session, project=project, status=status, kind=JobKind.PLAN)
        return page(items, total=total, limit=paging.limit, offset=paging.offset)

    return await reader.json(Page[JobInfo], query)


@router.get(
    "/{plan_job_id}",
    response_model=JobInfo,
    responses={**ERRORS, 304: {"description": "unchanged since the ETag in If-None-Match"}},
    summary="Status and progress (the plan's step under way); ETag, If-None-Match",
)
async def status(
    plan_job_id: IdPath, request: Request, reader: ReaderDep, principal: PrincipalDep
) -> Response:
    project, job_id = principal.project, plan_job_id
    body = await reader.run(
        lambda s: encode_json(JobInfo, get_job(s, job_id, project=project, kind=JobKind.PLAN))
    )
    return polled_json(request, body)


def read_plan_text(session: Session, job_id: int, project: str) -> tuple[int, str]:
    """A plan job's stored plan (its id and JSON text); `JobNotFound`, or `JobNotFinished`
    while it has none."""
    job = get_job(session, job_id, project=project, kind=JobKind.PLAN)
    stored = plan_text_of_job(session, job_id, project=project)
    if stored is None:
        raise JobNotFinished(job)
    return stored.id, stored.outcome


def plan_body(job_id: int, plan_id: int, plan: str) -> bytes:
    """The result as sent: the stored document as it is (a non-finite number, which only
    SQLite can hold, is refused as `json.dumps(..., allow_nan=False)` refuses it)."""
    if "NaN" in plan or "Infinity" in plan:
        document = {"job_id": job_id, "plan_id": plan_id, "plan": json.loads(plan)}
        return json.dumps(document, allow_nan=False).encode()
    return f'{{"job_id": {job_id}, "plan_id": {plan_id}, "plan": {plan}}}'.encode()


@router.get(
    "/{plan_job_id}/result",
    response_model=PlanResultOut,
    summary="The plan: capacity, lower bound, fleets, policy (plan.json's layout); ETag",
    responses={
        **ERRORS,
        304: {"description": "unchanged since the ETag in If-None-Match"},
        409: {"model": Problem, "description": "the plan job has no plan (yet)"},
    },
)
async def result(
    plan_job_id: IdPath, request: Request, reader: ReaderDep, principal: PrincipalDep
) -> Response:
    project, job_id = principal.project, plan_job_id
    try:
        plan_id, text = await reader.run(lambda s: read_plan_text(s, job_id, project))
    except JobNotFinished as exc:
        raise ApiError(409, str(exc), kind="not-finished") from None
    return polled_json(request, plan_body(job_id, plan_id, text))


@router.post(
    "/{plan_job_id}/cancel",
    status_code=202,
    response_model=JobInfo,
    responses=ERRORS,
    summary="Cancel (a queued plan at once; a running one at its next step)",
)
def cancel(plan_job_id: IdPath, session: SessionDep, principal: PrincipalDep) -> JobInfo:
    return request_cancel(session, plan_job_id, project=principal.project, kind=JobKind.PLAN)
