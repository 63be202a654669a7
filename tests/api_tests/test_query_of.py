"""`api.deps.query_of`: a query string validated as one model behaves, and is documented,
exactly as FastAPI's own `Query()` parameters (checked against a route declaring them
one by one, the way the latest-recommendation route did before)."""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import FastAPI, Query
from fastapi.testclient import TestClient

from api.deps import NAME_PATTERN, query_of, query_openapi
from api.problems import install_problem_handlers
from api.routes.recommendations import LatestQuery

Name = Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)]


def _apps() -> TestClient:
    app = FastAPI()
    install_problem_handlers(app)

    @app.get("/one-by-one")
    async def one_by_one(
        trace_id: Annotated[int | None, Query(ge=1, le=2**31 - 1, examples=[1])] = None,
        stream: Name = None,
        model: Name = None,
        gpu: Name = None,
        num_gpus: Annotated[int | None, Query(ge=1, le=4096)] = None,
        slo_ttft_ms: Annotated[float | None, Query(gt=0, le=1e9)] = None,
        slo_tpot_ms: Annotated[float | None, Query(gt=0, le=1e9)] = None,
    ) -> LatestQuery:
        return LatestQuery(trace_id, stream, model, gpu, num_gpus, slo_ttft_ms, slo_tpot_ms)

    @app.get("/as-one", openapi_extra=query_openapi(LatestQuery))
    async def as_one(query: Annotated[LatestQuery, query_of(LatestQuery)]) -> LatestQuery:
        return query

    return TestClient(app)


QUERIES = [
    "",
    "model=llama&gpu=h100&num_gpus=8&slo_ttft_ms=300.5&slo_tpot_ms=50&stream=prod",
    "trace_id=7&num_gpus=%2B8&slo_ttft_ms=1_0",
    "model=a&model=b&unknown=3",
    "num_gpus=0",
    "num_gpus=abc",
    "num_gpus=",
    "num_gpus=4097",
    "num_gpus=1.5",
    "model=",
    "model=%01",
    "model=" + "x" * 201,
    "trace_id=0",
    "trace_id=99999999999",
    "trace_id=true",
    "slo_ttft_ms=-1",
    "slo_ttft_ms=nan",
    "slo_tpot_ms=1e10",
    "num_gpus=abc&trace_id=x&slo_ttft_ms=0&gpu=",
]


@pytest.mark.parametrize("query", QUERIES)
def test_answers_and_errors_are_fastapis(query: str) -> None:
    client = _apps()
    reference = client.get(f"/one-by-one?{query}")
    got = client.get(f"/as-one?{query}")
    assert got.status_code == reference.status_code
    if reference.status_code == 422:
        expected, body = reference.json(), got.json()
        assert body["errors"] == expected["errors"] and body["detail"] == expected["detail"]
    else:
        assert got.json() == reference.json()


def test_the_parameters_are_documented_as_fastapi_documents_them() -> None:
    spec = _apps().app.openapi()["paths"]
    assert spec["/as-one"]["get"]["parameters"] == spec["/one-by-one"]["get"]["parameters"]
