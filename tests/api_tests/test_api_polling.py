"""The polled answers (job status, job result, latest recommendation): a weak ETag,
If-None-Match answered with 304, a short private max-age; never stale, since every
request reads the database. And the API-key cache: entries expire, and a key revoked
through the API stops working at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.deps import KeyCache
from api.reads import etag_of, matches
from storage.service_records import Principal
from tests.api_tests.conftest import Service
from tests.api_tests.test_api_jobs import _create, _trace


def test_if_none_match_compares_weakly_and_reads_lists() -> None:
    tag = etag_of(b"{}")
    assert tag.startswith('W/"') and tag == etag_of(b"{}") != etag_of(b"[]")
    strong = tag.removeprefix("W/")
    assert matches(tag, tag) and matches(strong, tag) and matches("*", tag)
    assert matches(f'"x", {tag}', tag) and matches(f'W/"x",{strong}', tag)
    assert not matches(None, tag) and not matches('W/"x"', tag) and not matches("", tag)


def test_key_cache_entries_expire_and_are_dropped_by_key() -> None:
    now = [0.0]
    cache = KeyCache(2.0, clock=lambda: now[0])
    alice, bob = Principal(1, "a", False), Principal(2, "a", True)
    cache.put("h1", alice)
    now[0] = 1.9
    assert cache.get("h1") == alice and cache.get("h2") is None
    now[0] = 2.0
    assert cache.get("h1") is None  # expired
    for hashed, principal in (("h1", alice), ("h2", bob), ("h3", alice)):
        cache.put(hashed, principal)
    cache.drop(1)  # alice's key, under both of its hashes
    assert cache.get("h1") is None and cache.get("h3") is None and cache.get("h2") == bob
    off = KeyCache(0)
    off.put("h1", alice)
    assert off.get("h1") is None


def test_revoking_through_the_api_takes_effect_at_once(service: Service) -> None:
    admin = service.auth(service.admin)
    created = service.client.post("/v1/keys", json={"project": "ops"}, headers=admin).json()
    mine = service.auth(created["key"])
    assert service.client.get("/v1/traces", headers=mine).status_code == 200  # now cached
    assert service.client.delete(f"/v1/keys/{created['id']}", headers=admin).status_code == 200
    r = service.client.get("/v1/traces", headers=mine)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    listed = service.client.get("/v1/keys?project=ops", headers=admin).json()["items"]
    assert [k["revoked_at"] is not None for k in listed] == [False, True]


def _store_recommendation(url: str, project: str, **changes) -> int:
    """A succeeded job's recommendation for `project` (of a stream "prod"; `changes` to the
    request's parameters), written through its own engine; the job's id."""
    from optimizer.search import TuneRequest
    from storage.db import make_engine, session_scope
    from storage.jobs import claim_job, enqueue_job, finish_job
    from storage.service_records import JobStatus
    from tests.api_tests.fakes import fake_outcome

    params = TuneRequest(**{
        "model": "llama-3.1-8b", "gpu_types": ("h100",), "gpu_budget": 8, "slo_ttft_ms": 2000,
        "slo_tpot_ms": 50, "stream": "prod", **changes,
    })  # fmt: skip
    engine = make_engine(url)
    with session_scope(engine) as s:
        job = enqueue_job(s, project=project, params=params)
    with session_scope(engine) as s:
        claim = claim_job(s, worker="test", lease_s=60)
        finish_job(s, claim, status=JobStatus.SUCCEEDED, outcome=fake_outcome(params, 3))
    engine.dispose()
    return job.id


def _revalidate(service: Service, url: str, headers: dict[str, str]):
    """The answer, then the same request with its ETag: (first response, the 304)."""
    first = service.client.get(url, headers=headers)
    assert first.status_code == 200, first.text
    assert first.headers["cache-control"] == "private, max-age=1"
    assert first.headers["vary"] == "Authorization"
    etag = first.headers["etag"]
    again = service.client.get(url, headers={**headers, "If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == etag
    return first, again


def test_the_latest_recommendation_revalidates_and_is_never_stale(service: Service) -> None:
    url = "/v1/recommendations/latest?stream=prod&model=llama-3.1-8b"
    a = service.auth(service.key_a)
    assert service.client.get(url, headers=a).status_code == 404
    job_id = _store_recommendation(service.url, "a")  # by another connection (a worker)
    first, _ = _revalidate(service, url, a)
    assert first.json()["job_id"] == job_id
    assert first.headers["content-type"] == "application/json"
    # A newer recommendation: the old ETag no longer matches, the new answer comes at once.
    newer = _store_recommendation(service.url, "a")
    r = service.client.get(url, headers={**a, "If-None-Match": first.headers["etag"]})
    assert r.status_code == 200 and r.json()["job_id"] == newer != job_id
    # Another project, a malformed or missing key: never project a's answer.
    assert service.client.get(url, headers=service.auth(service.key_b)).status_code == 404
    for bad in (f"Basic {service.key_a}", f"Bearer {service.key_a}x", "Bearer"):
        assert service.client.get(url, headers={"Authorization": bad}).status_code == 401
    assert service.client.get(url).status_code == 401
    assert service.client.get(url + "&num_gpus=0", headers=a).status_code == 422
    both = service.client.get(url + "&trace_id=1", headers=a)
    assert both.status_code == 422 and "at most one of trace_id or stream" in both.text
    metrics = service.client.get("/metrics").text
    assert 'route="/v1/recommendations/latest",status="304"} ' in metrics


@pytest.mark.parametrize("path", ["/v1/tuning-jobs/{id}", "/v1/tuning-jobs/{id}/result"])
def test_job_status_and_result_revalidate(service: Service, tmp_path: Path, path: str) -> None:
    a = service.auth(service.key_a)
    job_id = _create(service, trace_id=_trace(service, tmp_path), num_trials=3).json()["id"]
    url = path.format(id=job_id)
    result = path.endswith("/result")
    if result:
        r = service.client.get(url, headers=a)
        assert r.status_code == 409 and "etag" not in r.headers  # no result yet: no validator
        queued_etag = None
    else:
        queued, _ = _revalidate(service, url, a)
        assert queued.json()["status"] == "queued"
        queued_etag = queued.headers["etag"]
    assert service.worker().run_once() is True
    r = service.client.get(url, headers={**a, "If-None-Match": "*"})
    assert r.status_code == 304  # `*`: any current answer
    done, _ = _revalidate(service, url, a)
    if result:
        assert done.json()["job_id"] == job_id and "pareto" in done.text
    else:  # the job moved on: the queued answer's ETag no longer matches
        assert done.json()["status"] == "succeeded" and done.headers["etag"] != queued_etag
        r = service.client.get(url, headers={**a, "If-None-Match": queued_etag})
        assert r.status_code == 200 and r.json()["status"] == "succeeded"
    other = service.client.get(url, headers=service.auth(service.key_b))
    assert other.status_code == 404 and "etag" not in other.headers
