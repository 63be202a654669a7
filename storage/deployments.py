"""Deployments, a project's configs running in production, and the windows observed on
them (`servetune observe --deployment`, POST /v1/deployments/{id}/observations).

A deployment's config is stored as `ServingConfig.to_dict()` (with its schema_version);
an observation's report as `ObservationReport.to_dict()` plus what priced it. Deleting a
deployment deletes its observations. Lists are newest first, `after` a keyset cursor.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.orm import Session

from optimizer.config import ServingConfig
from optimizer.telemetry import ObservedWindow
from storage.keys import check_project_name
from storage.listing import count_rows, page_rows
from storage.models import (
    DeploymentCalibrationRow,
    DeploymentObservationRow,
    DeploymentRow,
    ScheduleRow,
)
from storage.service_records import Deployment, DeploymentObservation

MAX_URL_CHARS = 500
MAX_SELECTOR_CHARS = 1000
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*'
_SELECTOR = re.compile(rf"\{{(?:{_MATCHER}(?:,{_MATCHER})*,?\s*)?\}}")


class DeploymentNotFound(LookupError):
    def __init__(self, deployment_id: int) -> None:
        super().__init__(f"deployment {deployment_id} not found")
        self.deployment_id = deployment_id


class ObservationNotFound(LookupError):
    def __init__(self, deployment_id: int, observation_id: int) -> None:
        super().__init__(f"deployment {deployment_id} has no observation {observation_id}")


class DeploymentError(ValueError):
    """A deployment field that cannot be stored; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_prometheus(url: str | None, selector: str | None) -> None:
    """An http(s) URL with a host, and a `{name="value", ...}` label matcher."""
    if url is not None:
        parts = urlsplit(url)
        printable = url.isprintable() and not any(c.isspace() for c in url)
        if len(url) > MAX_URL_CHARS or not printable or parts.scheme not in ("http", "https") \
                or not parts.hostname:  # fmt: skip
            raise DeploymentError(
                "prometheus_url",
                f"prometheus_url {url[:100]!r}: expected an http:// or https:// URL with a "
                f"host (at most {MAX_URL_CHARS} characters), e.g. http://prometheus:9090",
            )
    if selector is not None and (
        len(selector) > MAX_SELECTOR_CHARS or not _SELECTOR.fullmatch(selector)
    ):
        raise DeploymentError(
            "label_selector",
            f"label_selector {selector[:100]!r}: expected a Prometheus label matcher in "
            'braces, e.g. \'{job="vllm", namespace=~"prod-.*"}\'',
        )


_DEPLOYMENTS = DeploymentRow.__table__
_OBSERVATIONS = DeploymentObservationRow.__table__
_CALIBRATIONS = DeploymentCalibrationRow.__table__
_SCHEDULES = ScheduleRow.__table__
_DEPLOYMENT_BY_ID = sa.select(_DEPLOYMENTS).where(_DEPLOYMENTS.c.id == sa.bindparam("id"))


def _deployment(row: DeploymentRow | sa.Row) -> Deployment:
    return Deployment(
        id=row.id,
        project=row.project,
        name=row.name,
        config=ServingConfig.from_dict(row.config),
        created_at=row.created_at,
        recommendation_id=row.recommendation_id,
        prometheus_url=row.prometheus_url,
        label_selector=row.label_selector,
    )


def create_deployment(
    session: Session,
    *,
    project: str,
    name: str,
    config: ServingConfig,
    recommendation_id: int | None = None,
    prometheus_url: str | None = None,
    label_selector: str | None = None,
) -> Deployment:
    check_project_name(project)
    check_prometheus(prometheus_url, label_selector)
    if not name.strip():
        raise DeploymentError("name", "name: expected 1 to 200 printable characters")
    row = DeploymentRow(
        project=project,
        name=name[:200],
        config=config.to_dict(),
        recommendation_id=recommendation_id,
        prometheus_url=prometheus_url,
        label_selector=label_selector,
        created_at=datetime.now(UTC),
    )
    session.add(row)
    session.flush()
    return _deployment(row)


def get_deployment(
    session: Session, deployment_id: int, *, project: str | None = None
) -> Deployment:
    """`project`: None reads any project's (the CLI on the server's database)."""
    row = session.connection().execute(_DEPLOYMENT_BY_ID, {"id": deployment_id}).first()
    if row is None or (project is not None and row.project != project):
        raise DeploymentNotFound(deployment_id)
    return _deployment(row)


def list_deployments(
    session: Session,
    *,
    project: str | None = None,
    limit: int = 100,
    offset: int = 0,
    after: int | None = None,
) -> list[Deployment]:
    """Newest first; `after`: only deployments older than that id (a keyset cursor)."""
    rows = page_rows(
        session, _DEPLOYMENTS, where={"project": project}, limit=limit, offset=offset,
        after=after, newest_first=True,
    )  # fmt: skip
    return [_deployment(r) for r in rows]


