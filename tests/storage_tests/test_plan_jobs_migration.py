"""Migration 0170 (plan jobs) on a database that already holds a tuning job, its schedule
and a plan of `servetune plan`: all read back as before, plan jobs are a kind of their
own whose plan names the job, and the downgrade drops plan jobs and keeps the rest."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command

from optimizer.search import TuneProgress, TuneRequest
from storage.codec import to_json
from storage.db import _alembic_config, make_engine, session_scope, upgrade_database
from storage.jobs import (
    JobNotFound,
    claim_job,
    count_jobs,
    enqueue_job,
    finish_job,
    get_job,
    get_result,
    list_jobs,
)
from storage.plans import get_plan, list_plans
from storage.schedules import get_schedule
from storage.service_records import JobKind, JobStatus, WindowSummary
from tests.api_tests.fakes import fake_outcome
from tests.factories import make_plan

REQUEST = TuneRequest(
    model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=8, slo_ttft_ms=2000.0,
    slo_tpot_ms=50.0, trace_id=7, num_trials=4,
)  # fmt: skip
WINDOW = WindowSummary((7,), 600, 2.0, 700.0, 790.0, 70.0, 98.0)


@pytest.fixture(scope="module")
def plan():
    return make_plan(trace_id=7)


def _seed_0160(url: str, plan) -> tuple[int, int, int]:
    """A tuning job, a stream schedule and a CLI plan stored at 0160: their ids."""
    upgrade_database(url, "0160_plans")
    now = datetime.now(UTC)
    engine = make_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine, only=["jobs", "schedules", "plans"])
    with engine.begin() as conn:
        job = conn.execute(
            meta.tables["jobs"].insert(),
            {
                "project": "p", "kind": "tuning", "status": "succeeded",
                "params": REQUEST.to_dict(), "window": to_json(WINDOW),
                "progress": to_json(TuneProgress(4, 4, 1.5, 0.0)),
                "result": fake_outcome(REQUEST, 4).to_dict(), "created_at": now, "attempts": 1,
                "cancel_requested": False,
            },
        )  # fmt: skip
        stream = replace(REQUEST, trace_id=None, stream="prod")
        schedule = conn.execute(
            meta.tables["schedules"].insert(),
            {
                "project": "p", "name": "s", "params": stream.to_dict(),
                "interval_s": 60.0, "trigger": "always", "drift_threshold": 0.2,
                "paused": False, "created_at": now, "num_fired": 0,
            },
        )  # fmt: skip
        stored = conn.execute(
            meta.tables["plans"].insert(),
            {
                "project": "p", "trace_id": 7, "model": "llama-3.1-8b", "gpu": "h100",
                "request": plan.request.to_dict(), "outcome": plan.to_dict(), "created_at": now,
            },
        )  # fmt: skip
    engine.dispose()
    return (
        job.inserted_primary_key[0],
        schedule.inserted_primary_key[0],
        stored.inserted_primary_key[0],
    )


def test_tuning_jobs_and_plans_stored_before_read_back(db_url: str, plan) -> None:
    job_id, schedule_id, plan_id = _seed_0160(db_url, plan)
    upgrade_database(db_url)
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            job = get_job(s, job_id)
            assert job.kind is JobKind.TUNING and job.params == REQUEST
            assert job.progress == TuneProgress(4, 4, 1.5, 0.0) and job.window == WINDOW
            assert get_result(s, job_id).outcome == fake_outcome(REQUEST, 4).to_dict()
            assert [j.id for j in list_jobs(s, kind=JobKind.TUNING)] == [job_id]
            assert count_jobs(s, kind=JobKind.PLAN) == 0
            with pytest.raises(JobNotFound, match=f"plan job {job_id} not found"):
                get_job(s, job_id, kind=JobKind.PLAN)
            schedule = get_schedule(s, schedule_id)
            assert schedule.plan is None and schedule.params.stream == "prod"
            cli_plan = get_plan(s, plan_id)
            assert cli_plan.job_id is None and cli_plan.plan == plan
        # a plan job now: queued on the same queue, its plan stored linked to it
        with session_scope(engine) as s:
            queued = enqueue_job(s, project="p", params=plan.request, window=WINDOW)
        assert queued.kind is JobKind.PLAN
        with session_scope(engine) as s:
            claim = claim_job(s, worker="w", lease_s=30)
            assert (
                claim is not None and claim.job.id == queued.id and claim.job.params == plan.request
            )
            assert finish_job(s, claim, status=JobStatus.SUCCEEDED, outcome=plan)
        with session_scope(engine) as s:
            linked = [p for p in list_plans(s, project="p") if p.job_id == queued.id]
            assert len(linked) == 1 and linked[0].plan == plan
            assert get_job(s, queued.id).status is JobStatus.SUCCEEDED
            with pytest.raises(JobNotFound, match=f"tuning job {queued.id} not found"):
                get_result(s, queued.id)  # a plan job's result is its plan, not an outcome
    finally:
        engine.dispose()
    command.downgrade(_alembic_config(db_url), "0160_plans")
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            jobs = conn.execute(sa.text("select id, kind from jobs")).all()
            assert jobs == [(job_id, "tuning")]
            assert conn.execute(sa.text("select id from plans")).all() == [(plan_id,)]
            assert conn.execute(sa.text("select id from schedules")).all() == [(schedule_id,)]
    finally:
        engine.dispose()
    upgrade_database(db_url)
