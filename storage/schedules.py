"""Re-tuning schedules: durable, and each due time fires exactly once.

`claim_due_schedule` locks one due row (`FOR UPDATE SKIP LOCKED` on
PostgreSQL, the single-writer transaction on SQLite); the caller decides,
enqueues the job and calls `record_run`, which advances `next_run_at`, all in
that same transaction. A second worker either skips the locked row or, once
the first commits, sees the advanced `next_run_at`: a due time fires once.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from croniter import CroniterBadDateError, CroniterError, croniter
from sqlalchemy.orm import Session

from optimizer.config import ServingConfig
from optimizer.plan import PlanError, PlanRequest
from optimizer.search import TuneRequest
from storage.codec import from_json, to_json
from storage.keys import check_project_name
from storage.listing import count_rows, page_rows
from storage.models import ScheduleRow
from storage.service_records import ScheduleInfo, ScheduleTrigger

MIN_INTERVAL_S = 1.0


class ScheduleNotFound(LookupError):
    def __init__(self, schedule_id: int) -> None:
        super().__init__(f"schedule {schedule_id} not found")
        self.schedule_id = schedule_id


class ScheduleFieldError(ValueError):
    """A schedule that cannot be used; `field` names the field at fault (dotted)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class TimingError(ScheduleFieldError):
    """A schedule's timing that cannot be used."""


CRON_FIELDS = (
    "minute 0-59, hour 0-23, day of month 1-31, month 1-12 or jan-dec, "
    "weekday 0-6 or sun-sat; e.g. '*/15 * * * *'"
)


def check_timing(interval_s: float | None, cron: str | None) -> None:
    """Exactly one of an interval (seconds) or a five-field cron expression that fires."""
    if (interval_s is None) == (cron is None):
        raise ValueError("give exactly one of interval_s or cron")
    if interval_s is not None and (not math.isfinite(interval_s) or interval_s < MIN_INTERVAL_S):
        raise TimingError(
            "interval_s", f"interval_s: expected at least {MIN_INTERVAL_S} s, got {interval_s}"
        )
    if cron is not None:
        _check_cron(cron)


def _check_cron(cron: str) -> None:
    """Our own words for every way croniter refuses an expression (its messages, such as
    "failed to find next date", never reach users)."""
    if len(cron.split()) != 5:
        raise TimingError(
            "cron", f"cron {cron!r}: expected five fields (minute hour day month weekday), "
            "e.g. '*/15 * * * *'"
        )  # fmt: skip
    try:
        croniter(cron, datetime.now(UTC)).get_next(datetime)
    except CroniterBadDateError:
        raise TimingError(
            "cron", f"cron {cron!r} never fires: no calendar date matches its day of month, "
            "month and weekday together (e.g. '0 0 31 2 *' asks for February 31st); use days "
            "that every chosen month has, or 'L' for the last day of the month"
        ) from None  # fmt: skip
    except (CroniterError, ValueError, TypeError, KeyError, IndexError):
        raise TimingError(
            "cron", f"cron {cron!r}: a field is malformed or out of range; expected {CRON_FIELDS}"
        ) from None


def next_due(
    *, interval_s: float | None, cron: str | None, after: datetime, now: datetime
) -> datetime:
    """The first due time after `after` that is also after `now` (missed runs fire once)."""
    if cron is not None:
        return croniter(cron, max(after, now)).get_next(datetime).astimezone(UTC)
    assert interval_s is not None
    step = timedelta(seconds=interval_s)
    due = after + step
    if due <= now:
        due += step * math.ceil((now - due) / step + 1e-9)
    return due


def _info(row: ScheduleRow | sa.Row) -> ScheduleInfo:
    return ScheduleInfo(
        id=row.id,
        project=row.project,
        name=row.name,
        params=from_json(TuneRequest, row.params),
        interval_s=row.interval_s,
        cron=row.cron,
        trigger=ScheduleTrigger(row.trigger),
        drift_threshold=row.drift_threshold,
        paused=row.paused,
        next_run_at=row.next_run_at,
        created_at=row.created_at,
        last_run_at=row.last_run_at,
        last_decision=row.last_decision,
        last_reason=row.last_reason,
        last_job_id=row.last_job_id,
        num_fired=row.num_fired,
        deployment_id=row.deployment_id,
        error_threshold=row.error_threshold,
        baseline_observation_id=row.baseline_observation_id,
        plan=None if row.plan is None else PlanRequest.from_dict(row.plan),
    )


# The figures a planning schedule's `params` and `plan` both hold: one value each.
_SHARED = (
    ("model", "model"),
    ("slo_ttft_ms", "slo_ttft_ms"),
    ("slo_tpot_ms", "slo_tpot_ms"),
    ("attainment", "attainment"),
    ("gpu_budget", "gpu_budget"),
)


