"""The latest recommendation is served by a plain route in front of its documented FastAPI
route (`api.routes.recommendations.latest_served`): the two answer every kind of request
alike, status, headers and body, checks in the same order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

import api.routes.recommendations as recommendations
import storage.recommendations
from tests.api_tests.conftest import Service
from tests.api_tests.test_api_cache import _store_recommendation
from tests.api_tests.test_api_kept_reads import _fastpath

URL = "/v1/recommendations/latest"
QUERIES = [
    "",
    "?model=llama-3.1-8b",
    "?model=llama-3.1-8b&gpu=h100&num_gpus=8&slo_ttft_ms=300&slo_tpot_ms=50",
    "?model=other",  # no match: 404
    "?stream=prod&trace_id=1",  # both: 422 of the route's own
    "?num_gpus=0",
    "?num_gpus=abc&model=&trace_id=x",
    "?model=a&model=llama-3.1-8b&unknown=1",  # the last value counts; unknown ignored
    "?slo_ttft_ms=nan",
]


@contextlib.contextmanager
def _documented_route_only() -> Iterator[None]:
    """The plain route taken out of the router for a while."""
    routes = recommendations.router.routes
    at = routes.index(recommendations._served)
    routes.pop(at)
    recommendations.router._mark_routes_changed()  # (FastAPI >= 0.16x caches its routes)
    try:
        yield
    finally:
        routes.insert(at, recommendations._served)
        recommendations.router._mark_routes_changed()


def _asked(service: Service, method: str, path: str, headers: dict) -> tuple:
    """One request with nothing kept from earlier ones: (status, headers, body)."""
    _fastpath(service)._answers.clear()
    service.client.app.state.reader._kept.clear()
    service.client.app.state.key_cache.clear()
    r = service.client.request(method, path, headers=headers)
    return r.status_code, sorted(r.headers.items()), r.content


def test_the_plain_route_answers_as_the_documented_route(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store_recommendation(service.url, "a")
    served = []
    caller_of = recommendations.caller_of

    async def counted(request):
        served.append(request.url.path)
        return await caller_of(request)

    monkeypatch.setattr(recommendations, "caller_of", counted)
    callers = {
        "a": service.auth(service.key_a),
        "b": service.auth(service.key_b),
        "unknown": service.auth("st_" + "0" * 40),
        "basic": {"Authorization": f"Basic {service.key_a}"},
        "none": {},
    }
    compared = 0
    for method in ("GET", "HEAD", "POST", "DELETE"):
        for query in QUERIES:
            for name, headers in callers.items():
                asked = len(served)
                plain = _asked(service, method, URL + query, headers)
                assert len(served) == asked + (method == "GET"), (method, query, name)
                with _documented_route_only():
                    documented = _asked(service, method, URL + query, headers)
                assert len(served) == asked + (method == "GET")
                assert plain == documented, (method, query, name)
                compared += 1
    statuses = {_asked(service, "GET", URL + q, h)[0] for q in QUERIES for h in callers.values()}
    assert statuses == {200, 401, 404, 422}  # every kind of answer was compared
    assert compared == 4 * len(QUERIES) * len(callers)


def test_the_documented_route_stays_in_the_openapi_document(service: Service) -> None:
    spec = service.client.get("/openapi.json").json()
    operation = spec["paths"][URL]["get"]
    assert [p["name"] for p in operation["parameters"]] == [
        "trace_id", "stream", "model", "gpu", "num_gpus", "slo_ttft_ms", "slo_tpot_ms",
    ]  # fmt: skip
    assert operation["security"] == [{"HTTPBearer": []}]
    assert set(operation["responses"]) == {"200", "401", "404", "422"}


FIRST_HITS = [
    "?stream=prod",
    "?model=llama-3.1-8b",
    "?gpu=h100&num_gpus=8",
    "?slo_ttft_ms=2000&slo_tpot_ms=50.0",
    "?stream=prod&model=llama-3.1-8b&gpu=h100&num_gpus=8&slo_ttft_ms=2e3&slo_tpot_ms=50",
    "?gpu=a100",
    "?num_gpus=4&model=llama-3.1-8b",
    "?trace_id=7",
]


def test_first_hits_are_answered_from_the_projects_recommendations_in_memory(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a project's recommendations are read, a first hit with new filters runs no
    query of its own, and each row is read and encoded once; it answers what the query
    per filter answers, and a recommendation written by another process shows at once."""
    calls = {"latest_recommendation_ref": 0, "get_recommendations": 0}

    def counting(name: str):
        function = getattr(recommendations, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        monkeypatch.setattr(recommendations, name, counted)

    for name in calls:
        counting(name)
    a = service.auth(service.key_a)
    first = _store_recommendation(service.url, "a")
    assert service.client.get(URL, headers=a).json()["job_id"] == first
    got = {q: service.client.get(URL + q, headers=a) for q in FIRST_HITS}
    assert calls == {"latest_recommendation_ref": 0, "get_recommendations": 1}
    assert [r.status_code for r in got.values()] == [200] * 5 + [404] * 3
    assert {r.json()["job_id"] for r in got.values() if r.status_code == 200} == {first}

    second = _store_recommendation(service.url, "a", gpu_types=("a100",), gpu_budget=4)
    got = {q: service.client.get(URL + q, headers=a) for q in FIRST_HITS}
    assert calls == {"latest_recommendation_ref": 0, "get_recommendations": 2}
    job_ids = [r.json()["job_id"] if r.status_code == 200 else None for r in got.values()]
    assert job_ids == [second, second, first, second, first, second, second, None]

    monkeypatch.setattr(storage.recommendations, "INDEX_MAX_ROWS", 0)  # a query per filter
    for query, r in got.items():
        status, _, body = _asked(service, "GET", URL + query, a)
        assert (status, body) == (r.status_code, r.content), query
    assert calls["latest_recommendation_ref"] == len(FIRST_HITS)
