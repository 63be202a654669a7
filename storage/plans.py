"""Fleet plans: save one, read one or a project's newest (ORM rows stay here). The request
and the outcome are stored as their JSON documents (`PlanRequest.to_dict()`,
`FleetPlan.to_dict()`, each with its schema_version) and read back as the core's types.
A plan made by a plan job names it (`job_id`): the job's result."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from optimizer.plan import FleetPlan
from storage.models import PlanRow
from storage.traces import DEFAULT_PROJECT


class PlanNotFound(LookupError):
    def __init__(self, plan_id: int) -> None:
        super().__init__(f"plan {plan_id} not found")
        self.plan_id = plan_id


@dataclass(frozen=True, slots=True)
class PlanInfo:
    id: int
    project: str
    trace_id: int
    created_at: datetime
    plan: FleetPlan
    job_id: int | None = None  # the plan job that made it (None: `servetune plan`)


def _info(row: PlanRow) -> PlanInfo:
    return PlanInfo(
        row.id,
        row.project,
        row.trace_id,
        row.created_at,
        FleetPlan.from_dict(row.outcome),
        row.job_id,
    )


def save_plan(
    session: Session,
    plan: FleetPlan,
    *,
    project: str = DEFAULT_PROJECT,
    job_id: int | None = None,
) -> PlanInfo:
    """Store `plan` (its request must name its stored trace), made by job `job_id` when
    given."""
    request = plan.request
    if request.trace_id is None:
        raise ValueError("a stored plan names its stored trace: request.trace_id is None")
    row = PlanRow(
        project=project,
        trace_id=request.trace_id,
        model=request.model,
        gpu=request.gpu,
        request=request.to_dict(),
        outcome=plan.to_dict(),
        created_at=datetime.now(UTC),
        job_id=job_id,
    )
    session.add(row)
    session.flush()
    return _info(row)


def get_plan(session: Session, plan_id: int, *, project: str | None = None) -> PlanInfo:
    """One stored plan (another project's is not found)."""
    row = session.get(PlanRow, plan_id)
    if row is None or (project is not None and row.project != project):
        raise PlanNotFound(plan_id)
    return _info(row)


def list_plans(
    session: Session,
    *,
    project: str = DEFAULT_PROJECT,
    trace_id: int | None = None,
    limit: int = 50,
) -> list[PlanInfo]:
    """A project's plans, newest first (of one trace when `trace_id` is given)."""
    query = sa.select(PlanRow).where(PlanRow.project == project)
    if trace_id is not None:
        query = query.where(PlanRow.trace_id == trace_id)
    rows = session.scalars(query.order_by(PlanRow.id.desc()).limit(limit))
    return [_info(r) for r in rows]


@dataclass(frozen=True, slots=True)
class StoredPlanText:
    """A plan job's stored plan as its JSON text (`FleetPlan.to_dict()`, not parsed: a
    read route sends it as it is)."""

    id: int
    job_id: int
    outcome: str


_TEXT_BY_JOB = sa.select(
    PlanRow.id, PlanRow.project, sa.cast(PlanRow.outcome, sa.Text).label("outcome")
).where(PlanRow.job_id == sa.bindparam("job_id"))


def plan_text_of_job(
    session: Session, job_id: int, *, project: str | None = None
) -> StoredPlanText | None:
    """The plan job `job_id` stored (None: none, or another project's)."""
    row = session.connection().execute(_TEXT_BY_JOB, {"job_id": job_id}).first()
    if row is None or (project is not None and row.project != project):
        return None
    return StoredPlanText(row.id, job_id, row.outcome)
