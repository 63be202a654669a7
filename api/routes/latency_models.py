"""/v1/latency-models: latency models fitted on stored profiles (list, get).

Like profiles, latency models are global: the newest one per accelerator prices
every project's tuning jobs. Any key may read them; fitting one needs the admin
scope. The fitted payload itself is never served, only its description and
hold-out accuracy.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import IdPath, PagingDep, PrincipalDep, SessionDep
from api.schemas import Page, Problem, page
from storage.latency_models import LatencyModelInfo, get_latency_model, list_latency_models

router = APIRouter(prefix="/v1/latency-models", tags=["latency-models"])
ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such latency model"},
}
Label = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]


@router.get(
    "", response_model=Page[LatencyModelInfo], responses=ERRORS, summary="List latency models"
)
def list_(
    session: SessionDep,
    _: PrincipalDep,
    paging: PagingDep,
    accelerator: Label = None,
    name: Label = None,
) -> Page[LatencyModelInfo]:
    models = list_latency_models(session, accelerator=accelerator, name=name)
    items = models[paging.offset : paging.offset + paging.limit]
    return page(items, total=len(models), limit=paging.limit, offset=paging.offset)


@router.get(
    "/{model_id}", response_model=LatencyModelInfo, responses=ERRORS, summary="A latency model"
)
def get(model_id: IdPath, session: SessionDep, _: PrincipalDep) -> LatencyModelInfo:
    return get_latency_model(session, model_id)
