"""Tuning runs: queries returning `TuningRunInfo` (ORM rows stay here)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from storage.models.tuning import TuningRunRow


class TuningStatus(StrEnum):
    RUNNING = "running"
    DONE = "done"
    STOPPED = "stopped"


class TuningRunNotFound(LookupError):
    def __init__(self, study_name: str) -> None:
        super().__init__(f"no tuning run named {study_name!r}")
        self.study_name = study_name


@dataclass(frozen=True, slots=True)
class TuningRunInfo:
    id: int
    study_name: str
    trace_id: int | None  # None: a closed-loop benchmark (its parameters are in the request)
    model: str
    status: TuningStatus
    request: dict[str, Any]  # TuneRequest.to_dict()
    search_space: dict[str, Any]  # SearchSpace.to_dict()
    latency_label: str
    outcome: dict[str, Any] | None  # TuneOutcome.to_dict()
    created_at: datetime
    updated_at: datetime


def _info(row: TuningRunRow) -> TuningRunInfo:
    return TuningRunInfo(
        row.id,
        row.study_name,
        row.trace_id,
        row.model,
        TuningStatus(row.status),
        dict(row.request),
        dict(row.search_space),
        row.latency_label,
        dict(row.outcome) if row.outcome is not None else None,
        row.created_at,
        row.updated_at,
    )


def start_tuning_run(
    session: Session,
    *,
    study_name: str,
    trace_id: int | None,
    model: str,
    request: dict[str, Any],
    search_space: dict[str, Any],
    latency_label: str,
) -> TuningRunInfo:
    """Record a run, or return the existing one with that study name (a resumed job).
    A resumed run must have been asked the same thing."""
    row = session.scalar(sa.select(TuningRunRow).where(TuningRunRow.study_name == study_name))
    now = datetime.now(UTC)
    if row is not None:
        if dict(row.request) != request:
            raise ValueError(
                f"study {study_name!r} already exists with a different request; "
                "pick another study name"
            )
        row.status = TuningStatus.RUNNING.value
        row.updated_at = now
        session.flush()
        return _info(row)
    row = TuningRunRow(
        study_name=study_name,
        trace_id=trace_id,
        model=model,
        status=TuningStatus.RUNNING.value,
        request=request,
        search_space=search_space,
        latency_label=latency_label,
        outcome=None,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    session.flush()
    return _info(row)


def finish_tuning_run(
    session: Session, study_name: str, outcome: dict[str, Any] | None, status: TuningStatus
) -> TuningRunInfo:
    row = session.scalar(sa.select(TuningRunRow).where(TuningRunRow.study_name == study_name))
    if row is None:
        raise TuningRunNotFound(study_name)
    row.outcome = outcome
    row.status = status.value
    row.updated_at = datetime.now(UTC)
    session.flush()
    return _info(row)


def get_tuning_run(session: Session, study_name: str) -> TuningRunInfo:
    row = session.scalar(sa.select(TuningRunRow).where(TuningRunRow.study_name == study_name))
    if row is None:
        raise TuningRunNotFound(study_name)
    return _info(row)


def finished_runs(
    session: Session, *, trace_id: int, model: str, limit: int = 50
) -> list[TuningRunInfo]:
    """The finished runs (done or stopped, with an outcome) on `trace_id` for `model`,
    newest first."""
    query = (
        sa.select(TuningRunRow)
        .where(
            TuningRunRow.trace_id == trace_id,
            TuningRunRow.model == model,
            TuningRunRow.outcome.is_not(None),
            TuningRunRow.status != TuningStatus.RUNNING.value,
        )
        .order_by(TuningRunRow.updated_at.desc(), TuningRunRow.id.desc())
        .limit(limit)
    )
    return [_info(r) for r in session.scalars(query)]
