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


def test_job_records_read_as_rows_equal_those_of_the_orm(engine) -> None:
    """`get_job` and `list_jobs` read plain rows without the result: the records equal
    those built from the ORM's rows, for jobs in every state."""
    import sqlalchemy as sa

    from storage.jobs import _info, get_result_text, list_jobs
    from storage.models import JobRow
    from storage.service_records import JobKind, WindowSummary
    from tests.api_tests.fakes import fake_outcome

    window = WindowSummary(
        trace_ids=(3, 4), num_requests=1200, mean_rate=0.333, input_mean=812.25,
        input_p90=2048.0, output_mean=190.0, output_p90=512.5,
    )  # fmt: skip
    with session_scope(engine) as s:
        enqueue_job(s, project="p", params=PARAMS)
        enqueue_job(s, project="p", params=PARAMS, window=window, schedule_id=7,
                    trigger_reason="rate drift 31%", kind=JobKind.TUNING)  # fmt: skip
        enqueue_job(s, project="q", params=PARAMS)
    running = _claim(engine, "w1")
    with session_scope(engine) as s:
        progress = TuneProgress(3, 9, best_goodput_per_gpu=0.75, eta_s=12.5)
        assert report_progress(s, running, progress)
    finished = _claim(engine, "w2")
    with session_scope(engine) as s:
        finish_job(s, finished, status=JobStatus.SUCCEEDED, outcome=fake_outcome(PARAMS, 2))
    with session_scope(engine) as s:
        request_cancel(s, _enqueue(engine)[0])

    def orm_records(project: str | None) -> list:
        with session_scope(engine) as s:
            query = sa.select(JobRow).order_by(JobRow.id.desc())
            if project is not None:
                query = query.where(JobRow.project == project)
            return [_info(row) for row in s.scalars(query)]

    def records(project: str | None) -> list:
        with session_scope(engine) as s:
            listed = list_jobs(s, project=project)
            assert listed == [get_job(s, job.id) for job in listed]
            return listed

    for project in ("p", "q", None):
        assert records(project) == orm_records(project)
    assert {job.status for job in records(None)} == {
        JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.CANCELLED,
    }  # fmt: skip
    with session_scope(engine) as s:
        assert get_result_text(s, finished.job.id).startswith("{")


def test_keyset_pages_walk_the_list_as_offsets_do(engine) -> None:
    """Pages after a cursor (the last id of the page before) give the whole list, newest
    first, for every filter, as offsets do; a cursor of a job gone or filtered out works."""
    from storage.jobs import count_jobs, list_jobs

    with session_scope(engine) as s:
        for project in ("p", "p", "q", "p", "q", "p", "p"):
            enqueue_job(s, project=project, params=PARAMS)
        request_cancel(s, 4)
    with session_scope(engine) as s:
        filters = (
            {"project": "p"}, {"project": "q"}, {}, {"status": JobStatus.QUEUED},
            {"project": "p", "status": JobStatus.CANCELLED}, {"project": "none"},
        )  # fmt: skip
        for kw in filters:
            whole = list_jobs(s, **kw)
            assert len(whole) == count_jobs(s, **kw)
            for limit in (1, 2, 3):
                walked, after = [], None
                while page := list_jobs(s, **kw, limit=limit, after=after):
                    walked += page
                    after = page[-1].id
                assert walked == whole, (kw, limit)
                by_offset = [list_jobs(s, **kw, limit=limit, offset=o) for o in range(0, 8, limit)]
                assert [j for p in by_offset for j in p] == whole
        assert [j.id for j in list_jobs(s, project="p", after=3)] == [2, 1]  # 3 is q's
        assert [j.id for j in list_jobs(s, project="p", after=6, offset=1)] == [2, 1]
