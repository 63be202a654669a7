from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, UtcDateTime


class TuningRunRow(Base):
    """One tuning study: what produced it (request, trace, latency model, space) and its outcome.
    Optuna's own tables (studies, trials, ...) hold the trials under the same `study_name`."""

    __tablename__ = "tuning_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    # None: a closed-loop benchmark, tuned from the parameters in `request`
    trace_id: Mapped[int | None] = mapped_column(index=True, nullable=True)
    model: Mapped[str] = mapped_column(sa.String(200))
    status: Mapped[str] = mapped_column(sa.String(16))
    request: Mapped[dict] = mapped_column(sa.JSON)
    search_space: Mapped[dict] = mapped_column(sa.JSON)
    latency_label: Mapped[str] = mapped_column(sa.String(200))
    outcome: Mapped[dict | None] = mapped_column(sa.JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())
