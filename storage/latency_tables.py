"""Compiled latency tables, cached in the database: every process and machine that shares
it compiles a table once.

Payloads are opaque bytes (`optimizer.latency.table_bytes.table_to_bytes`), keyed by a
string naming the fitted model, shape, accelerator, TP degree and grid tier. A
table of a stored model is deleted with the model. Writers race safely: the key
is unique, and a writer that loses keeps the winner's row.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from storage.db import session_scope
from storage.models import LatencyTableRow


def get_table(engine: Engine, key: str) -> bytes | None:
    """The stored payload of `key`, or None (one short read)."""
    with session_scope(engine) as s:
        return s.scalar(sa.select(LatencyTableRow.payload).where(LatencyTableRow.key == key))


def put_table(engine: Engine, key: str, payload: bytes, *, latency_model_id: int | None) -> bool:
    """Store `payload` under `key` in its own short transaction; False when another writer
    stored it first (its row is kept)."""
    row = LatencyTableRow(
        key=key,
        latency_model_id=latency_model_id,
        created_at=datetime.now(UTC),
        num_bytes=len(payload),
        payload=payload,
    )
    try:
        with session_scope(engine) as s:
            s.add(row)
    except IntegrityError:
        return False
    return True


def count_tables(engine: Engine) -> tuple[int, int]:
    """(tables, bytes) in the cache."""
    with session_scope(engine) as s:
        n, size = s.execute(
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(LatencyTableRow.num_bytes), 0))
        ).one()
    return int(n), int(size)