def check_plan(params: TuneRequest, plan: PlanRequest) -> None:
    """A schedule's plan: its trace is the window's (no trace_id or stream of its own),
    and what `params` also says it says alike (the model, the SLOs, the attainment, the
    GPU budget; its GPU among `params.gpu_types`)."""
    for name in ("trace_id", "stream"):
        if getattr(plan, name) is not None:
            raise ScheduleFieldError(
                f"plan.{name}",
                f"plan.{name}: a schedule's plan runs on the window it fires on "
                f"({params.source}); expected no {name}",
            )
    for ours, theirs in _SHARED:
        a, b = getattr(plan, ours), getattr(params, theirs)
        if a != b:
            raise ScheduleFieldError(
                f"plan.{ours}",
                f"plan.{ours} {a!r} differs from params.{theirs} {b!r}: a schedule has one; "
                "expected the same value in both",
            )
    if plan.gpu not in params.gpu_types:
        raise ScheduleFieldError(
            "plan.gpu",
            f"plan.gpu {plan.gpu!r} is not among params.gpu_types {list(params.gpu_types)}",
        )


def deployed_plan(plan: PlanRequest, config: ServingConfig) -> PlanRequest:
    """A deployment schedule's plan: its unit, else the deployed fleet's unit
    (`PlanError` when that unit does not fit the plan: another model or GPU)."""
    from optimizer.plan.unit import fleet_unit

    return plan if plan.unit is not None else replace(plan, unit=fleet_unit(config))


def create_schedule(
    session: Session,
    *,
    project: str,
    name: str,
    params: TuneRequest,
    interval_s: float | None = None,
    cron: str | None = None,
    trigger: ScheduleTrigger = ScheduleTrigger.ALWAYS,
    drift_threshold: float = 0.2,
    error_threshold: float | None = None,
    start_at: datetime | None = None,
    plan: PlanRequest | None = None,
) -> ScheduleInfo:
    """A schedule over a trace stream (`params.stream`), or over a deployment
    (`params.deployment_id` with no trace or stream: drift trigger only, its windows read
    from the deployment's Prometheus server; `error_threshold` re-tunes on prediction
    error too). With `plan` it queues plan jobs instead of tuning jobs (`check_plan`): a
    deployment's, or a stream's at every due time (a stream's drift is measured against
    its newest recommendation, which plans do not make)."""
    check_project_name(project)
    check_timing(interval_s, cron)
    over_deployment = params.source == f"deployment:{params.deployment_id}"
    if params.stream is None and not over_deployment:
        raise ValueError(
            "a schedule re-tunes a trace stream (params.stream) or a deployment "
            "(params.deployment_id with no trace_id or workload)"
        )
    if not (0 < drift_threshold <= 10):
        raise ValueError(
            f"drift_threshold: expected a relative change in (0, 10], got {drift_threshold}"
        )
    if plan is not None:
        check_plan(params, plan)
    if over_deployment:
        from storage.deployments import get_deployment

        deployed = get_deployment(session, params.deployment_id, project=project)
        if deployed.prometheus_url is None:
            raise ValueError(
                f"deployment {deployed.id} has no Prometheus URL and selector: a schedule "
                "reads its windows from there"
            )
        if trigger is not ScheduleTrigger.DRIFT:
            raise ValueError("a deployment schedule re-tunes on drift: trigger must be drift")
        if plan is not None and plan.model != deployed.config.model:
            raise ScheduleFieldError(
                "plan.model",
                f"plan.model {plan.model!r}: deployment {deployed.id} serves "
                f"{deployed.config.model!r}",
            )
        if plan is not None:
            try:
                deployed_plan(plan, deployed.config)
            except (PlanError, ValueError) as exc:
                raise ScheduleFieldError(
                    "plan.unit", f"plan.unit: none given, and the deployed unit: {exc}"
                ) from None
    elif error_threshold is not None:
        raise ValueError("error_threshold: only a schedule over a deployment has predictions")
    elif plan is not None and trigger is ScheduleTrigger.DRIFT:
        raise ScheduleFieldError(
            "trigger",
            "trigger drift: a stream schedule's drift is measured against its newest "
            "recommendation, which a plan does not make; expected trigger always for a "
            "stream's plan (or a schedule over a deployment, whose drift is its own)",
        )
    if error_threshold is not None and not (0 < error_threshold <= 10):
        raise ValueError(
            f"error_threshold: expected a relative error in (0, 10], got {error_threshold}"
        )
    now = datetime.now(UTC)
    first = start_at or next_due(interval_s=interval_s, cron=cron, after=now, now=now)
    row = ScheduleRow(
        project=project,
        name=name[:200],
        params=to_json(params),
        interval_s=interval_s,
        cron=cron,
        trigger=str(trigger),
        drift_threshold=drift_threshold,
        paused=False,
        next_run_at=first,
        created_at=now,
        num_fired=0,
        deployment_id=params.deployment_id if over_deployment else None,
        error_threshold=error_threshold,
    )
    if plan is not None:  # left out otherwise: SQL NULL, not a JSON null
        row.plan = plan.to_dict()
    session.add(row)
    session.flush()
    return _info(row)


