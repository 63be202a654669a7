from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, UtcDateTime


class ProfileRunRow(Base):
    __tablename__ = "profile_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(32))  # "profiler" | "aiconfigurator" | "vidur"
    accelerator: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    num_samples: Mapped[int] = mapped_column(Integer)
    device: Mapped[dict] = mapped_column(JSON)  # DeviceInfo with schema_version
    # per op: [op, num_samples, min median_ms, max median_ms], with schema_version; written
    # at import (None only if written by an older build: then summarised on read)
    op_summary: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # whose kernels the tables time (`ProfileRunInfo.engine`; "" for no serving engine's)
    engine: Mapped[str] = mapped_column(String(16), default="", server_default="")


class KernelSampleRow(Base):
    """One timing (milliseconds); field meaning as in optimizer.records.KernelSample."""

    __tablename__ = "kernel_samples"

    run_id: Mapped[int] = mapped_column(
        ForeignKey("profile_runs.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    op: Mapped[str] = mapped_column(String(32))
    median_ms: Mapped[float] = mapped_column(Float)
    p10_ms: Mapped[float] = mapped_column(Float)
    p90_ms: Mapped[float] = mapped_column(Float)
    num_repeats: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(200))
    dtype: Mapped[str] = mapped_column(String(32))
    tp: Mapped[int] = mapped_column(Integer)
    num_tokens: Mapped[int] = mapped_column(BigInteger)
    n: Mapped[int] = mapped_column(BigInteger)
    k: Mapped[int] = mapped_column(BigInteger)
    batch_size: Mapped[int] = mapped_column(Integer)
    q_len: Mapped[int] = mapped_column(BigInteger)
    kv_len: Mapped[int] = mapped_column(BigInteger)
    num_heads: Mapped[int] = mapped_column(Integer)
    num_kv_heads: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    num_gpus: Mapped[int] = mapped_column(Integer)
    message_bytes: Mapped[int] = mapped_column(BigInteger)
