"""Fitted latency models: save, fetch, list and pick the latest version.

The fitted model travels as an opaque payload (bytes plus its
`schema_version`), serialised by `optimizer.latency.persist`; storage never
imports the optimizer. Hold-out metrics are stored as JSON with a
`schema_version`. Queries return frozen dataclasses, never ORM rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from optimizer.records import HoldoutMetric, HoldoutSplit
from storage.models.latency_models import LatencyModelRow

__all__ = [
    "HoldoutMetric",
    "LatencyModelInfo",
    "LatencyModelNotFound",
    "get_latency_model",
    "latest_latency_model",
    "list_latency_models",
    "load_latency_payload",
    "save_latency_model",
]

METRICS_SCHEMA_VERSION = 1


class LatencyModelNotFound(LookupError):
    def __init__(self, what: str) -> None:
        super().__init__(f"latency model {what} not found")


@dataclass(frozen=True, slots=True)
class LatencyModelInfo:
    id: int
    name: str
    version: int
    profile_run_id: int | None
    shape_name: str  # "" for a generic (shape-independent) model
    accelerator: str
    tp_degrees: tuple[int, ...]
    features: tuple[str, ...]
    metrics: tuple[HoldoutMetric, ...]
    created_at: datetime
    schema_version: int  # of the payload
    payload_bytes: int
    engine: str = ""  # whose kernels it was fitted on ("" for no serving engine's)


def _metrics_to_json(metrics: tuple[HoldoutMetric, ...]) -> dict:
    rows = [[m.op, m.split, m.num_rows, m.median_ape, m.p90_ape] for m in metrics]
    return {"schema_version": METRICS_SCHEMA_VERSION, "rows": rows}


def _metrics_from_json(data: dict) -> tuple[HoldoutMetric, ...]:
    if data.get("schema_version") != METRICS_SCHEMA_VERSION:
        raise ValueError(
            f"latency model metrics: unknown schema_version {data.get('schema_version')!r}"
        )
    return tuple(
        HoldoutMetric(str(op), HoldoutSplit(split), int(n), float(med), float(p90))
        for op, split, n, med, p90 in data["rows"]
    )


# A model's description: every column but the payload (megabytes), and the payload's size.
# Plain selects on the connection (the ORM's entity loading cost more than the reads).
_MODELS = LatencyModelRow.__table__
_DESCRIPTION = (
    *(c for c in _MODELS.c if c.name != "payload"),
    sa.func.length(_MODELS.c.payload).label("payload_bytes"),
)
_MODEL_BY_ID = sa.select(*_DESCRIPTION).where(_MODELS.c.id == sa.bindparam("id"))


def _info(row: LatencyModelRow | sa.Row, payload_bytes: int) -> LatencyModelInfo:
    return LatencyModelInfo(
        id=row.id,
        name=row.name,
        version=row.version,
        profile_run_id=row.profile_run_id,
        shape_name=row.shape_name,
        accelerator=row.accelerator,
        tp_degrees=tuple(int(t) for t in row.tp_degrees),
        features=tuple(str(f) for f in row.features),
        metrics=_metrics_from_json(row.metrics),
        created_at=row.created_at,
        schema_version=row.schema_version,
        payload_bytes=int(payload_bytes),
        engine=row.engine,
    )


def save_latency_model(
    session: Session,
    *,
    name: str,
    accelerator: str,
    payload: bytes,
    schema_version: int,
    profile_run_id: int | None = None,
    shape_name: str = "",
    tp_degrees: tuple[int, ...] = (1,),
    features: tuple[str, ...] = (),
    metrics: tuple[HoldoutMetric, ...] = (),
    engine: str = "",
) -> LatencyModelInfo:
    """Store a fitted model as the next version of `name` (1 for a new name); `engine` is
    whose kernels it was fitted on ("" for no serving engine's)."""
    if not name or len(name) > 200:
        raise ValueError(f"latency model name must be 1-200 characters, got {name!r}")
    if not payload:
        raise ValueError(f"latency model {name!r}: empty payload")
    if not tp_degrees or any(t < 1 for t in tp_degrees):
        raise ValueError(f"latency model {name!r}: tp_degrees must be >= 1, got {tp_degrees}")
    latest = session.scalar(
        sa.select(sa.func.max(LatencyModelRow.version)).where(LatencyModelRow.name == name)
    )
    row = LatencyModelRow(
        name=name,
        version=(latest or 0) + 1,
        profile_run_id=profile_run_id,
        shape_name=shape_name,
        accelerator=accelerator,
        tp_degrees=[int(t) for t in tp_degrees],
        features=[str(f) for f in features],
        metrics=_metrics_to_json(tuple(metrics)),
        created_at=datetime.now(UTC),
        schema_version=schema_version,
        payload=bytes(payload),
        engine=engine,
    )
    session.add(row)
    session.flush()
    return _info(row, len(payload))


def get_latency_model(session: Session, model_id: int) -> LatencyModelInfo:
    found = session.connection().execute(_MODEL_BY_ID, {"id": model_id}).first()
    if found is None:
        raise LatencyModelNotFound(f"id {model_id}")
    return _info(found, found.payload_bytes)


def load_latency_payload(session: Session, model_id: int) -> tuple[bytes, int]:
    """(payload, schema_version) of a stored model."""
    found = session.execute(
        sa.select(LatencyModelRow.payload, LatencyModelRow.schema_version).where(
            LatencyModelRow.id == model_id
        )
    ).first()
    if found is None:
        raise LatencyModelNotFound(f"id {model_id}")
    return bytes(found[0]), int(found[1])


def list_latency_models(
    session: Session, *, accelerator: str | None = None, name: str | None = None
) -> list[LatencyModelInfo]:
    query = _filtered(sa.select(*_DESCRIPTION), accelerator, name).order_by(_MODELS.c.id)
    return [_info(r, r.payload_bytes) for r in session.connection().execute(query)]


def latest_latency_model(
    session: Session, *, accelerator: str | None = None, name: str | None = None
) -> LatencyModelInfo:
    """The newest model (highest id) matching the filters; LatencyModelNotFound if none."""
    query = _filtered(sa.select(*_DESCRIPTION), accelerator, name)
    found = session.connection().execute(query.order_by(_MODELS.c.id.desc()).limit(1)).first()
    if found is None:
        raise LatencyModelNotFound(f"for accelerator={accelerator!r} name={name!r}")
    return _info(found, found.payload_bytes)


def _filtered(query: sa.Select, accelerator: str | None, name: str | None) -> sa.Select:
    if accelerator is not None:
        query = query.where(_MODELS.c.accelerator == accelerator)
    if name is not None:
        query = query.where(_MODELS.c.name == name)
    return query
