"""The service's tables: API keys, the job queue, schedules and recommendations."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, UtcDateTime


class ApiKeyRow(Base):
    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_project_id", "project", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex
    prefix: Mapped[str] = mapped_column(String(16))
    is_admin: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status_lease", "status", "lease_expires_at"),
        # The list's filters, then its order (migration 0100).
        Index("ix_jobs_project_id", "project", "id"),
        Index("ix_jobs_project_status_id", "project", "status", "id"),
        # each kind's list (migration 0170)
        Index("ix_jobs_project_kind_id", "project", "kind", "id"),
        # a plan job's parts (migration 0180)
        Index("ix_jobs_parent_id", "parent_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict] = mapped_column(JSON)
    window: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    progress: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    result: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    schedule_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    trigger_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The job this one is a part of (a plan part's plan job); None for a job of its own.
    parent_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ScheduleRow(Base):
    __tablename__ = "schedules"
    __table_args__ = (
        Index("ix_schedules_due", "paused", "next_run_at"),
        Index("ix_schedules_project_id", "project", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    params: Mapped[dict] = mapped_column(JSON)
    interval_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    cron: Mapped[str | None] = mapped_column(String(200), nullable=True)
    trigger: Mapped[str] = mapped_column(String(16))
    drift_threshold: Mapped[float] = mapped_column(Float)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    next_run_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    last_run_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    last_decision: Mapped[str | None] = mapped_column(String(16), nullable=True)
    last_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_fired: Mapped[int] = mapped_column(Integer, default=0)
    # a schedule over a deployment (None: over a trace stream, `params.stream`)
    deployment_id: Mapped[int | None] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), nullable=True
    )
    error_threshold: Mapped[float | None] = mapped_column(Float, nullable=True)
    baseline_observation_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # `PlanRequest.to_dict()`: the schedule queues plan jobs (None: tuning jobs)
    plan: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class RecommendationRow(Base):
    __tablename__ = "recommendations"
    __table_args__ = (
        Index("ix_recommendations_lookup", "project", "source", "created_at"),
        Index("ix_recommendations_project_created", "project", "created_at", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(100))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    source: Mapped[str] = mapped_column(String(220))
    model: Mapped[str] = mapped_column(String(100))
    gpu: Mapped[str] = mapped_column(String(100))
    num_gpus: Mapped[int] = mapped_column(Integer)
    slo_ttft_ms: Mapped[float] = mapped_column(Float)
    slo_tpot_ms: Mapped[float] = mapped_column(Float)
    attainment: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    recommendation: Mapped[dict] = mapped_column(JSON)
    window: Mapped[dict | None] = mapped_column(JSON, nullable=True)
