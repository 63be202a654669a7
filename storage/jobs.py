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

Jobs are of kinds (`JobKind`): each kind's request and progress are stored as that
kind's own documents (`_PARAMS`, `_PROGRESS`) and read back as its types; a finished
job's result lives where its kind keeps it (`finish_job`: a tuning job's `TuneOutcome`
in the row's `result`, with its recommendation; a plan job's `FleetPlan` in `plans`,
linked by `job_id`; a plan part's `PartResult` in the row's `result`).

A job may be a part of another (`parent_id`): a plan job queues its pieces as
`plan_part` jobs (`enqueue_job(..., parent_id=)`), which any worker claims as it claims
any job, and the plan job's own worker may claim only its parts (`claim_job(...,
parent_id=)`) while it waits for them (`job_parts`).

Lookups and lists may name a kind: a job of another kind is then not found, as another
project's is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from optimizer.plan import FleetPlan, PartResult, PlanPart, PlanProgress, PlanRequest
from optimizer.search import TuneOutcome, TuneProgress, TuneRequest
from storage.codec import from_json, to_json
from storage.listing import count_rows, page_rows
from storage.models import JobRow
from storage.plans import save_plan
from storage.recommendations import save_recommendation
from storage.service_records import (
    ClaimedJob,
    JobInfo,
    JobKind,
    JobParams,
    JobProgress,
    JobResult,
    JobStatus,
    WindowSummary,
)

# Each kind's documents: its request and its progress.
_PARAMS: dict[JobKind, type[JobParams]] = {
    JobKind.TUNING: TuneRequest,
    JobKind.PLAN: PlanRequest,
    JobKind.PLAN_PART: PlanPart,
}
_PROGRESS: dict[JobKind, type[JobProgress]] = {
    JobKind.TUNING: TuneProgress,
    JobKind.PLAN: PlanProgress,
    JobKind.PLAN_PART: PlanProgress,
}
# Each kind's answer, as `finish_job` takes it.
_OUTCOMES: dict[JobKind, type] = {
    JobKind.TUNING: TuneOutcome,
    JobKind.PLAN: FleetPlan,
    JobKind.PLAN_PART: PartResult,
}


def kind_of(params: JobParams) -> JobKind:
    """The kind of job a request is for."""
    for kind, cls in _PARAMS.items():
        if isinstance(params, cls):
            return kind
    raise TypeError(f"no job kind takes a {type(params).__name__}")


class JobNotFound(LookupError):
    def __init__(self, job_id: int, kind: JobKind = JobKind.TUNING) -> None:
        super().__init__(f"{kind.label} {job_id} not found")
        self.job_id = job_id


class JobNotFinished(RuntimeError):
    def __init__(self, job: JobInfo) -> None:
        detail = f": {job.error}" if job.error else ""
        super().__init__(f"{job.kind.label} {job.id} has no result (status {job.status}){detail}")
        self.job = job


@dataclass(frozen=True, slots=True)
class LeaseState:
    held: bool  # False: the lease expired and another worker may hold the job now
    cancel_requested: bool


def _info(row: JobRow | sa.Row) -> JobInfo:
    kind = JobKind(row.kind)
    return JobInfo(
        id=row.id,
        project=row.project,
        kind=kind,
        status=JobStatus(row.status),
        params=from_json(_PARAMS[kind], row.params),
        created_at=row.created_at,
        progress=None if row.progress is None else from_json(_PROGRESS[kind], row.progress),
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
    params: JobParams,
    window: WindowSummary | None = None,
    schedule_id: int | None = None,
    trigger_reason: str | None = None,
    kind: JobKind | None = None,
    parent_id: int | None = None,
) -> JobInfo:
    """Queue a job of the kind `params` asks for (`kind_of`; `kind`, when given, must be
    that one), as a part of job `parent_id` when given."""
    asked = kind_of(params)
    if kind is not None and kind is not asked:
        raise ValueError(f"a {kind.label} takes a {_PARAMS[kind].__name__}, not {asked.label}'s")
    row = JobRow(
        project=project,
        kind=str(asked),
        status=str(JobStatus.QUEUED),
        params=to_json(params),
        window=None if window is None else to_json(window),
        created_at=datetime.now(UTC),
        attempts=0,
        cancel_requested=False,
        schedule_id=schedule_id,
        trigger_reason=trigger_reason,
        parent_id=parent_id,
    )
    session.add(row)
    session.flush()
    return _info(row)


# A job's description never needs its result, the largest document (the whole Pareto
# front with launch commands, tens of kilobytes): read only for the result itself.
_DESCRIPTION = tuple(c for c in JobRow.__table__.c if c.name != "result")


def _check(
    row: JobRow | sa.Row | None, job_id: int, project: str | None, kind: JobKind | None
) -> None:
    """Not found: no such job, another project's, or (`kind` given) another kind's."""
    if (
        row is None
        or (project is not None and row.project != project)
        or (kind is not None and row.kind != kind)
    ):
        raise JobNotFound(job_id, kind or JobKind.TUNING)


def _row(session: Session, job_id: int, project: str | None, kind: JobKind | None = None) -> JobRow:
    row = session.get(JobRow, job_id)
    _check(row, job_id, project, kind)
    assert row is not None
    return row


_JOB_BY_ID = sa.select(*_DESCRIPTION).where(JobRow.id == sa.bindparam("id"))


def get_job(
    session: Session, job_id: int, *, project: str | None = None, kind: JobKind | None = None
) -> JobInfo:
    row = session.connection().execute(_JOB_BY_ID, {"id": job_id}).first()
    _check(row, job_id, project, kind)
    return _info(row)


def list_jobs(
    session: Session,
    *,
    project: str | None = None,
    status: JobStatus | None = None,
    kind: JobKind | None = None,
    limit: int = 100,
    offset: int = 0,
    after: int | None = None,
) -> list[JobInfo]:
    """Newest first (of one kind when `kind` is given); `after`: only jobs with a smaller
    id (a keyset cursor)."""
    rows = page_rows(
        session, _JOBS, where=_where(project, status, kind), limit=limit, offset=offset,
        after=after, newest_first=True, columns=_DESCRIPTION,
    )  # fmt: skip
    return [_info(r) for r in rows]


def count_jobs(
    session: Session,
    *,
    project: str | None = None,
    status: JobStatus | None = None,
    kind: JobKind | None = None,
) -> int:
    return count_rows(session, _JOBS, where=_where(project, status, kind))


_JOBS = JobRow.__table__


def _where(
    project: str | None, status: JobStatus | None, kind: JobKind | None
) -> dict[str, object]:
    return {
        "project": project,
        "status": None if status is None else str(status),
        "kind": None if kind is None else str(kind),
    }


def count_by_status(session: Session) -> dict[JobStatus, int]:
    rows = session.execute(sa.select(JobRow.status, sa.func.count()).group_by(JobRow.status))
    counts = dict.fromkeys(JobStatus, 0)
    for status, n in rows:
        counts[JobStatus(status)] = int(n)
    return counts


def request_cancel(
    session: Session, job_id: int, *, project: str | None = None, kind: JobKind | None = None
) -> JobInfo:
    """Cancel a job: a queued job at once, a running one when its worker next polls."""
    row = _row(session, job_id, project, kind)
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
    parent_id: int | None = None,
) -> ClaimedJob | None:
    """Take the oldest runnable job (queued, or running with an expired lease); only the
    parts of job `parent_id` when given."""
    now = now or datetime.now(UTC)
    runnable = sa.or_(
        JobRow.status == str(JobStatus.QUEUED),
        sa.and_(JobRow.status == str(JobStatus.RUNNING), JobRow.lease_expires_at < now),
    )
    if parent_id is not None:
        runnable = sa.and_(JobRow.parent_id == parent_id, runnable)
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


def report_progress(session: Session, claim: ClaimedJob, progress: JobProgress) -> bool:
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
    outcome: TuneOutcome | FleetPlan | PartResult | None = None,
    error: str | None = None,
) -> bool:
    """Record the end of a job if the lease is still ours, with its result where its kind
    keeps it: a tuning job's outcome in the row (a cancelled job's partial one too) and
    its recommendation; a succeeded plan job's plan in `plans`, linked to the job (a plan
    is whole or nothing: a cancelled or failed plan job stores none); a succeeded plan
    part's result in the row."""
    if not status.finished:
        raise ValueError(f"finish_job needs a final status, got {status}")
    expected = _OUTCOMES[claim.job.kind]
    if outcome is not None and not isinstance(outcome, expected):
        raise TypeError(f"a {claim.job.kind.label}'s result is a {expected.__name__}")
    tuned = outcome if isinstance(outcome, TuneOutcome) else None
    part = outcome if isinstance(outcome, PartResult) else None
    stored = tuned or (part if status is JobStatus.SUCCEEDED else None)
    done = session.execute(
        sa.update(JobRow)
        .where(_held(claim))
        .values(
            status=str(status),
            result=None if stored is None else to_json(stored),
            error=error,
            finished_at=datetime.now(UTC),
            lease_expires_at=None,
        )
    ).rowcount
    if done != 1:
        return False
    if status is JobStatus.SUCCEEDED and tuned is not None and tuned.recommendation:
        save_recommendation(session, claim.job, tuned.recommendation)
    if status is JobStatus.SUCCEEDED and isinstance(outcome, FleetPlan):
        save_plan(session, outcome, project=claim.job.project, job_id=claim.job.id)
    return True


@dataclass(frozen=True, slots=True)
class JobPart:
    """A part of a job (a plan part of a plan job) as its parent waits on it."""

    id: int
    status: JobStatus
    params: PlanPart
    result: PartResult | None  # once it succeeded
    error: str | None
    worker: str | None  # the worker that holds or last held its lease (None: not claimed)
    attempts: int


def job_parts(session: Session, parent_id: int) -> list[JobPart]:
    """The parts of job `parent_id`, in the order they were queued."""
    rows = session.scalars(
        sa.select(JobRow).where(JobRow.parent_id == parent_id).order_by(JobRow.id)
    )
    out = []
    for row in rows:
        if row.kind != JobKind.PLAN_PART:
            raise ValueError(f"job {row.id}, a part of job {parent_id}, is a {row.kind} job")
        status = JobStatus(row.status)
        result = None
        if status is JobStatus.SUCCEEDED and row.result is not None:
            result = from_json(PartResult, row.result)
        out.append(
            JobPart(
                id=row.id,
                status=status,
                params=from_json(PlanPart, row.params),
                result=result,
                error=row.error,
                worker=row.lease_owner,
                attempts=row.attempts,
            )
        )
    return out


def cancel_parts(session: Session, parent_id: int) -> int:
    """Cancel the unfinished parts of job `parent_id` (`request_cancel` on each); how many."""
    ids = session.scalars(
        sa.select(JobRow.id).where(
            JobRow.parent_id == parent_id,
            JobRow.status.in_([str(JobStatus.QUEUED), str(JobStatus.RUNNING)]),
        )
    ).all()
    for job_id in ids:
        request_cancel(session, job_id)
    return len(ids)


def get_result(session: Session, job_id: int, *, project: str | None = None) -> JobResult:
    """A tuning job's stored outcome."""
    row = _row(session, job_id, project, JobKind.TUNING)
    if row.result is None:
        raise JobNotFinished(_info(row))
    return JobResult(job_id=row.id, outcome=dict(row.result))


_RESULT_BY_ID = sa.select(*_DESCRIPTION, sa.cast(JobRow.result, sa.Text).label("result")).where(
    JobRow.id == sa.bindparam("id")
)


def get_result_text(session: Session, job_id: int, *, project: str | None = None) -> str:
    """A finished job's outcome document as stored: JSON text, not parsed (the largest
    document; a read route sends it as it is). The text of a JSON column on both back-ends:
    PostgreSQL's `json` keeps the text as written, SQLite stores text. Tuning jobs only."""
    row = session.connection().execute(_RESULT_BY_ID, {"id": job_id}).first()
    _check(row, job_id, project, JobKind.TUNING)
    if row.result is None or row.result == "null":  # SQL or JSON null
        raise JobNotFinished(_info(row))
    return row.result
