"""Stored observations, validation comparisons and calibrations (queries return dataclasses).

Configs travel as `ServingConfig.to_dict()` mappings and comparisons as
`Comparison.to_dict()` mappings, so this module stays free of the optimizer.
Per-request arrays are stored as JSON lists with a `schema_version`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from storage.models.validation import CalibrationRow, ObservationRow, ValidationRunRow

VALIDATION_SCHEMA_VERSION = 1
_ARRAYS = ("arrival_s", "input_tokens", "output_tokens", "ttft_s", "e2e_s")


class ValidationNotFound(LookupError):
    def __init__(self, what: str) -> None:
        super().__init__(f"{what} not found")


@dataclass(frozen=True, slots=True)
class ObservationRecord:
    id: int
    name: str
    source: str
    created_at: datetime
    config: dict
    num_requests: int
    num_failed: int
    summary: dict[str, float]
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray


@dataclass(frozen=True, slots=True)
class ValidationRunRecord:
    id: int
    kind: str
    created_at: datetime
    observation_id: int | None
    workload: str
    config: dict
    latency: str
    comparison: dict
    details: dict


@dataclass(frozen=True, slots=True)
class CalibrationRecord:
    id: int
    created_at: datetime
    shape_name: str
    accelerator: str
    tp: int
    latency_model_id: int | None
    overhead_s: float
    prefill_scale: float
    decode_scale: float
    loss_before: float
    loss_after: float
    details: dict


def _text(what: str, value: str, max_len: int) -> str:
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise ValueError(f"{what} must be 1-{max_len} characters, got {value!r}")
    return value


def save_observation(
    session: Session,
    *,
    name: str,
    source: str,
    config: Mapping,
    summary: Mapping[str, float],
    num_failed: int,
    arrays: Mapping[str, np.ndarray],
) -> ObservationRecord:
    """Store one observed run; `arrays` holds arrival_s, input/output_tokens, ttft_s, e2e_s."""
    missing = [k for k in _ARRAYS if k not in arrays]
    if missing:
        raise ValueError(f"observation arrays missing {missing}")
    n = len(arrays["arrival_s"])
    if n == 0 or any(len(arrays[k]) != n for k in _ARRAYS):
        raise ValueError("observation arrays must be non-empty and of equal length")
    requests = {"schema_version": VALIDATION_SCHEMA_VERSION}
    requests |= {k: np.asarray(arrays[k]).tolist() for k in _ARRAYS}
    row = ObservationRow(
        name=_text("observation name", name, 200),
        source=_text("observation source", source, 32),
        created_at=datetime.now(UTC),
        config=dict(config),
        num_requests=n,
        num_failed=int(num_failed),
        summary={k: float(v) for k, v in summary.items() if math.isfinite(float(v))},
        requests=requests,
    )
    session.add(row)
    session.flush()
    return _observation(row)


def _observation(row: ObservationRow) -> ObservationRecord:
    req = row.requests
    if req.get("schema_version") != VALIDATION_SCHEMA_VERSION:
        raise ValueError(f"observation {row.id}: unsupported schema {req.get('schema_version')!r}")
    ints = ("input_tokens", "output_tokens")
    arrays = {k: np.asarray(req[k], dtype=np.int64 if k in ints else np.float64) for k in _ARRAYS}
    return ObservationRecord(
        row.id, row.name, row.source, row.created_at, dict(row.config), row.num_requests,
        row.num_failed, dict(row.summary), **arrays,
    )  # fmt: skip


def get_observation(session: Session, observation_id: int) -> ObservationRecord:
    row = session.get(ObservationRow, observation_id)
    if row is None:
        raise ValidationNotFound(f"observation {observation_id}")
    return _observation(row)


def list_observations(session: Session) -> list[ObservationRecord]:
    rows = session.scalars(sa.select(ObservationRow).order_by(ObservationRow.id))
    return [_observation(r) for r in rows]


def save_validation_run(
    session: Session,
    *,
    kind: str,
    workload: str,
    config: Mapping,
    latency: str,
    comparison: Mapping,
    details: Mapping | None = None,
    observation_id: int | None = None,
) -> ValidationRunRecord:
    if observation_id is not None and session.get(ObservationRow, observation_id) is None:
        raise ValidationNotFound(f"observation {observation_id}")
    row = ValidationRunRow(
        kind=_text("validation kind", kind, 32),
        created_at=datetime.now(UTC),
        observation_id=observation_id,
        workload=_text("workload label", workload[:400], 400),
        config=dict(config),
        latency=_text("latency label", latency[:400], 400),
        comparison={"schema_version": VALIDATION_SCHEMA_VERSION, **comparison},
        details=dict(details or {}),
    )
    session.add(row)
    session.flush()
    return _run(row)


def _run(row: ValidationRunRow) -> ValidationRunRecord:
    return ValidationRunRecord(
        row.id, row.kind, row.created_at, row.observation_id, row.workload, dict(row.config),
        row.latency, dict(row.comparison), dict(row.details),
    )  # fmt: skip


def get_validation_run(session: Session, run_id: int) -> ValidationRunRecord:
    row = session.get(ValidationRunRow, run_id)
    if row is None:
        raise ValidationNotFound(f"validation run {run_id}")
    return _run(row)


def save_calibration(
    session: Session,
    *,
    shape_name: str,
    accelerator: str,
    tp: int,
    overhead_s: float,
    prefill_scale: float,
    decode_scale: float,
    loss_before: float,
    loss_after: float,
    latency_model_id: int | None = None,
    details: Mapping | None = None,
    observation_ids: Sequence[int] = (),
) -> CalibrationRecord:
    if tp < 1:
        raise ValueError(f"calibration tp must be >= 1, got {tp}")
    values = (overhead_s, prefill_scale, decode_scale)
    if not all(math.isfinite(v) for v in values) or overhead_s < 0 or min(values[1:]) <= 0:
        raise ValueError(f"calibration values out of range: {values}")
    for oid in observation_ids:
        if session.get(ObservationRow, oid) is None:
            raise ValidationNotFound(f"observation {oid}")
    row = CalibrationRow(
        created_at=datetime.now(UTC),
        shape_name=_text("shape name", shape_name, 200),
        accelerator=_text("accelerator", accelerator.lower(), 64),
        tp=tp,
        latency_model_id=latency_model_id,
        overhead_s=float(overhead_s),
        prefill_scale=float(prefill_scale),
        decode_scale=float(decode_scale),
        loss_before=float(loss_before),
        loss_after=float(loss_after),
        details={"observation_ids": [int(o) for o in observation_ids], **(details or {})},
    )
    session.add(row)
    session.flush()
    return _calibration(row)


def _calibration(row: CalibrationRow) -> CalibrationRecord:
    return CalibrationRecord(
        row.id, row.created_at, row.shape_name, row.accelerator, row.tp, row.latency_model_id,
        row.overhead_s, row.prefill_scale, row.decode_scale, row.loss_before, row.loss_after,
        dict(row.details),
    )  # fmt: skip


def latest_calibrations(
    session: Session, *, shape_name: str, latency_model_id: int | None = None
) -> list[CalibrationRecord]:
    """The newest calibration per (accelerator, tp) for a shape (and latency model)."""
    query = sa.select(CalibrationRow).where(CalibrationRow.shape_name == shape_name)
    if latency_model_id is not None:
        query = query.where(CalibrationRow.latency_model_id == latency_model_id)
    newest: dict[tuple[str, int], CalibrationRecord] = {}
    for row in session.scalars(query.order_by(CalibrationRow.id)):
        newest[(row.accelerator, row.tp)] = _calibration(row)
    return list(newest.values())
