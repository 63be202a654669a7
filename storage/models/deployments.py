"""Deployments (a config running in production) and the windows observed on them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, UtcDateTime


class DeploymentRow(Base):
    __tablename__ = "deployments"
    __table_args__ = (Index("ix_deployments_project_id", "project", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict] = mapped_column(JSON)  # ServingConfig.to_dict(), schema_version
    recommendation_id: Mapped[int | None] = mapped_column(
        ForeignKey("recommendations.id", ondelete="SET NULL"), nullable=True
    )
    prometheus_url: Mapped[str | None] = mapped_column(String(500), nullable=True)
    label_selector: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())


class DeploymentObservationRow(Base):
    __tablename__ = "deployment_observations"
    __table_args__ = (Index("ix_deployment_observations_deployment_id", "deployment_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    window_s: Mapped[float] = mapped_column(Float)
    before_sha256: Mapped[str] = mapped_column(String(64))
    after_sha256: Mapped[str] = mapped_column(String(64))
    # ObservationReport.to_dict() with "latency" and "priced_as"
    report: Mapped[dict] = mapped_column(JSON)
    request_rate: Mapped[float] = mapped_column(Float)
    ttft_p90_observed_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_p90_predicted_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    itl_p90_observed_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    itl_p90_predicted_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # ObservedWindow.to_dict(): the histograms a calibration refits on (None before 0120)
    window: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    calibration_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # what priced it


class DeploymentCalibrationRow(Base):
    """A per-deployment correction fitted on one observation, checked on a later one."""

    __tablename__ = "deployment_calibrations"
    __table_args__ = (Index("ix_deployment_calibrations_deployment_id", "deployment_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    fitted_on: Mapped[int] = mapped_column(Integer)
    checked_on: Mapped[int | None] = mapped_column(Integer, nullable=True)
    overhead_s: Mapped[float] = mapped_column(Float)
    prefill_scale: Mapped[float] = mapped_column(Float)
    decode_scale: Mapped[float] = mapped_column(Float)
    fit: Mapped[dict] = mapped_column(JSON)  # WindowFit.to_dict()
