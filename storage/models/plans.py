from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, UtcDateTime


class PlanRow(Base):
    """One fleet plan: its request (`PlanRequest.to_dict()`) and its outcome
    (`FleetPlan.to_dict()`), both JSON documents with a schema_version; `job_id`: the plan
    job that made it (None: `servetune plan`)."""

    __tablename__ = "plans"
    __table_args__ = (
        sa.Index("ix_plans_project_id", "project", "id"),
        sa.Index("ix_plans_job_id", "job_id", unique=True),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project: Mapped[str] = mapped_column(sa.String(100))
    trace_id: Mapped[int] = mapped_column(index=True)
    model: Mapped[str] = mapped_column(sa.String(200))
    gpu: Mapped[str] = mapped_column(sa.String(200))
    request: Mapped[dict] = mapped_column(sa.JSON)
    outcome: Mapped[dict] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    job_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=True
    )
