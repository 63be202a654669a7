"""/v1/recommendations: the latest recommendation for a deployment.

The hot read path (dashboards and deploy scripts poll it): an `async` route whose
answer, the encoded JSON (or its 404), comes from kept reads (`api.reads`), and a
repeated poll is answered before routing by `api.fastpath`. The project's
recommendations, the newest of each deployment, are read once while that table is
unchanged (`storage.recommendations.RecommendationIndex`, up to `INDEX_MAX_ROWS`
deployments; more: one query per set of filters) and each row is encoded once, so a first hit with
filters never asked before runs no query. A recommendation a worker writes, in any
process, is served from the next request on.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache, partial
from typing import Annotated

from fastapi import APIRouter, Request, Response
from pydantic import Field, TypeAdapter
from pydantic.dataclasses import dataclass
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException

from api.deps import (
    MAX_ID,
    NAME_PATTERN,
    PrincipalDep,
    ReaderDep,
    caller_of,
    query_of,
    query_openapi,
    query_parser,
)
from api.plain import plain_route
from api.problems import ApiError
from api.reads import Reader, json_response
from api.schemas import Problem
from storage.recommendations import (
    DeploymentFilter,
    get_recommendation,
    get_recommendations,
    latest_recommendation_ref,
    recommendation_index,
)
from storage.service_records import Principal, RecommendationInfo

router = APIRouter(prefix="/v1/recommendations", tags=["recommendations"])


@lru_cache(maxsize=1)
def _adapter() -> TypeAdapter[RecommendationInfo]:
    return TypeAdapter(RecommendationInfo)


Ref = tuple[int, datetime]  # a recommendation's id and creation time: one row's content


def _encoded(reader: Reader, ref: Ref, session: Session) -> bytes:
    """The row `ref` names, encoded once (rows are written once and never changed)."""
    return reader.remember(
        ("recommendation", *ref),
        lambda: _adapter().dump_json(get_recommendation(session, ref[0])),
    )


def _load_latest(reader: Reader, session: Session, project: str, where: DeploymentFilter) -> bytes:
    # Which row is newest is one indexed query; its encoding is kept per row.
    return _encoded(
        reader, latest_recommendation_ref(session, project=project, where=where), session
    )


def _encoded_rows(session: Session, refs: list[Ref]) -> dict[Ref, bytes | None]:
    """The rows `refs` name, encoded, in one statement; None for a row deleted (with its
    job) since the index named it."""
    found = get_recommendations(session, [ref[0] for ref in refs])
    out: dict[Ref, bytes | None] = {}
    for ref in refs:
        info = found.get(ref[0])
        out[ref] = None if info is None or info.created_at != ref[1] else _adapter().dump_json(info)
    return out


Name = Annotated[str | None, Field(min_length=1, max_length=200, pattern=NAME_PATTERN)]


@dataclass(frozen=True)
class LatestQuery:
    """The latest recommendation's filters (every one optional)."""

    trace_id: Annotated[int | None, Field(ge=1, le=MAX_ID, examples=[1])] = None
    stream: Name = None
    model: Name = None
    gpu: Name = None
    num_gpus: Annotated[int | None, Field(ge=1, le=4096)] = None
    slo_ttft_ms: Annotated[float | None, Field(gt=0, le=1e9)] = None
    slo_tpot_ms: Annotated[float | None, Field(gt=0, le=1e9)] = None


@router.get(
    "/latest",
    response_model=RecommendationInfo,
    summary="The newest recommendation matching a deployment (every filter optional)",
    responses={
        401: {"model": Problem, "description": "missing or unknown API key"},
        404: {"model": Problem, "description": "no recommendation matches yet"},
        422: {"model": Problem, "description": "both trace_id and stream given"},
    },
    openapi_extra=query_openapi(LatestQuery),
)
async def latest(
    reader: ReaderDep,
    principal: PrincipalDep,
    query: Annotated[LatestQuery, query_of(LatestQuery)],
) -> Response:
    return await _latest(reader, principal, query)


_parse_latest = query_parser(LatestQuery)


async def latest_served(request: Request) -> Response:
    """`latest` as a plain route, in front of it: what a first hit costs beyond its read
    is mostly FastAPI's routing and dependency solving (~40% of its CPU). The same
    checks in the same order (the caller, then the query), the same errors; `latest`
    stays for the OpenAPI document, and a test compares the two on every kind of
    request."""
    if request.method != "GET":  # (it matches every method: see below)
        raise HTTPException(405, headers={"Allow": "GET"})
    principal = await caller_of(request)
    query = await _parse_latest(request)
    return await _latest(request.app.state.reader, principal, query)


async def _latest(reader: Reader, principal: Principal, query: LatestQuery) -> Response:
    trace_id, stream = query.trace_id, query.stream
    if trace_id is not None and stream is not None:
        raise ApiError(422, "give at most one of trace_id or stream", kind="validation")
    source = None
    if trace_id is not None:
        source = f"trace:{trace_id}"
    elif stream is not None:
        source = f"stream:{stream}"
    where = DeploymentFilter(
        source=source,
        model=query.model,
        gpu=query.gpu,
        num_gpus=query.num_gpus,
        slo_ttft_ms=query.slo_ttft_ms,
        slo_tpot_ms=query.slo_tpot_ms,
    )
    project = principal.project
    reader.answering()
    # The project's recommendations are read once while that table stands (a first hit
    # with new filters then costs no query), and each row they name is encoded once.
    index = await reader.run(
        partial(recommendation_index, project=project), key=("recommendation-index", project)
    )
    if index is not None:
        ref = index.latest(where)
        body = reader.remembered(("recommendation", *ref))
        if body is None:  # (the rows first asked at once are read together)
            body = await reader.each(_encoded_rows, ref, key=("encoded-recommendation", *ref))
            if body is not None:
                body = reader.remember(("recommendation", *ref), lambda: body)
        if body is not None:
            return json_response(body)
    return await reader.response(
        lambda session: _load_latest(reader, session, project, where),
        key=("latest-recommendation", project, where),
    )


# In front of the documented route (routes match in order), for every method: a route for
# GET would answer HEAD too and refuse others with `Allow: GET, HEAD`, where the
# documented route refuses both with `Allow: GET`, as `latest_served` does.
_served = plain_route("/v1/recommendations/latest", latest_served, methods=None)
router.routes.insert(0, _served)
