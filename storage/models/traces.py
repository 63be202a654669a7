from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, UtcDateTime

# A trace's stored plausibility warnings when there are none, as an SQL literal
NO_PLAUSIBILITY_WARNINGS_SQL = """'{"schema_version": 1, "warnings": []}'"""


class TraceRow(Base):
    __tablename__ = "traces"
    __table_args__ = (
        # Idempotent ingest is per project: the same file in two projects is two traces.
        UniqueConstraint("project", "content_hash", name="uq_traces_project_content_hash"),
        Index("ix_traces_project_stream_created", "project", "stream", "created_at"),
        Index("ix_traces_project_id", "project", "id"),
        Index("ix_traces_project_stream_id", "project", "stream", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(100), default="default")
    stream: Mapped[str | None] = mapped_column(String(200), nullable=True)  # a named series
    name: Mapped[str] = mapped_column(String(200))
    source_format: Mapped[str] = mapped_column(String(32))
    content_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    num_requests: Mapped[int] = mapped_column(Integer)
    stats: Mapped[dict] = mapped_column(JSON)  # TraceStats with schema_version
    # {"schema_version": 1, "warnings": [TraceWarning, ...]}: what ingest's plausibility
    # checks found; traces stored before them (migration 0130) and built ones have none
    plausibility_warnings: Mapped[dict] = mapped_column(
        JSON, server_default=text(NO_PLAUSIBILITY_WARNINGS_SQL)
    )
    # {"schema_version": 1, "origin": SyntheticOrigin}: how `traces synthesize` made this
    # trace; null for an upload or a workload the service built (migration 0150)
    synthetic: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class TraceRequestRow(Base):
    __tablename__ = "trace_requests"

    trace_id: Mapped[int] = mapped_column(
        ForeignKey("traces.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    arrival_s: Mapped[float] = mapped_column(Float)
    input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    prefix_hashes: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # int64 LE
    session_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    acceptance_length: Mapped[float | None] = mapped_column(Float, nullable=True)
