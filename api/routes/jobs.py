"""/v1/tuning-jobs: create (202), list, status with progress, result, cancel."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Query, Request, Response
from sqlalchemy.orm import Session

from api.deps import IdPath, PagingDep, PrincipalDep, ReaderDep, SessionDep
from api.problems import ApiError
from api.reads import encode_json, polled_json
from api.schemas import FieldError, JobCreated, JobResultOut, Page, Problem, page
from api.services.floors import FloorError, check_request_floors
from api.services.stream_windows import EmptyWindow, resolve_window
from optimizer.search import TuneRequest
from storage.jobs import (
    JobNotFinished,
    count_jobs,
    enqueue_job,
    get_job,
    get_result_text,
    list_jobs,
    request_cancel,
)
from storage.service_records import JobInfo, JobKind, JobStatus

router = APIRouter(prefix="/v1/tuning-jobs", tags=["tuning-jobs"])

ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such job in this project"},
}
PARAMS_EXAMPLES = {
    "trace": {
        "summary": "tune on a stored trace",
        "value": {
            "trace_id": 1,
            "model": "llama-3.1-8b",
            "gpu_types": ["h100"],
            "gpu_budget": 8,
            "slo_ttft_ms": 2000,
            "slo_tpot_ms": 50,
            "attainment": 0.9,
            "num_trials": 50,
        },
    },
    "stream": {
        "summary": "tune on a stream's last hour",
        "value": {
            "stream": "prod-chat",
            "window_s": 3600,
            "model": "llama-3.1-8b",
            "gpu_types": ["h100"],
            "gpu_budget": 8,
            "slo_ttft_ms": 2000,
            "slo_tpot_ms": 50,
        },
    },
    "speculation": {
        "summary": "search EAGLE speculation depths within 4 GPUs, first 2000 requests",
        "value": {
            "trace_id": 1,
            "model": "llama-3.1-8b",
            "gpu_types": ["h100"],
            "gpu_budget": 4,
            "slo_ttft_ms": 2000,
            "slo_tpot_ms": 50,
            "max_requests": 2000,
            "search_space": {"spec_method": "eagle", "spec_k": [0, 2, 4], "tp": [1, 2]},
        },
    },
    "closed-loop": {
        "summary": "size a fleet for 64 benchmark clients (vllm bench serve --max-concurrency)",
        "value": {
            "workload": {
                "random_input_len": 4096,
                "random_output_len": 512,
                "num_prompts": 640,
                "max_concurrency": 64,
            },
            "model": "meta-llama/Llama-3.1-70B",
            "gpu_types": ["h200"],
            "gpu_budget": 8,
            "slo_ttft_ms": 1000,
            "slo_tpot_ms": 40,
        },
    },
}


def job_links(job_id: int) -> dict[str, str]:
    return {
        "status_url": f"/v1/tuning-jobs/{job_id}",
        "result_url": f"/v1/tuning-jobs/{job_id}/result",
        "ui_url": f"/ui/jobs/{job_id}",
    }


@router.post(
    "",
    status_code=202,
    response_model=JobCreated,
    summary="Queue a tuning job (runs in a worker; poll its status)",
    responses={
        **ERRORS,
        422: {"model": Problem, "description": "invalid parameters, or an SLO below a floor"},
    },
)
def create(
    params: Annotated[TuneRequest, Body(openapi_examples=PARAMS_EXAMPLES)],
    session: SessionDep,
    principal: PrincipalDep,
    response: Response,
) -> JobCreated:
    try:
        window = resolve_window(
            session, project=principal.project, params=params, now=datetime.now(UTC)
        )
    except EmptyWindow as exc:
        raise ApiError(422, str(exc), kind="empty-window") from None
    try:
        check_request_floors(
            session, params, project=principal.project, trace_ids=window.trace_ids if window else ()
        )
    except FloorError as exc:
        errors = [FieldError(where=f"body.{v.field}", message=v.message) for v in exc.violations]
        raise ApiError(422, str(exc), kind="below-physical-floor", errors=errors) from None
    job = enqueue_job(session, project=principal.project, params=params, window=window)
    response.headers["Location"] = f"/v1/tuning-jobs/{job.id}"
    return JobCreated(id=job.id, status=job.status, **job_links(job.id))


@router.get("", response_model=Page[JobInfo], responses=ERRORS, summary="List tuning jobs")
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
            kind=JobKind.TUNING,
            limit=paging.limit + 1,
            offset=paging.offset,
            after=paging.after,
        )
        total = count_jobs(session, project=project, status=status, kind=JobKind.TUNING)
        return page(items, total=total, limit=paging.limit, offset=paging.offset)

    return await reader.json(Page[JobInfo], query)


@router.get(
    "/{job_id}",
    response_model=JobInfo,
    responses={**ERRORS, 304: {"description": "unchanged since the ETag in If-None-Match"}},
    summary="Status and progress (trials done/total, best so far, ETA); ETag, If-None-Match",
)
async def status(
    job_id: IdPath, request: Request, reader: ReaderDep, principal: PrincipalDep
) -> Response:
    project = principal.project
    body = await reader.run(
        lambda s: encode_json(JobInfo, get_job(s, job_id, project=project, kind=JobKind.TUNING))
    )
    return polled_json(request, body)


@router.get(
    "/{job_id}/result",
    response_model=JobResultOut,
    summary="Pareto front, recommendation with launch commands, baseline, diagnosis; ETag",
    responses={
        **ERRORS,
        304: {"description": "unchanged since the ETag in If-None-Match"},
        409: {"model": Problem, "description": "the job has no result yet"},
    },
)
async def result(
    job_id: IdPath, request: Request, reader: ReaderDep, principal: PrincipalDep
) -> Response:
    project = principal.project
    try:
        text = await reader.run(lambda s: get_result_text(s, job_id, project=project))
    except JobNotFinished as exc:
        raise ApiError(409, str(exc), kind="not-finished") from None
    return polled_json(request, result_body(job_id, text))


def result_body(job_id: int, outcome: str) -> bytes:
    # The document as stored (no re-validation of every config): `outcome.json`'s layout.
    # Stored by `json.dumps` with its defaults, as it would be written here, so sent as it
    # is; one holding a non-finite number (only SQLite can hold one) is refused as
    # `json.dumps(..., allow_nan=False)` refuses it.
    if "NaN" in outcome or "Infinity" in outcome:
        document = {"job_id": job_id, "outcome": json.loads(outcome)}
        return json.dumps(document, allow_nan=False).encode()
    return f'{{"job_id": {job_id}, "outcome": {outcome}}}'.encode()


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobInfo,
    responses=ERRORS,
    summary="Cancel (a queued job at once; a running one within seconds)",
)
def cancel(job_id: IdPath, session: SessionDep, principal: PrincipalDep) -> JobInfo:
    return request_cancel(session, job_id, project=principal.project, kind=JobKind.TUNING)
