"""The job queue on every back-end: exclusive claims, lease takeover, fenced writes."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from optimizer.search import TuneProgress, TuneRequest
from storage.db import session_scope
from storage.jobs import (
    claim_job,
    enqueue_job,
    finish_job,
    get_job,
    renew_lease,
    report_progress,
    request_cancel,
)
from storage.service_records import JobStatus

PARAMS = TuneRequest(
    model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=8, slo_ttft_ms=1000, slo_tpot_ms=50,
    trace_id=1,
)  # fmt: skip


def _enqueue(engine, n: int = 1) -> list[int]:
    with session_scope(engine) as s:
        return [enqueue_job(s, project="p", params=PARAMS).id for _ in range(n)]


def _claim(engine, worker: str, *, now: datetime | None = None, lease_s: float = 30):
    with session_scope(engine) as s:
        return claim_job(s, worker=worker, lease_s=lease_s, now=now)


def test_concurrent_claims_take_each_job_once(engine) -> None:
    ids = _enqueue(engine, 12)
    taken: dict[str, list[int]] = {"w1": [], "w2": [], "w3": []}

    def drain(name: str) -> None:
        while (claim := _claim(engine, name)) is not None:
            taken[name].append(claim.job.id)

    threads = [threading.Thread(target=drain, args=(n,)) for n in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = sorted(i for got in taken.values() for i in got)
    assert claimed == ids


def test_expired_lease_is_taken_over_and_the_old_worker_is_fenced(engine) -> None:
    (jid,) = _enqueue(engine)
    past = datetime.now(UTC) - timedelta(minutes=5)
    old = _claim(engine, "old", now=past, lease_s=10)
    assert old is not None and old.attempt == 1
    assert _claim(engine, "busy", now=past + timedelta(seconds=5)) is None  # lease still valid
    new = _claim(engine, "new")
    assert new is not None and new.job.id == jid and new.attempt == 2
    with session_scope(engine) as s:
        assert report_progress(s, old, TuneProgress(1, 5)) is False
        assert renew_lease(s, old, lease_s=10).held is False
        assert finish_job(s, old, status=JobStatus.SUCCEEDED) is False
        assert report_progress(s, new, TuneProgress(2, 5)) is True
        assert renew_lease(s, new, lease_s=10).held is True
        assert finish_job(s, new, status=JobStatus.SUCCEEDED) is True
    with session_scope(engine) as s:
        job = get_job(s, jid)
    assert job.status is JobStatus.SUCCEEDED and job.progress.trials_done == 2


def test_a_job_whose_workers_keep_dying_is_abandoned(engine) -> None:
    (jid,) = _enqueue(engine)
    t = datetime.now(UTC) - timedelta(hours=1)
    for attempt in (1, 2, 3):
        claim = _claim(engine, f"w{attempt}", now=t, lease_s=1)
        assert claim is not None and claim.attempt == attempt
        t += timedelta(seconds=10)
    assert _claim(engine, "w4") is None
    with session_scope(engine) as s:
        job = get_job(s, jid)
    assert job.status is JobStatus.FAILED and "abandoned after 3 attempts" in job.error


def test_cancel_queued_and_flag_running(engine) -> None:
    a, b = _enqueue(engine, 2)
    claim = _claim(engine, "w")
    assert claim is not None and claim.job.id == a
    with session_scope(engine) as s:
        assert request_cancel(s, b).status is JobStatus.CANCELLED
        running = request_cancel(s, a)
        assert running.status is JobStatus.RUNNING and running.cancel_requested
        assert renew_lease(s, claim, lease_s=10).cancel_requested is True
