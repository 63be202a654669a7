"""Per-deployment calibrations: stored once fitted, the newest applies to the deployment's
later observations and re-tuning searches (`api.services.calibrate`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from storage.deployments import get_deployment
from storage.listing import count_rows, page_rows
from storage.models import DeploymentCalibrationRow
from storage.service_records import DeploymentCalibration

_CALIBRATIONS = DeploymentCalibrationRow.__table__
_NEWEST = (
    sa.select(_CALIBRATIONS)
    .where(_CALIBRATIONS.c.deployment_id == sa.bindparam("deployment_id"))
    .order_by(_CALIBRATIONS.c.id.desc())
    .limit(1)
)


def _calibration(row: DeploymentCalibrationRow | sa.Row) -> DeploymentCalibration:
    return DeploymentCalibration(
        id=row.id,
        deployment_id=row.deployment_id,
        created_at=row.created_at,
        fitted_on=row.fitted_on,
        checked_on=row.checked_on,
        overhead_s=row.overhead_s,
        prefill_scale=row.prefill_scale,
        decode_scale=row.decode_scale,
        fit=dict(row.fit),
    )


def save_calibration(
    session: Session,
    deployment_id: int,
    *,
    fitted_on: int,
    checked_on: int | None,
    overhead_s: float,
    prefill_scale: float,
    decode_scale: float,
    fit: dict[str, Any],
    project: str | None = None,
) -> DeploymentCalibration:
    get_deployment(session, deployment_id, project=project)
    row = DeploymentCalibrationRow(
        deployment_id=deployment_id,
        created_at=datetime.now(UTC),
        fitted_on=fitted_on,
        checked_on=checked_on,
        overhead_s=overhead_s,
        prefill_scale=prefill_scale,
        decode_scale=decode_scale,
        fit=fit,
    )
    session.add(row)
    session.flush()
    return _calibration(row)


def latest_calibration(session: Session, deployment_id: int) -> DeploymentCalibration | None:
    """The deployment's newest calibration (the one that applies), None when none."""
    row = session.connection().execute(_NEWEST, {"deployment_id": deployment_id}).first()
    return None if row is None else _calibration(row)


def list_calibrations(
    session: Session,
    deployment_id: int,
    *,
    project: str | None = None,
    limit: int = 100,
    offset: int = 0,
    after: int | None = None,
) -> list[DeploymentCalibration]:
    """Newest first."""
    get_deployment(session, deployment_id, project=project)
    rows = page_rows(
        session, _CALIBRATIONS, where={"deployment_id": deployment_id}, limit=limit,
        offset=offset, after=after, newest_first=True,
    )  # fmt: skip
    return [_calibration(r) for r in rows]


def count_calibrations(session: Session, deployment_id: int) -> int:
    return count_rows(session, _CALIBRATIONS, where={"deployment_id": deployment_id})
