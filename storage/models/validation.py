"""Validation tables: imported observations, predicted-vs-measured comparisons, calibrations."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, UtcDateTime


class ObservationRow(Base):
    """A measured run (e.g. `vllm bench serve` JSON) with the config that served it."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(32))  # "vllm-bench" | "reference-engine"
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    config: Mapped[dict] = mapped_column(JSON)  # ServingConfig.to_dict()
    num_requests: Mapped[int] = mapped_column(Integer)
    num_failed: Mapped[int] = mapped_column(Integer)
    summary: Mapped[dict] = mapped_column(JSON)  # reported summary fields
    requests: Mapped[dict] = mapped_column(JSON)  # per-request arrays + schema_version


class ValidationRunRow(Base):
    """One comparison of a simulation with a measurement of the same workload and config."""

    __tablename__ = "validation_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # "replay" | "observation"
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    observation_id: Mapped[int | None] = mapped_column(
        ForeignKey("observations.id", ondelete="CASCADE"), nullable=True
    )
    workload: Mapped[str] = mapped_column(String(400))
    config: Mapped[dict] = mapped_column(JSON)
    latency: Mapped[str] = mapped_column(String(400))  # how steps were priced
    comparison: Mapped[dict] = mapped_column(JSON)  # Comparison.to_dict() + schema_version
    details: Mapped[dict] = mapped_column(JSON)  # machine load, transfers, notes


class CalibrationRow(Base):
    """A correction fitted from observations, applied to one latency model's predictions."""

    __tablename__ = "calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    shape_name: Mapped[str] = mapped_column(String(200))
    accelerator: Mapped[str] = mapped_column(String(64), index=True)
    tp: Mapped[int] = mapped_column(Integer)
    latency_model_id: Mapped[int | None] = mapped_column(
        ForeignKey("latency_models.id", ondelete="CASCADE"), nullable=True
    )
    overhead_s: Mapped[float] = mapped_column(Float)
    prefill_scale: Mapped[float] = mapped_column(Float)
    decode_scale: Mapped[float] = mapped_column(Float)
    loss_before: Mapped[float] = mapped_column(Float)
    loss_after: Mapped[float] = mapped_column(Float)
    details: Mapped[dict] = mapped_column(JSON)  # observation ids, hold-out errors
