"""ORM table of fitted latency models (one row per name and version)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, UtcDateTime


class LatencyModelRow(Base):
    __tablename__ = "latency_models"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_latency_models_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    profile_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("profile_runs.id", ondelete="SET NULL"), nullable=True
    )
    shape_name: Mapped[str] = mapped_column(String(200))  # "" when the model is generic
    accelerator: Mapped[str] = mapped_column(String(64))
    # whose kernels it was fitted on (its profile run's `engine`; "" for no serving engine's)
    engine: Mapped[str] = mapped_column(String(16), default="", server_default="")
    tp_degrees: Mapped[list] = mapped_column(JSON)
    features: Mapped[list] = mapped_column(JSON)
    metrics: Mapped[dict] = mapped_column(JSON)  # hold-out metrics with schema_version
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    schema_version: Mapped[int] = mapped_column(Integer)  # of the payload
    # Megabytes: loaded only when asked for (load_latency_payload), never by listings.
    payload: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)


class LatencyTableRow(Base):
    """A compiled step-latency table (opaque bytes), cached by key."""

    __tablename__ = "latency_tables"
    __table_args__ = (UniqueConstraint("key", name="uq_latency_tables_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(400))
    latency_model_id: Mapped[int | None] = mapped_column(
        ForeignKey("latency_models.id", ondelete="CASCADE"), nullable=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    num_bytes: Mapped[int] = mapped_column(Integer)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
