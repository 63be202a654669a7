"""/v1/latency-models: latency models fitted on stored profiles (list, get, fit).

Like profiles, latency models are global: the newest one per accelerator prices
every project's tuning jobs. Any key may read them; fitting one needs the admin
scope. The fitted payload itself is never served, only its description and
hold-out accuracy.

A fit runs synchronously in the thread pool: about 3 s for a Vidur table and
30-40 s for a whole AIConfigurator GPU folder on two busy cores. One fit at a
time per API process (a second gets 409), so an admin cannot starve the
service's CPU; nothing is stored unless the fit succeeds.
"""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import Field
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.deps import MAX_ID, AdminDep, EngineDep, IdPath, PagingDep, PrincipalDep, ReaderDep
from api.problems import ApiError
from api.schemas import Page, Problem, StrictBody, page
from optimizer.shapes import PRESETS
from storage.latency_models import LatencyModelInfo, get_latency_model, list_latency_models

router = APIRouter(prefix="/v1/latency-models", tags=["latency-models"])
ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such latency model"},
}
ADMIN_ERRORS = {
    **ERRORS,
    403: {"model": Problem, "description": "the key has no admin scope"},
    404: {"model": Problem, "description": "no such profile run"},
    409: {"model": Problem, "description": "another fit is running in this API process"},
    422: {"model": Problem, "description": "unknown shape, or the samples cannot be fitted"},
}


class FitRequest(StrictBody):
    profile_run_id: int = Field(ge=1, le=MAX_ID, examples=[1])
    name: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="stored as the next version of this name (default: the profile run's name)",
    )
    shape: str | None = Field(
        None,
        max_length=100,
        examples=["llama-3.1-8b"],
        description="model shape preset the profile's mixed iterations measured "
        "(default: the shape its samples name)",
    )


Label = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]


@router.get(
    "", response_model=Page[LatencyModelInfo], responses=ERRORS, summary="List latency models"
)
async def list_(
    reader: ReaderDep,
    _: PrincipalDep,
    paging: PagingDep,
    accelerator: Label = None,
    name: Label = None,
) -> Response:
    """Oldest first."""

    def query(session: Session) -> Page[LatencyModelInfo]:
        models = list_latency_models(session, accelerator=accelerator, name=name)
        items = paging.of(models)
        return page(items, total=len(models), limit=paging.limit, offset=paging.offset)

    return await reader.json(Page[LatencyModelInfo], query)


@router.get(
    "/{model_id}", response_model=LatencyModelInfo, responses=ERRORS, summary="A latency model"
)
async def get(model_id: IdPath, reader: ReaderDep, _: PrincipalDep) -> Response:
    return await reader.json(
        LatencyModelInfo,
        lambda session: get_latency_model(session, model_id),
    )


@router.post(
    "",
    status_code=201,
    response_model=LatencyModelInfo,
    responses=ADMIN_ERRORS,
    summary="Fit a latency model on a stored profile run (admin; synchronous)",
)
async def fit(
    spec: FitRequest, request: Request, response: Response, engine: EngineDep, _: AdminDep
) -> LatencyModelInfo:
    if spec.shape is not None and spec.shape.lower() not in PRESETS:
        raise ApiError(
            422,
            f"unknown model shape {spec.shape!r}; expected one of {sorted(PRESETS)}",
            kind="validation",
        )
    lock: threading.Lock = request.app.state.fit_lock
    if not lock.acquire(blocking=False):
        raise ApiError(409, "a latency-model fit is already running; retry when it is done")
    try:
        info = await run_in_threadpool(_fit, engine, spec)
    finally:
        lock.release()
    response.headers["Location"] = f"/v1/latency-models/{info.id}"
    return info


def _fit(engine: Engine, spec: FitRequest) -> LatencyModelInfo:
    from api.services.latency import fit_and_store  # scikit-learn: loaded on first fit only
    from api.settings import get_settings
    from optimizer.latency.model import FitOptions

    options = FitOptions(num_threads=get_settings().native_threads)
    try:
        return fit_and_store(
            engine, spec.profile_run_id, name=spec.name, shape=spec.shape, options=options
        )
    except LookupError:
        raise
    except ValueError as exc:
        raise ApiError(422, f"cannot fit profile run {spec.profile_run_id}: {exc}") from None
