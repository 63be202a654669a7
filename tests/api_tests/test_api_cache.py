"""The hot-path caches: TTL expiry, single-flight loads, revocation through the API
taking effect at once despite the key cache, and polls of the latest recommendation
answered before routing yet never stale."""

from __future__ import annotations

import asyncio
import threading

import pytest

from api.cache import TtlCache
from tests.api_tests.conftest import Service


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_and_are_bounded() -> None:
    clock = FakeClock()
    cache: TtlCache[str, int] = TtlCache(2.0, max_entries=2, clock=clock)
    cache.put("a", 1)
    clock.now = 1.9
    assert cache.get("a") == 1
    clock.now = 2.0
    assert cache.get("a") is None and len(cache) == 0
    for key in "abc":
        cache.put(key, ord(key))
    assert cache.get("a") is None and cache.get("c") == ord("c") and len(cache) == 2
    assert cache.discard_where(lambda v: v == ord("b")) == 1 and cache.get("b") is None
    off: TtlCache[str, int] = TtlCache(0)
    off.put("a", 1)
    assert off.get("a") is None
    with pytest.raises(ValueError):
        TtlCache(-1)


def test_concurrent_misses_share_one_load_and_none_is_not_cached() -> None:
    cache: TtlCache[str, int] = TtlCache(60)
    calls: list[int] = []
    gate = threading.Event()

    def load() -> int:
        gate.wait(5)
        calls.append(1)
        return 7

    def missing() -> int | None:
        calls.append(2)
        return None

    def broken() -> int:
        raise LookupError("nope")

    async def main() -> None:
        waiters = [asyncio.ensure_future(cache.get_or_load("k", load)) for _ in range(20)]
        await asyncio.sleep(0.05)
        gate.set()
        assert await asyncio.gather(*waiters) == [7] * 20
        assert calls == [1] and await cache.get_or_load("k", load) == 7
        assert await cache.get_or_load("m", missing) is None
        assert await cache.get_or_load("m", missing) is None
        assert calls == [1, 2, 2]
        for _ in range(2):
            with pytest.raises(LookupError):
                await cache.get_or_load("x", broken)

    asyncio.run(main())


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


def test_repeated_polls_keep_the_route_rules(service: Service) -> None:
    """Identical polls are answered by api.fastpath; they agree with the route, and a
    recommendation written by another process shows on the very next poll."""
    from tests.api_tests.test_api_kept_reads import _fastpath

    url = "/v1/recommendations/latest?stream=prod&model=llama-3.1-8b"
    a = service.auth(service.key_a)
    assert service.client.get(url, headers=a).status_code == 404
    job_id = _store_recommendation(service.url, "a")  # the 404 was kept: not any more
    first = service.client.get(url, headers=a)
    assert first.status_code == 200 and first.json()["job_id"] == job_id
    fastpath = _fastpath(service)
    for _ in range(50):  # on PostgreSQL, other tests' commits may send a poll to the route
        replayed = fastpath.replayed
        second = service.client.get(url, headers=a)
        assert second.content == first.content
        assert second.headers["content-type"] == "application/json"
        if fastpath.replayed == replayed + 1:
            break
    else:
        raise AssertionError("no poll was answered before routing")
    # Another project, a malformed or missing key: never the stored answer.
    assert service.client.get(url, headers=service.auth(service.key_b)).status_code == 404
    for bad in (f"Basic {service.key_a}", f"Bearer {service.key_a}x", "Bearer"):
        assert service.client.get(url, headers={"Authorization": bad}).status_code == 401
    assert service.client.get(url).status_code == 401
    assert service.client.get(url + "&num_gpus=0", headers=a).status_code == 422
    metrics = service.client.get("/metrics").text
    assert 'route="/v1/recommendations/latest",status="200"} ' in metrics
    # A newer recommendation, written by another connection (a worker): at once.
    newer = _store_recommendation(service.url, "a")
    assert service.client.get(url, headers=a).json()["job_id"] == newer != job_id
