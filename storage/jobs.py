"""The durable job queue: enqueue, claim with a lease, heartbeat, finish, cancel.

Claims lock the row they take: `SELECT ... FOR UPDATE SKIP LOCKED` on
PostgreSQL (concurrent workers skip each other's rows), and on SQLite the
single-writer `BEGIN IMMEDIATE` transaction every `session_scope` opens (see
storage/db.py), so two claims never interleave. A claim sets a lease
(`lease_owner`, `lease_expires_at`) and bumps `attempts`; a running job whose
lease expired (its worker died) is claimed again by another worker. Every
later write by a worker (heartbeat, progress, finish) names the attempt it
holds and is ignored once another worker took over, so a stalled worker can
never overwrite its successor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from optimizer.search import TuneOutcome, TuneProgress, TuneRequest
from storage.codec import from_json, to_json
from storage.listing import count_rows, page_rows
from storage.models import JobRow
from storage.recommendations import save_recommendation
from storage.service_records import (
    ClaimedJob,
    JobInfo,
    JobKind,
    JobResult,
    JobStatus,
    WindowSummary,
)


class JobNotFound(LookupError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"tuning job {job_id} not found")
        self.job_id = job_id


class JobNotFinished(RuntimeError):
    def __init__(self, job: JobInfo) -> None:
        detail = f": {job.error}" if job.error else ""
        super().__init__(f"tuning job {job.id} has no result (status {job.status}){detail}")
        self.job = job


@dataclass(frozen=True, slots=True)
class LeaseState:
    held: bool  # False: the lease expired and another worker may hold the job now
    cancel_requested: bool


def _info(row: JobRow | sa.Row) -> JobInfo:
    return JobInfo(
        id=row.id,
        project=row.project,
        kind=JobKind(row.kind),
        status=JobStatus(row.status),
        params=from_json(TuneRequest, row.params),
        created_at=row.created_at,
        progress=None if row.progress is None else from_json(TuneProgress, row.progress),
        window=None if row.window is None else from_json(WindowSummary, row.window),
        started_at=row.started_at,
        finished_at=row.finished_at,
        error=row.error,
        attempts=row.attempts,
        cancel_requested=row.cancel_requested,
        worker=row.lease_owner if row.status == JobStatus.RUNNING else None,
        schedule_id=row.schedule_id,
        trigger_reason=row.trigger_reason,
    )


def enqueue_job(
    session: Session,
    *,
    project: str,
    params: TuneRequest,
    window: WindowSummary | None = None,
    schedule_id: int | None = None,
    trigger_reason: str | None = None,
    kind: JobKind = JobKind.TUNING,
) -> JobInfo:
    row = JobRow(
        project=project,
        kind=str(kind),
        status=str(JobStatus.QUEUED),
        params=to_json(params),
        window=None if window is None else to_json(window),
        created_at=datetime.now(UTC),
        attempts=0,
        cancel_requested=False,
        schedule_id=schedule_id,
        trigger_reason=trigger_reason,
    )
    session.add(row)
    session.flush()
    return _info(row)


# A job's description never needs its result, the largest document (the whole Pareto
# front with launch commands, tens of kilobytes): read only for the result itself.
_DESCRIPTION = tuple(c for c in JobRow.__table__.c if c.name != "result")


def _row(session: Session, job_id: int, project: str | None) -> JobRow:
    row = session.get(JobRow, job_id)
    if row is None or (project is not None and row.project != project):
        raise JobNotFound(job_id)
    return row


_JOB_BY_ID = sa.select(*_DESCRIPTION).where(JobRow.id == sa.bindparam("id"))


def get_job(session: Session, job_id: int, *, project: str | None = None) -> JobInfo:
    row = session.connection().execute(_JOB_BY_ID, {"id": job_id}).first()
    if row is None or (project is not None and row.project != project):
        raise JobNotFound(job_id)
    return _info(row)


def list_jobs(
    session: Session,
    *,
    project: str | None = None,
    status: JobStatus | None = None,
    limit: int = 100,
    offset: int = 0,
    after: int | None = None,
) -> list[JobInfo]:
    """Newest first; `after`: only jobs with a smaller id (a keyset cursor)."""
    rows = page_rows(
        session, _JOBS, where=_where(project, status), limit=limit, offset=offset, after=after,
        newest_first=True, columns=_DESCRIPTION,
    )  # fmt: skip
    return [_info(r) for r in rows]


def count_jobs(
    session: Session, *, project: str | None = None, status: JobStatus | None = None
) -> int:
    return count_rows(session, _JOBS, where=_where(project, status))


_JOBS = JobRow.__table__


def _where(project: str | None, status: JobStatus | None) -> dict[str, object]:
    return {"project": project, "status": None if status is None else str(status)}


def count_by_status(session: Session) -> dict[JobStatus, int]:
    rows = session.execute(sa.select(JobRow.status, sa.func.count()).group_by(JobRow.status))
    counts = dict.fromkeys(JobStatus, 0)
    for status, n in rows:
        counts[JobStatus(status)] = int(n)
    return counts


def request_cancel(session: Session, job_id: int, *, project: str | None = None) -> JobInfo:
    """Cancel a job: a queued job at once, a running one when its worker next polls."""
    row = _row(session, job_id, project)
    status = JobStatus(row.status)
    if status is JobStatus.QUEUED:
        row.status = str(JobStatus.CANCELLED)
        row.finished_at = datetime.now(UTC)
        row.error = "cancelled before it started"
    if not status.finished:
        row.cancel_requested = True
    session.flush()
    return _info(row)


def claim_job(
    session: Session,
    *,
    worker: str,
    lease_s: float,
    max_attempts: int = 3,
    now: datetime | None = None,
) -> ClaimedJob | None:
    """Take the oldest runnable job (queued, or running with an expired lease)."""
    now = now or datetime.now(UTC)
    runnable = sa.or_(
        JobRow.status == str(JobStatus.QUEUED),
        sa.and_(JobRow.status == str(JobStatus.RUNNING), JobRow.lease_expires_at < now),
    )
    while True:
        row = session.scalar(
            sa.select(JobRow)
            .where(runnable)
            .order_by(JobRow.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        if row is None:
            return None
        if row.attempts >= max_attempts:
            # Its workers kept dying (or it crashes them): stop retrying.
            row.status = str(JobStatus.FAILED)
            row.finished_at = now
            row.error = f"abandoned after {row.attempts} attempts: the workers running it died"
            row.lease_owner = None
            session.flush()
            continue
        if row.cancel_requested:
            row.status = str(JobStatus.CANCELLED)
            row.finished_at = now
            row.error = "cancelled"
            session.flush()
            continue
        row.status = str(JobStatus.RUNNING)
        row.lease_owner = worker
        row.lease_expires_at = now + timedelta(seconds=lease_s)
        row.attempts += 1
        row.started_at = row.started_at or now
        session.flush()
        return ClaimedJob(job=_info(row), worker=worker, attempt=row.attempts)


def _held(claim: ClaimedJob):
    return sa.and_(
        JobRow.id == claim.job.id,
        JobRow.status == str(JobStatus.RUNNING),
        JobRow.lease_owner == claim.worker,
        JobRow.attempts == claim.attempt,
    )


def renew_lease(session: Session, claim: ClaimedJob, *, lease_s: float) -> LeaseState:
    """Heartbeat: extend the lease while it is still ours; report a cancel request."""
    expires = datetime.now(UTC) + timedelta(seconds=lease_s)
    done = session.execute(
        sa.update(JobRow).where(_held(claim)).values(lease_expires_at=expires)
    ).rowcount
    cancel = session.scalar(sa.select(JobRow.cancel_requested).where(JobRow.id == claim.job.id))
    return LeaseState(held=done == 1, cancel_requested=bool(cancel))


def report_progress(session: Session, claim: ClaimedJob, progress: TuneProgress) -> bool:
    """Store progress; False when the lease is no longer ours (nothing written)."""
    done = session.execute(
        sa.update(JobRow).where(_held(claim)).values(progress=to_json(progress))
    ).rowcount
    return done == 1


def finish_job(
    session: Session,
    claim: ClaimedJob,
    *,
    status: JobStatus,
    outcome: TuneOutcome | None = None,
    error: str | None = None,
) -> bool:
    """Record the end of a job (and its recommendation) if the lease is still ours."""
    if not status.finished:
        raise ValueError(f"finish_job needs a final status, got {status}")
    done = session.execute(
        sa.update(JobRow)
        .where(_held(claim))
        .values(
            status=str(status),
            result=None if outcome is None else to_json(outcome),
            error=error,
            finished_at=datetime.now(UTC),
            lease_expires_at=None,
        )
    ).rowcount
    if done != 1:
        return False
    if status is JobStatus.SUCCEEDED and outcome is not None and outcome.recommendation:
        save_recommendation(session, claim.job, outcome.recommendation)
    return True


def get_result(session: Session, job_id: int, *, project: str | None = None) -> JobResult:
    row = _row(session, job_id, project)
    if row.result is None:
        raise JobNotFinished(_info(row))
    return JobResult(job_id=row.id, outcome=dict(row.result))


_RESULT_BY_ID = sa.select(*_DESCRIPTION, sa.cast(JobRow.result, sa.Text).label("result")).where(
    JobRow.id == sa.bindparam("id")
)


def get_result_text(session: Session, job_id: int, *, project: str | None = None) -> str:
    """A finished job's outcome document as stored: JSON text, not parsed (the largest
    document; a read route sends it as it is). The text of a JSON column on both back-ends:
    PostgreSQL's `json` keeps the text as written, SQLite stores text."""
    row = session.connection().execute(_RESULT_BY_ID, {"id": job_id}).first()
    if row is None or (project is not None and row.project != project):
        raise JobNotFound(job_id)
    if row.result is None or row.result == "null":  # SQL or JSON null
        raise JobNotFinished(_info(row))
    return row.result