def _row(session: Session, schedule_id: int, project: str | None) -> ScheduleRow:
    row = session.get(ScheduleRow, schedule_id)
    if row is None or (project is not None and row.project != project):
        raise ScheduleNotFound(schedule_id)
    return row


_SCHEDULES = ScheduleRow.__table__
_SCHEDULE_BY_ID = sa.select(_SCHEDULES).where(_SCHEDULES.c.id == sa.bindparam("id"))


def get_schedule(session: Session, schedule_id: int, *, project: str | None = None) -> ScheduleInfo:
    row = session.connection().execute(_SCHEDULE_BY_ID, {"id": schedule_id}).first()
    if row is None or (project is not None and row.project != project):
        raise ScheduleNotFound(schedule_id)
    return _info(row)


def list_schedules(
    session: Session,
    *,
    project: str | None = None,
    limit: int = 100,
    offset: int = 0,
    after: int | None = None,
) -> list[ScheduleInfo]:
    """Oldest first; `after`: only schedules with a larger id (a keyset cursor)."""
    where = {"project": project}
    rows = page_rows(session, _SCHEDULES, where=where, limit=limit, offset=offset, after=after)
    return [_info(r) for r in rows]


def count_schedules(session: Session, *, project: str | None = None) -> int:
    return count_rows(session, _SCHEDULES, where={"project": project})


def set_paused(
    session: Session, schedule_id: int, *, paused: bool, project: str | None = None
) -> ScheduleInfo:
    """Pause, or resume (the next due time is then counted from now)."""
    row = _row(session, schedule_id, project)
    if row.paused != paused:
        row.paused = paused
        if not paused:
            now = datetime.now(UTC)
            row.next_run_at = next_due(interval_s=row.interval_s, cron=row.cron, after=now, now=now)
        session.flush()
    return _info(row)


def delete_schedule(session: Session, schedule_id: int, *, project: str | None = None) -> None:
    session.delete(_row(session, schedule_id, project))
    session.flush()


def claim_due_schedule(session: Session, *, now: datetime) -> ScheduleInfo | None:
    """Lock one due, unpaused schedule for this transaction (None when none is due)."""
    row = session.scalar(
        sa.select(ScheduleRow)
        .where(ScheduleRow.paused.is_(False), ScheduleRow.next_run_at <= now)
        .order_by(ScheduleRow.next_run_at, ScheduleRow.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    return None if row is None else _info(row)


def record_run(
    session: Session,
    schedule: ScheduleInfo,
    *,
    now: datetime,
    fired: bool,
    reason: str,
    job_id: int | None,
    baseline_observation_id: int | None = None,
    advance: bool = True,
) -> ScheduleInfo:
    """Record a due time's decision and advance `next_run_at` (same transaction as the
    claim; `advance=False` when the claim already advanced it); a deployment schedule's new
    `baseline_observation_id` when given."""
    row = _row(session, schedule.id, None)
    if advance:
        _advance(row, now)
    if baseline_observation_id is not None:
        row.baseline_observation_id = baseline_observation_id
    row.last_run_at = now
    row.last_decision = "fired" if fired else "skipped"
    row.last_reason = reason
    if fired:
        row.last_job_id = job_id
        row.num_fired += 1
    session.flush()
    return _info(row)


def advance_due(session: Session, schedule: ScheduleInfo, *, now: datetime) -> None:
    """Move a claimed schedule's `next_run_at` past `now` before its slow part runs outside
    the claim's transaction (a deployment's observation): the due time is taken once."""
    _advance(_row(session, schedule.id, None), now)
    session.flush()


def _advance(row: ScheduleRow, now: datetime) -> None:
    due = row.next_run_at or now
    row.next_run_at = next_due(interval_s=row.interval_s, cron=row.cron, after=due, now=now)


def deployment_schedules(session: Session, deployment_id: int) -> list[ScheduleInfo]:
    """The schedules over a deployment, oldest first."""
    rows = page_rows(session, _SCHEDULES, where={"deployment_id": deployment_id}, limit=1000)
    return [_info(r) for r in rows]