def count_deployments(session: Session, *, project: str | None = None) -> int:
    return count_rows(session, _DEPLOYMENTS, where={"project": project})


def delete_deployment(session: Session, deployment_id: int, *, project: str | None = None) -> None:
    """The deployment, its observations, calibrations and schedules."""
    get_deployment(session, deployment_id, project=project)
    for table in (_OBSERVATIONS, _CALIBRATIONS, _SCHEDULES):
        session.execute(sa.delete(table).where(table.c.deployment_id == deployment_id))
    session.execute(sa.delete(_DEPLOYMENTS).where(_DEPLOYMENTS.c.id == deployment_id))


def _observation(row: DeploymentObservationRow | sa.Row) -> DeploymentObservation:
    report = dict(row.report)
    latency, priced_as = report.pop("latency", ""), report.pop("priced_as", "")
    return DeploymentObservation(
        id=row.id,
        deployment_id=row.deployment_id,
        created_at=row.created_at,
        window_s=row.window_s,
        before_sha256=row.before_sha256,
        after_sha256=row.after_sha256,
        latency=latency,
        priced_as=priced_as,
        request_rate=row.request_rate,
        ttft_p90_observed_s=row.ttft_p90_observed_s,
        ttft_p90_predicted_s=row.ttft_p90_predicted_s,
        itl_p90_observed_s=row.itl_p90_observed_s,
        itl_p90_predicted_s=row.itl_p90_predicted_s,
        report=report,
        calibration_id=row.calibration_id,
    )


def save_observation(
    session: Session,
    deployment_id: int,
    *,
    report: dict[str, Any],
    latency: str,
    priced_as: str,
    before_sha256: str,
    after_sha256: str,
    window: ObservedWindow | None = None,
    calibration_id: int | None = None,
    project: str | None = None,
) -> DeploymentObservation:
    """Store `report` (an `ObservationReport.to_dict()`) for the deployment, with the
    window it was read from (what a calibration refits on) and the calibration that
    priced its prediction."""
    get_deployment(session, deployment_id, project=project)
    ttft, itl = report["ttft"], report["itl"]
    row = DeploymentObservationRow(
        deployment_id=deployment_id,
        created_at=datetime.now(UTC),
        window_s=float(report["window_s"]),
        before_sha256=before_sha256,
        after_sha256=after_sha256,
        report={**report, "latency": latency, "priced_as": priced_as},
        request_rate=float(report["request_rate"]),
        ttft_p90_observed_s=ttft["observed"]["p90"],
        ttft_p90_predicted_s=ttft["predicted"]["p90"],
        itl_p90_observed_s=itl["observed"]["p90"],
        itl_p90_predicted_s=itl["predicted"]["p90"],
        window=None if window is None else window.to_dict(),
        calibration_id=calibration_id,
    )
    session.add(row)
    session.flush()
    return _observation(row)


def list_observations(
    session: Session,
    deployment_id: int,
    *,
    project: str | None = None,
    limit: int = 100,
    offset: int = 0,
    after: int | None = None,
) -> list[DeploymentObservation]:
    """The deployment's observations, newest first (`after`: a keyset cursor)."""
    get_deployment(session, deployment_id, project=project)
    rows = page_rows(
        session, _OBSERVATIONS, where={"deployment_id": deployment_id}, limit=limit,
        offset=offset, after=after, newest_first=True,
    )  # fmt: skip
    return [_observation(r) for r in rows]


def count_observations(session: Session, deployment_id: int) -> int:
    return count_rows(session, _OBSERVATIONS, where={"deployment_id": deployment_id})


_WINDOW_OF = sa.select(_OBSERVATIONS.c.deployment_id, _OBSERVATIONS.c.window).where(
    _OBSERVATIONS.c.id == sa.bindparam("id")
)


def observed_window_of(session: Session, deployment_id: int, observation_id: int) -> ObservedWindow:
    """The window a stored observation was read from. ObservationNotFound when the
    deployment has no such observation; ValueError when it was stored without its window
    (before the deployment loop's migration)."""
    row = session.connection().execute(_WINDOW_OF, {"id": observation_id}).first()
    if row is None or row.deployment_id != deployment_id:
        raise ObservationNotFound(deployment_id, observation_id)
    if row.window is None:
        raise ValueError(
            f"observation {observation_id} was stored without its window's histograms (an "
            "older servetune); observe the deployment again"
        )
    return ObservedWindow.from_dict(row.window)


_OBSERVATION_BY_ID = sa.select(_OBSERVATIONS).where(_OBSERVATIONS.c.id == sa.bindparam("id"))


def get_observation(
    session: Session, deployment_id: int, observation_id: int
) -> DeploymentObservation:
    row = session.connection().execute(_OBSERVATION_BY_ID, {"id": observation_id}).first()
    if row is None or row.deployment_id != deployment_id:
        raise ObservationNotFound(deployment_id, observation_id)
    return _observation(row)
