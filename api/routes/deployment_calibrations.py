"""/v1/deployments/{id}/calibrations: a deployment's own correction, fitted on one stored
observation's window and checked on a later one (`servetune deployments calibrate` over
REST; `api.services.calibrate`). The fit runs within the request, on the server's CPU
(2-3 s for a few hundred requests' window; at most 80 simulations of at most 2,000
requests). The newest calibration prices the deployment's later observations and
re-tunes.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request, Response
from pydantic import Field
from sqlalchemy.orm import Session

from api.deps import EngineDep, IdPath, PagingDep, PrincipalDep, ReaderDep
from api.problems import ApiError
from api.schemas import Page, Problem, StrictBody, page
from api.services.calibrate import CalibrateError, calibrate_deployment
from api.services.latency import resolve_latency
from optimizer.shapes import ShapeError
from optimizer.telemetry import TelemetryError
from storage.db import read_scope, session_scope
from storage.deployment_calibrations import count_calibrations, list_calibrations
from storage.deployments import ObservationNotFound, get_deployment
from storage.service_records import DeploymentCalibration

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])
ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such deployment in this project"},
}


class CalibrationCreate(StrictBody):
    """Which observations to fit on and check on (default: the second newest and the
    newest; with one observation, fit on it unchecked)."""

    fit_on: int | None = Field(None, ge=1, le=2**31 - 1, description="an observation id")
    check_on: int | None = Field(None, ge=1, le=2**31 - 1, description="a later observation")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed of the rebuilt traffic")


@router.post(
    "/{deployment_id}/calibrations",
    status_code=201,
    response_model=DeploymentCalibration,
    summary="Fit the deployment's calibration on an observed window, check it on a later one",
    responses={**ERRORS, 422: {"model": Problem, "description": "cannot calibrate on these"}},
)
def create(
    deployment_id: IdPath,
    request: Request,
    engine: EngineDep,
    principal: PrincipalDep,
    spec: Annotated[CalibrationCreate | None, Body()] = None,
) -> DeploymentCalibration:
    spec = spec or CalibrationCreate()
    project, settings = principal.project, request.app.state.settings
    with read_scope(engine) as s:
        model = get_deployment(s, deployment_id, project=project).config.model
        base = resolve_latency(s, model, num_threads=settings.native_threads)
    try:
        return calibrate_deployment(
            lambda: session_scope(engine), deployment_id, base.source, fit_on=spec.fit_on,
            check_on=spec.check_on, seed=spec.seed, project=project,
        )  # fmt: skip
    except ObservationNotFound as exc:
        raise ApiError(422, str(exc), kind="validation") from None
    except (CalibrateError, TelemetryError, ShapeError, ValueError) as exc:
        raise ApiError(422, str(exc), kind="uncalibratable") from None


@router.get(
    "/{deployment_id}/calibrations",
    response_model=Page[DeploymentCalibration],
    responses=ERRORS,
    summary="A deployment's calibrations, newest first (the newest applies)",
)
async def list_(
    deployment_id: IdPath, reader: ReaderDep, principal: PrincipalDep, paging: PagingDep
) -> Response:
    project, limit, offset = principal.project, paging.limit, paging.offset

    def query(session: Session) -> Page[DeploymentCalibration]:
        items = list_calibrations(
            session, deployment_id, project=project, limit=limit + 1, offset=offset,
            after=paging.after,
        )  # fmt: skip
        total = count_calibrations(session, deployment_id)
        return page(items, total=total, limit=limit, offset=offset)

    return await reader.json(Page[DeploymentCalibration], query)
