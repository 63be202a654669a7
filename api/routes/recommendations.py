"""/v1/recommendations: the latest recommendation for a deployment (dashboards and deploy
scripts poll it: it carries an ETag and answers If-None-Match with 304), and marking one
as deployed (a stored deployment of its config, `api.routes.deployments`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import BaseModel, Field

from api.deps import MAX_ID, NAME_PATTERN, IdPath, PrincipalDep, ReaderDep, SessionDep
from api.problems import ApiError
from api.reads import encode_json, polled_json
from api.routes.deployments import save_deployment
from api.schemas import Problem, RecommendationDeploy
from storage.recommendations import DeploymentFilter, get_recommendation, latest_recommendation
from storage.service_records import Deployment, RecommendationInfo

router = APIRouter(prefix="/v1/recommendations", tags=["recommendations"])

Name = Annotated[str | None, Field(min_length=1, max_length=200, pattern=NAME_PATTERN)]


class LatestQuery(BaseModel):
    """The latest recommendation's filters (every one optional)."""

    trace_id: Annotated[int | None, Field(ge=1, le=MAX_ID, examples=[1])] = None
    stream: Name = None
    model: Name = None
    gpu: Name = None
    gpu_budget: Annotated[
        int | None, Field(ge=1, le=4096, description="the request's GPU budget")
    ] = None
    num_gpus: Annotated[
        int | None,
        Field(ge=1, le=4096, description="deprecated: the former name of gpu_budget"),
    ] = None
    slo_ttft_ms: Annotated[float | None, Field(gt=0, le=1e9)] = None
    slo_tpot_ms: Annotated[float | None, Field(gt=0, le=1e9)] = None

    def deployment(self) -> DeploymentFilter:
        if self.trace_id is not None and self.stream is not None:
            raise ApiError(422, "give at most one of trace_id or stream", kind="validation")
        if None not in (self.gpu_budget, self.num_gpus) and self.gpu_budget != self.num_gpus:
            raise ApiError(
                422,
                "gpu_budget and num_gpus (its former name) differ; give one",
                kind="validation",
            )
        source = None
        if self.trace_id is not None:
            source = f"trace:{self.trace_id}"
        elif self.stream is not None:
            source = f"stream:{self.stream}"
        return DeploymentFilter(
            source=source,
            model=self.model,
            gpu=self.gpu,
            gpu_budget=self.gpu_budget if self.gpu_budget is not None else self.num_gpus,
            slo_ttft_ms=self.slo_ttft_ms,
            slo_tpot_ms=self.slo_tpot_ms,
        )


@router.get(
    "/latest",
    response_model=RecommendationInfo,
    summary="The newest recommendation matching a deployment (every filter optional); ETag",
    responses={
        304: {"description": "unchanged since the ETag in If-None-Match"},
        401: {"model": Problem, "description": "missing or unknown API key"},
        404: {"model": Problem, "description": "no recommendation matches yet"},
        422: {"model": Problem, "description": "both trace_id and stream given"},
    },
)
async def latest(
    request: Request,
    reader: ReaderDep,
    principal: PrincipalDep,
    query: Annotated[LatestQuery, Query()],
) -> Response:
    where, project = query.deployment(), principal.project
    body = await reader.run(
        lambda session: encode_json(
            RecommendationInfo, latest_recommendation(session, project=project, where=where)
        )
    )
    return polled_json(request, body)


@router.post(
    "/{recommendation_id}/deploy",
    status_code=201,
    response_model=Deployment,
    summary="Mark a recommendation as deployed: a deployment of its config",
    responses={
        401: {"model": Problem, "description": "missing or unknown API key"},
        404: {"model": Problem, "description": "no such recommendation in this project"},
        422: {"model": Problem, "description": "an invalid field"},
    },
)
def deploy(
    recommendation_id: IdPath,
    session: SessionDep,
    principal: PrincipalDep,
    response: Response,
    spec: Annotated[RecommendationDeploy | None, Body()] = None,
) -> Deployment:
    """Stores a deployment of the recommended config with `recommendation_id` set."""
    spec = spec or RecommendationDeploy()
    rec = get_recommendation(session, recommendation_id, project=principal.project)
    info = save_deployment(
        session, principal.project, name=spec.name or f"recommendation-{rec.id}",
        config=rec.recommendation.config, prometheus_url=spec.prometheus_url,
        label_selector=spec.label_selector, recommendation_id=rec.id,
    )  # fmt: skip
    response.headers["Location"] = f"/v1/deployments/{info.id}"
    return info
