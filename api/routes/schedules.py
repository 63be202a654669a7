"""/v1/schedules: re-tuning (or, with a plan, re-planning) on an interval or cron over a
trace stream's rolling window, or on a deployment's drift."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Response
from sqlalchemy.orm import Session

from api.deps import IdPath, PagingDep, PrincipalDep, ReaderDep, SessionDep
from api.problems import ApiError
from api.schemas import FieldError, Page, Problem, ScheduleCreate, page
from api.services.planning import PlanInputError, parse_plan_request
from storage.deployments import DeploymentNotFound
from storage.schedules import (
    ScheduleFieldError,
    count_schedules,
    create_schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    set_paused,
)
from storage.service_records import ScheduleInfo

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])

ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such schedule in this project"},
}
EXAMPLES = {
    "drift": {
        "summary": "hourly check, re-tune only on drift",
        "value": {
            "name": "prod-chat drift",
            "interval_s": 3600,
            "trigger": "drift",
            "drift_threshold": 0.2,
            "params": {
                "stream": "prod-chat",
                "window_s": 3600,
                "model": "llama-3.1-8b",
                "gpu_types": ["h100"],
                "gpu_budget": 8,
                "slo_ttft_ms": 2000,
                "slo_tpot_ms": 50,
            },
        },
    },
    "plan": {
        "summary": "re-plan a deployment's fleet when its traffic drifts",
        "value": {
            "name": "prod-chat fleet plan",
            "interval_s": 3600,
            "trigger": "drift",
            "params": {
                "deployment_id": 1,
                "window_s": 86400,
                "model": "llama-3.1-8b",
                "gpu_types": ["h100"],
                "gpu_budget": 64,
                "slo_ttft_ms": 2000,
                "slo_tpot_ms": 50,
            },
            "plan": {
                "model": "llama-3.1-8b",
                "gpu": "h100",
                "gpu_budget": 64,
                "slo_ttft_ms": 2000,
                "slo_tpot_ms": 50,
                "window_s": 900,
            },
        },
    },
    "cron": {
        "summary": "nightly at 03:00 UTC",
        "value": {
            "name": "nightly",
            "cron": "0 3 * * *",
            "params": {
                "stream": "prod-chat",
                "window_s": 86400,
                "model": "llama-3.1-8b",
                "gpu_types": ["h100"],
                "gpu_budget": 8,
                "slo_ttft_ms": 2000,
                "slo_tpot_ms": 50,
            },
        },
    },
}


@router.post(
    "",
    status_code=201,
    response_model=ScheduleInfo,
    summary="Create a schedule (`next_run_at` says when it first fires)",
    responses={**ERRORS, 422: {"model": Problem, "description": "invalid schedule"}},
)
def create(
    spec: Annotated[ScheduleCreate, Body(openapi_examples=EXAMPLES)],
    session: SessionDep,
    principal: PrincipalDep,
    response: Response,
) -> ScheduleInfo:
    plan = None
    if spec.plan is not None:
        try:
            plan = parse_plan_request(spec.plan)
        except PlanInputError as exc:
            where = [f"body.plan.{f}" for f in exc.fields] or ["body.plan"]
            errors = [FieldError(where=w, message=str(exc)) for w in where]
            raise ApiError(422, f"plan: {exc}", kind="validation", errors=errors) from None
    try:
        info = create_schedule(
            session,
            project=principal.project,
            name=spec.name or spec.params.stream or spec.params.source,
            params=spec.params,
            interval_s=spec.interval_s,
            cron=spec.cron,
            trigger=spec.trigger,
            drift_threshold=spec.drift_threshold,
            error_threshold=spec.error_threshold,
            plan=plan,
        )
    except ScheduleFieldError as exc:
        where = FieldError(where=f"body.{exc.field}", message=str(exc))
        raise ApiError(422, str(exc), kind="validation", errors=[where]) from None
    except DeploymentNotFound as exc:
        raise ApiError(422, f"params.deployment_id: {exc}", kind="validation") from None
    except ValueError as exc:
        raise ApiError(422, str(exc), kind="validation") from None
    response.headers["Location"] = f"/v1/schedules/{info.id}"
    return info


@router.get("", response_model=Page[ScheduleInfo], responses=ERRORS, summary="List schedules")
async def list_(reader: ReaderDep, principal: PrincipalDep, paging: PagingDep) -> Response:
    """Oldest first."""
    project, limit, offset = principal.project, paging.limit, paging.offset

    def query(session: Session) -> Page[ScheduleInfo]:
        items = list_schedules(
            session, project=project, limit=limit + 1, offset=offset, after=paging.after
        )
        total = count_schedules(session, project=project)
        return page(items, total=total, limit=limit, offset=offset)

    return await reader.json(Page[ScheduleInfo], query)


@router.get("/{schedule_id}", response_model=ScheduleInfo, responses=ERRORS, summary="Get one")
async def get(schedule_id: IdPath, reader: ReaderDep, principal: PrincipalDep) -> Response:
    return await reader.json(
        ScheduleInfo,
        lambda session: get_schedule(session, schedule_id, project=principal.project),
    )


@router.post("/{schedule_id}/pause", response_model=ScheduleInfo, responses=ERRORS)
def pause(schedule_id: IdPath, session: SessionDep, principal: PrincipalDep) -> ScheduleInfo:
    """Stop firing until resumed."""
    return set_paused(session, schedule_id, paused=True, project=principal.project)


@router.post("/{schedule_id}/resume", response_model=ScheduleInfo, responses=ERRORS)
def resume(schedule_id: IdPath, session: SessionDep, principal: PrincipalDep) -> ScheduleInfo:
    """Fire again; the next due time is counted from now."""
    return set_paused(session, schedule_id, paused=False, project=principal.project)


@router.delete("/{schedule_id}", status_code=204, responses=ERRORS, summary="Delete")
def delete(schedule_id: IdPath, session: SessionDep, principal: PrincipalDep) -> Response:
    delete_schedule(session, schedule_id, project=principal.project)
    return Response(status_code=204)
