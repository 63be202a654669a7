"""A plan job's capacity searches and fleet replays as `plan_part` jobs of the worker
pool: one worker alone runs them and assembles the plan the in-process path makes; two
worker processes on PostgreSQL split one plan's parts; a failed part fails the plan and
stores nothing; a cancelled plan cancels its parts, a plan whose worker lost its lease
leaves them to its successor; a worker killed mid-part is taken over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from api.services.ingest import ingest_trace
from api.services.planning import load_plan_trace, make_plan
from api.worker import JobContext, JobFailed, JobStopped, Worker, WorkerOptions, default_executors
from api.worker.plan_parts import pool_parts, run_part_job
from optimizer.config import ServingConfig
from optimizer.plan import FleetKind, FleetPart, FleetPlan, PlanPart, PlanRequest
from optimizer.sim.scaling import ReplicaSchedule
from storage.db import make_engine, session_scope, upgrade_database
from storage.jobs import enqueue_job, get_job, job_parts
from storage.plans import plan_text_of_job
from storage.service_records import JobKind, JobStatus
from tests.api_tests.test_api_plans import _trace_csv

REPO = Path(__file__).resolve().parents[2]
UNIT = ServingConfig.from_dict(
    yaml.safe_load((REPO / "examples" / "colocated-h100.yaml").read_text())
)


def _request(trace_id: int) -> PlanRequest:
    return PlanRequest(
        model="llama-3.1-8b",
        gpu="h100",
        slo_ttft_ms=1000,
        slo_tpot_ms=50,
        trace_id=trace_id,
        window_s=60,
        cold_start_s=10,
        gpu_budget=8,
        price_per_gpu_hour=2.5,
        unit=UNIT,
    )


def _queue_plan(url: str, tmp_path: Path) -> tuple[int, PlanRequest]:
    """A stored trace (6,000 requests, ~4 min at 20, then 60, then 20 req/s: its three
    fleets differ) and a plan job on it: (job id, request)."""
    upgrade_database(url)
    engine = make_engine(url)
    try:
        with session_scope(engine) as s:
            tid = ingest_trace(s, _trace_csv(tmp_path / "day.csv", 6000, 20.0)).trace.id
            request = _request(tid)
            return enqueue_job(s, project="p", params=request).id, request
    finally:
        engine.dispose()


def _in_process(url: str, request: PlanRequest) -> FleetPlan:
    return make_plan(request, load_plan_trace(url, request.trace_id), database_url=url)


def _worker(url: str, **executors) -> Worker:
    return Worker(
        make_engine(url),
        storage_url=url,
        executors={**default_executors(), **executors},
        options=WorkerOptions(lease_s=30, poll_s=0.2, run_schedules=False),
        name="solo",
    )


def _stored_plan(session, job_id: int) -> FleetPlan:
    found = plan_text_of_job(session, job_id)
    assert found is not None, f"no plan stored for job {job_id}"
    return FleetPlan.from_dict(json.loads(found.outcome))


def _plans(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("select count(*) from plans")).scalar_one()
    finally:
        engine.dispose()


def test_one_worker_runs_the_parts_and_makes_the_in_process_plan(
    db_url: str, tmp_path: Path
) -> None:
    jid, request = _queue_plan(db_url, tmp_path)
    assert _worker(db_url).run_once() is True  # the plan job, its parts run inside it
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            job = get_job(s, jid)
            parts = job_parts(s, jid)
            stored = _stored_plan(s, jid)
    finally:
        engine.dispose()
    assert job.status is JobStatus.SUCCEEDED, job.error
    buckets = stored.bucketing.buckets
    capacities = [f"length-mix bucket {b.index + 1}'s capacity" for b in buckets]
    # A fleet that holds the static fleet's units throughout is not replayed again.
    static = stored.fleets[0]
    stands_for = [f for f in stored.fleets if "replay stands for it" in f.note]
    assert all(f.schedule == static.schedule and f.kind is not static.kind for f in stands_for)
    replayed = [f for f in stored.fleets if f not in stands_for]
    assert [p.params.describe() for p in parts] == capacities + [
        f"the {f.kind.value} fleet's replay" for f in replayed
    ]
    assert all(p.status is JobStatus.SUCCEEDED and p.worker == "solo" for p in parts)
    results = [p.result for p in parts]
    assert tuple(r.bucket for r in results[: len(buckets)]) == buckets
    assert tuple(r.fleet for r in results[len(buckets) :]) == tuple(replayed)
    # The same plan, figure for figure, as the in-process path's.
    assert stored.to_dict() == _in_process(db_url, request).to_dict()


def test_a_failed_part_fails_the_plan_and_stores_nothing(db_url: str, tmp_path: Path) -> None:
    def fails(ctx: JobContext):
        if ctx.job.params.fleet is None:  # the capacities run
            return run_part_job(ctx)
        raise JobFailed(f"no room for the {ctx.job.params.fleet.kind.value} fleet")

    jid, _ = _queue_plan(db_url, tmp_path)
    assert _worker(db_url, **{JobKind.PLAN_PART: fails}).run_once() is True
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            job = get_job(s, jid)
            parts = job_parts(s, jid)
    finally:
        engine.dispose()
    fleets = [p for p in parts if p.params.fleet is not None]
    assert job.status is JobStatus.FAILED
    assert job.error == (
        f"the static fleet's replay (plan part job {fleets[0].id}) failed: no room for the "
        "static fleet"
    )
    assert all(p.status is JobStatus.SUCCEEDED for p in parts if p.params.capacity)
    # The first fleet failed; the plan job cancelled the two it had not run.
    assert [p.status for p in fleets] == [JobStatus.FAILED] + [JobStatus.CANCELLED] * 2
    assert _plans(db_url) == 0


def _parts(request: PlanRequest) -> tuple[PlanPart, ...]:
    """Three parts as the plan would make them (nothing here replays them)."""
    one, three = ReplicaSchedule.constant(1), ReplicaSchedule.constant(3)
    return (
        PlanPart(request, UNIT, "lat", fleet=FleetPart(FleetKind.STATIC, "n", static_units=2)),
        PlanPart(request, UNIT, "lat", fleet=FleetPart(FleetKind.SCHEDULED, "n", schedule=one)),
        PlanPart(request, UNIT, "lat", fleet=FleetPart(FleetKind.SCHEDULED, "n", schedule=three)),
    )


def _context(url: str, jid: int, *, cancelled: bool) -> JobContext:
    engine = make_engine(url)
    try:
        with session_scope(engine) as s:
            job = get_job(s, jid)
    finally:
        engine.dispose()
    return JobContext(
        job=job,
        storage_url=url,
        study_name="",
        resumed=False,
        report=lambda _p: None,
        should_stop=lambda: True,
        cancel_requested=lambda: cancelled,
        run_part=lambda: False,
        poll_s=0.01,
    )


@pytest.mark.parametrize("cancelled", [True, False], ids=["cancelled", "lease-lost"])
def test_a_stopped_plan_cancels_its_parts_only_when_it_was_cancelled(
    db_url: str, tmp_path: Path, cancelled: bool
) -> None:
    """Cancelled: its unfinished parts are cancelled. Its lease lost: another worker took
    the plan over and waits on the same parts, which are left running."""
    jid, request = _queue_plan(db_url, tmp_path)
    ctx = _context(db_url, jid, cancelled=cancelled)

    def step(message: str) -> None:
        if ctx.should_stop():
            raise JobStopped(message)

    with pytest.raises(JobStopped):
        pool_parts(ctx, step)(_parts(request))
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            parts = job_parts(s, jid)
    finally:
        engine.dispose()
    assert [p.params for p in parts] == list(_parts(request))
    want = JobStatus.CANCELLED if cancelled else JobStatus.QUEUED
    assert [p.status for p in parts] == [want] * 3


def _stop(message: str) -> None:
    raise JobStopped(message)


def test_a_takeover_waits_on_the_parts_already_queued(db_url: str, tmp_path: Path) -> None:
    """A later attempt of the plan job queues no parts again; parts that differ from the
    fleets it sized fail it with a message, and are cancelled."""
    jid, request = _queue_plan(db_url, tmp_path)
    ctx = _context(db_url, jid, cancelled=False)
    first = _parts(request)
    for _attempt in range(2):
        with pytest.raises(JobStopped):
            pool_parts(ctx, _stop)(first)
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            assert [p.params for p in job_parts(s, jid)] == list(first)
        with pytest.raises(JobFailed, match="differ from those its earlier attempt queued"):
            pool_parts(ctx, lambda _m: None)((first[0], first[1], first[0]))
        with session_scope(engine) as s:
            parts = job_parts(s, jid)
    finally:
        engine.dispose()
    assert len(parts) == 3 and all(p.status is JobStatus.CANCELLED for p in parts)


def _spawn(url: str, lease_s: float = 30, mode: str = "peer") -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [url, str(lease_s), "0.2", mode]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.api_tests.plan_worker", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("ready "), line
    return proc, line.removeprefix("ready ")


def _wait(engine, jid: int, done, timeout_s: float = 300.0):
    """The plan job once `done(job, parts)` holds (a deadline, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with session_scope(engine) as s:
            job, parts = get_job(s, jid), job_parts(s, jid)
        if done(job, parts):
            return job
        time.sleep(0.1)
    raise AssertionError(f"timed out; the plan job is {job}, its parts {parts}")


@pytest.mark.postgres
def test_two_worker_processes_split_one_plan_on_postgres(postgres_url: str, tmp_path: Path) -> None:
    jid, request = _queue_plan(postgres_url, tmp_path)
    procs = []
    try:
        for _ in range(2):
            procs.append(_spawn(postgres_url))
        engine = make_engine(postgres_url)
        job = _wait(engine, jid, lambda job, _parts: job.status.finished)
        with session_scope(engine) as s:
            parts = job_parts(s, jid)
            stored = _stored_plan(s, jid) if job.status is JobStatus.SUCCEEDED else None
        engine.dispose()
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(timeout=30)
    assert job.status is JobStatus.SUCCEEDED, job.error
    assert stored is not None
    names = {name for _, name in procs}
    assert all(p.status is JobStatus.SUCCEEDED for p in parts) and len(parts) >= 4
    # Each part names the worker that ran it: both processes ran some.
    assert {p.worker for p in parts} == names
    assert stored.to_dict() == _in_process(postgres_url, request).to_dict()


@pytest.mark.postgres
def test_a_worker_killed_mid_part_is_taken_over(postgres_url: str, tmp_path: Path) -> None:
    """The worker running the plan job and one of its parts is SIGKILLed: after the
    leases expire another worker takes both over (as it takes over a tuning job), and
    the plan is the in-process one."""
    jid, request = _queue_plan(postgres_url, tmp_path)
    first, _ = _spawn(postgres_url, lease_s=2, mode="hang")  # stays in its first part
    second = None
    engine = make_engine(postgres_url)
    try:
        _wait(engine, jid, lambda _job, parts: any(p.status is JobStatus.RUNNING for p in parts))
        first.kill()
        first.wait(timeout=30)
        second, name = _spawn(postgres_url, lease_s=2, mode="plain")
        job = _wait(engine, jid, lambda job, _parts: job.status.finished)
        with session_scope(engine) as s:
            parts = job_parts(s, jid)
            stored = _stored_plan(s, jid) if job.status is JobStatus.SUCCEEDED else None
    finally:
        engine.dispose()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    assert job.status is JobStatus.SUCCEEDED, job.error
    assert job.attempts == 2  # taken over once
    assert all(p.status is JobStatus.SUCCEEDED for p in parts) and len(parts) >= 4
    assert {p.worker for p in parts} == {name}
    # The killed part (the first capacity search) ran again, once; the others once.
    assert [p.attempts for p in parts] == [2] + [1] * (len(parts) - 1)
    assert stored is not None
    assert stored.to_dict() == _in_process(postgres_url, request).to_dict()
