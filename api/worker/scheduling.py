"""Firing due schedules: each due time is claimed, decided and advanced in one transaction.

A schedule fires a tuning job with its `params`, or, with a `plan`, a plan job: that
request pinned to the window's newest trace (`fired_params`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from api.services.stream_windows import EmptyWindow, drift, resolve_window
from api.worker.deployment_drift import observe_and_decide
from storage.db import session_scope
from storage.jobs import enqueue_job, get_job
from storage.recommendations import DeploymentFilter, RecommendationNotFound, latest_recommendation
from storage.schedules import advance_due, claim_due_schedule, record_run
from storage.service_records import JobParams, ScheduleInfo, ScheduleTrigger, WindowSummary

log = logging.getLogger("servetune.schedules")


@dataclass(frozen=True, slots=True)
class Decision:
    fire: bool
    reason: str
    window: WindowSummary | None = None


def _deployment(schedule: ScheduleInfo) -> DeploymentFilter:
    p = schedule.params
    return DeploymentFilter(
        source=p.source,
        model=p.model,
        gpu=",".join(p.gpu_types),
        gpu_budget=p.gpu_budget,
        slo_ttft_ms=p.slo_ttft_ms,
        slo_tpot_ms=p.slo_tpot_ms,
    )


def decide(session: Session, schedule: ScheduleInfo, now: datetime) -> Decision:
    """Whether this due time re-tunes, and why (recorded on the schedule and the job)."""
    if schedule.last_job_id is not None:
        previous = get_job(session, schedule.last_job_id)
        if not previous.status.finished:
            return Decision(False, f"previous job {previous.id} is still {previous.status}")
    try:
        window = resolve_window(session, project=schedule.project, params=schedule.params, now=now)
    except EmptyWindow as exc:
        return Decision(False, str(exc))
    if window is None:  # create_schedule refuses anything but a stream
        return Decision(False, "a schedule re-tunes a stream; this one names no stream")
    what = f"{len(window.trace_ids)} upload(s), {window.num_requests:,} requests"
    if schedule.trigger is ScheduleTrigger.ALWAYS:
        return Decision(True, f"due time reached; window: {what}", window)
    try:
        current = latest_recommendation(
            session, project=schedule.project, where=_deployment(schedule)
        )
    except RecommendationNotFound:
        return Decision(True, f"drift trigger: no recommendation yet; window: {what}", window)
    if current.window is None:
        return Decision(True, "drift trigger: the current recommendation has no window", window)
    changes = drift(current.window, window)
    over = [c for c in changes if c.relative > schedule.drift_threshold]
    if not over:
        top = changes[0]
        return Decision(
            False,
            f"no drift: largest change {top.describe()} is within "
            f"{schedule.drift_threshold:.0%} of recommendation {current.id}'s window",
        )
    shifted = "; ".join(c.describe() for c in over)
    return Decision(
        True,
        f"drift beyond {schedule.drift_threshold:.0%} since recommendation {current.id}: {shifted}",
        window,
    )


def fired_params(schedule: ScheduleInfo, trace_ids: tuple[int, ...]) -> JobParams:
    """What a firing queues: the schedule's tuning request, or its plan on the newest of
    the window's traces."""
    if schedule.plan is None:
        return schedule.params
    return replace(schedule.plan, trace_id=trace_ids[-1])


def fire_due_schedules(engine: Engine, *, now: datetime | None = None, limit: int = 20) -> int:
    """Handle due schedules one transaction each; return how many jobs were enqueued."""
    fired = 0
    for _ in range(limit):
        moment = now or datetime.now(UTC)
        with session_scope(engine) as session:
            schedule = claim_due_schedule(session, now=moment)
            if schedule is None:
                return fired
            if schedule.deployment_id is not None:  # observed outside this transaction
                advance_due(session, schedule, now=moment)
            else:
                decision = decide(session, schedule, moment)
                job_id = None
                if decision.fire:
                    assert decision.window is not None
                    job = enqueue_job(
                        session,
                        project=schedule.project,
                        params=fired_params(schedule, decision.window.trace_ids),
                        window=decision.window,
                        schedule_id=schedule.id,
                        trigger_reason=decision.reason,
                    )
                    job_id = job.id
                    fired += 1
                record_run(
                    session,
                    schedule,
                    now=moment,
                    fired=decision.fire,
                    reason=decision.reason,
                    job_id=job_id,
                )
        if schedule.deployment_id is not None:
            fired += _fire_deployment(engine, schedule, moment)
            continue
        log.info(
            "schedule %s: %s (%s)", schedule.id, "fired" if job_id else "skipped", decision.reason
        )
    return fired


def _fire_deployment(engine: Engine, schedule: ScheduleInfo, moment: datetime) -> int:
    """A deployment schedule's due time, already advanced (api.worker.deployment_drift)."""
    outcome = observe_and_decide(engine, schedule, moment)
    with session_scope(engine) as session:
        record_run(
            session, schedule, now=moment, fired=outcome.fired, reason=outcome.reason,
            job_id=outcome.job_id, baseline_observation_id=outcome.baseline_observation_id,
            advance=False,
        )  # fmt: skip
    log.info("schedule %s: %s (%s)", schedule.id, "fired" if outcome.fired else "skipped",
             outcome.reason)  # fmt: skip
    return int(outcome.fired)
