"""/v1/deployments: configs running in production, and the windows observed on them.

A deployment is created from a config (POST /v1/deployments) or from a stored
recommendation (POST /v1/recommendations/{id}/deploy). An observation is two saved
/metrics pages of its vLLM server and the seconds between them, compared with the
simulator's prediction for its config as `servetune observe` compares them
(`api.services.observe`), stored and returned.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, Response, UploadFile
from sqlalchemy.orm import Session

from api.deps import EngineDep, IdPath, PagingDep, PrincipalDep, ReaderDep, SessionDep
from api.problems import ApiError
from api.schemas import DeploymentCreate, FieldError, Page, Problem, page
from api.services.calibrate import deployment_latency
from api.services.latency import resolve_latency
from api.services.observe import ObserveError, Scrape, observe, read_scrape, store
from optimizer.config import ConfigError, ServingConfig
from optimizer.shapes import ShapeError
from optimizer.telemetry import TelemetryError
from storage.db import read_scope, session_scope
from storage.deployments import (
    DeploymentError,
    count_deployments,
    count_observations,
    create_deployment,
    delete_deployment,
    get_deployment,
    list_deployments,
    list_observations,
)
from storage.service_records import Deployment, DeploymentObservation

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])
ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such deployment in this project"},
}
MAX_SCRAPE_BYTES = 16 * 1024**2  # a /metrics page (and at most SERVETUNE_MAX_UPLOAD_BYTES)
MAX_WINDOW_S = 366 * 86400.0


def save_deployment(
    session: Session,
    project: str,
    *,
    name: str,
    config: ServingConfig,
    prometheus_url: str | None,
    label_selector: str | None,
    recommendation_id: int | None = None,
) -> Deployment:
    """Store a deployment; a field it refuses is a 422 naming it."""
    try:
        return create_deployment(
            session, project=project, name=name, config=config,
            recommendation_id=recommendation_id, prometheus_url=prometheus_url,
            label_selector=label_selector,
        )  # fmt: skip
    except DeploymentError as exc:
        where = FieldError(where=f"body.{exc.field}", message=str(exc))
        raise ApiError(422, str(exc), kind="validation", errors=[where]) from None


@router.post(
    "",
    status_code=201,
    response_model=Deployment,
    summary="Store a deployment: the config that runs, and where its metrics are",
    responses={**ERRORS, 422: {"model": Problem, "description": "invalid config or field"}},
)
def create(
    spec: DeploymentCreate, session: SessionDep, principal: PrincipalDep, response: Response
) -> Deployment:
    try:
        config = ServingConfig.from_dict(spec.config)
    except (ConfigError, ShapeError, ValueError, TypeError) as exc:
        where = FieldError(where="body.config", message=str(exc))
        raise ApiError(422, str(exc), kind="validation", errors=[where]) from None
    info = save_deployment(
        session, principal.project, name=spec.name, config=config,
        prometheus_url=spec.prometheus_url, label_selector=spec.label_selector,
    )  # fmt: skip
    response.headers["Location"] = f"/v1/deployments/{info.id}"
    return info


@router.get("", response_model=Page[Deployment], responses=ERRORS, summary="List deployments")
async def list_(reader: ReaderDep, principal: PrincipalDep, paging: PagingDep) -> Response:
    """Newest first (`after`: a page's `next_after`, continuing to older ones)."""
    project, limit, offset = principal.project, paging.limit, paging.offset

    def query(session: Session) -> Page[Deployment]:
        items = list_deployments(
            session, project=project, limit=limit + 1, offset=offset, after=paging.after
        )
        total = count_deployments(session, project=project)
        return page(items, total=total, limit=limit, offset=offset)

    return await reader.json(Page[Deployment], query)


@router.get("/{deployment_id}", response_model=Deployment, responses=ERRORS, summary="Get one")
async def get(deployment_id: IdPath, reader: ReaderDep, principal: PrincipalDep) -> Response:
    return await reader.json(
        Deployment,
        lambda session: get_deployment(session, deployment_id, project=principal.project),
    )


@router.delete(
    "/{deployment_id}", status_code=204, responses=ERRORS, summary="Delete, with its observations"
)
def delete(deployment_id: IdPath, session: SessionDep, principal: PrincipalDep) -> Response:
    delete_deployment(session, deployment_id, project=principal.project)
    return Response(status_code=204)


def _scrape(upload: UploadFile, which: str, max_bytes: int) -> Scrape:
    data = upload.file.read(max_bytes + 1)
    field = which.lower()
    if len(data) > max_bytes:
        raise ApiError(
            413, f"{field}: larger than the limit of {max_bytes:,} bytes", kind="too-large"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(422, f"{field}: not UTF-8 text", kind="invalid-scrape") from None
    try:
        return read_scrape(text, which, upload.filename or field)
    except TelemetryError as exc:
        raise ApiError(422, str(exc), kind="invalid-scrape") from None


@router.post(
    "/{deployment_id}/observations",
    status_code=201,
    response_model=DeploymentObservation,
    summary="Observe a window: two /metrics scrapes against the prediction; stored",
    responses={
        **ERRORS,
        413: {"model": Problem, "description": "a scrape is too large"},
        422: {"model": Problem, "description": "a scrape or window that cannot be read"},
    },
)
def add_observation(
    deployment_id: IdPath,
    before: Annotated[UploadFile, File(description="the vLLM /metrics page at the start")],
    after: Annotated[UploadFile, File(description="the same page `window_s` seconds later")],
    window_s: Annotated[float, Form(gt=0, le=MAX_WINDOW_S, description="seconds between")],
    request: Request,
    engine: EngineDep,
    principal: PrincipalDep,
) -> DeploymentObservation:
    """Runs as `servetune observe --deployment ID` does; 422 with the telemetry's message
    for a scrape or window it refuses (nothing is stored then)."""
    project, settings = principal.project, request.app.state.settings
    with read_scope(engine) as session:
        config = get_deployment(session, deployment_id, project=project).config
    limit = min(MAX_SCRAPE_BYTES, settings.max_upload_bytes)
    first, second = _scrape(before, "BEFORE", limit), _scrape(after, "AFTER", limit)
    try:
        with read_scope(engine) as session:
            base = resolve_latency(session, config.model, num_threads=settings.native_threads)
            latency = deployment_latency(session, deployment_id, base.source, base.label)
        observed = observe(first, second, window_s, config, latency.source, latency.label)
    except TelemetryError as exc:
        raise ApiError(422, str(exc), kind="invalid-scrape") from None
    except (ObserveError, LookupError, ShapeError) as exc:
        raise ApiError(422, str(exc), kind="unsimulatable") from None
    with session_scope(engine) as session:
        stored = store(
            session, deployment_id, observed, calibration_id=latency.calibration_id,
            project=project,
        )  # fmt: skip
    return stored


@router.get(
    "/{deployment_id}/observations",
    response_model=Page[DeploymentObservation],
    responses=ERRORS,
    summary="A deployment's observations, newest first",
)
async def observations(
    deployment_id: IdPath, reader: ReaderDep, principal: PrincipalDep, paging: PagingDep
) -> Response:
    project, limit, offset = principal.project, paging.limit, paging.offset

    def query(session: Session) -> Page[DeploymentObservation]:
        items = list_observations(
            session, deployment_id, project=project, limit=limit + 1, offset=offset,
            after=paging.after,
        )  # fmt: skip
        total = count_observations(session, deployment_id)
        return page(items, total=total, limit=limit, offset=offset)

    return await reader.json(Page[DeploymentObservation], query)
